"""`opplugin bench --e2e MODEL ...`: whole models end to end on this GPU, beside the peers
a user would otherwise run them with, in one process, on the same weights and input.

For each model and batch (default 1 and 32), on the same seeded random input, the candidates
(CANDIDATES, each a row):

- opplugin with CUDA graphs and eager (`cuda_graphs=True` and `False`, whichever is
  the Runner's default), host to host (`Runner.run` from pinned host arrays to host
  arrays) and device-resident (the same runs less the copies of the graph's inputs and outputs);
- PyTorch on the torchvision model and weights that `tools/export_models.py` saved beside
  the file (MODEL.pt), else onnx2torch's conversion: eager, inside one CUDA graph, and
  torch.compile inside one CUDA graph (lab/e2e_torch.py);
- onnxruntime's CUDA provider on the same file, without and with its CUDA-graph mode
  (lab/e2e_onnxruntime.py).

Everything runs in FP32 with TF32 off. Every figure is a median after warm-up: host to host
by the host clock (it includes the copies); device-resident by CUDA events for PyTorch,
by the host clock around a call that returns once its work is done for onnxruntime, and
for opplugin from the runs' own timelines. Each row also gives `device_free_bytes`: the
device's free memory right after the candidate, before its caches are released for the
next. Every candidate's output is compared with onnxruntime's CPU provider on the original
graph first; one that differs is marked "incorrect". A peer that cannot run here (no torch,
no CUDA build of onnxruntime, torch.compile failing) is "unavailable", with the reason in one line.

Per model and batch, a case record names the fastest peer (host to host), opplugin's ratio
to it, and the model's floor on this device (lab/model_floor.py at the rates lab/roofline.py
measures once per run). lab/e2e_table.py prints them.
"""
from __future__ import annotations

import inspect
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..gpu import cuda
from ..ort import sessions
from ..inputs.feeds import make_inputs
from ..gpu.device import select_device
from ..errors import InputError, first_line
from ..report.jsonout import header, json_safe
from ..graph.model import Model, load_model
from . import e2e_onnxruntime, e2e_torch, roofline
from .model_floor import model_work
from .peers import PeerUnavailable
from .trial import E2E_WARMUP_MS, warm_up

# 3: opplugin's rows named for their mode (opplugin_graphs, opplugin_eager); PyTorch in a CUDA graph,
# torch.compile in a CUDA graph and onnxruntime's CUDA-graph mode as peers; the measured roofline;
# a case record per model and batch (fastest peer, opplugin's ratio to it, the model's floor)
SCHEMA = "opplugin-bench-e2e/3"
DEFAULT_BATCHES = (1, 32)
# relative L2 error against onnxruntime CPU that an FP32 result must stay within
FP32_TOLERANCE = 1e-4
OPPLUGIN = ("opplugin_graphs", "opplugin_eager")
PEERS = ("pytorch_eager", "pytorch_graph", "torch_compile_graph", "onnxruntime_cuda", "onnxruntime_cuda_graph")
CANDIDATES = OPPLUGIN + PEERS


def opplugin_default() -> str:
    """The candidate that is opplugin's default: the Runner's own default for `cuda_graphs`
    (graphs unless it is False: a default of None or "auto" means graphs where they can run)."""
    from ..runtime import Runner

    parameter = inspect.signature(Runner).parameters.get("cuda_graphs")
    return "opplugin_eager" if parameter is None or parameter.default is False else "opplugin_graphs"


def output_varies(reference: np.ndarray) -> bool | None:
    """Whether the reference output differs between the batch's images (None for one image, which cannot
    tell). An output the same for every input (a classifier head of zeros, as torchvision initialises
    ViT's) leaves the error columns checking little of the model."""
    values = np.asarray(reference)
    return None if values.ndim == 0 or values.shape[0] < 2 else bool(np.any(values != values[:1]))


def agreement(ours: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """Relative L2 error and, for a classifier's (images, classes) output, top-1 agreement."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    norm = float(np.linalg.norm(reference))
    rel_l2 = float(np.linalg.norm(ours - reference)) / norm if norm else float(np.linalg.norm(ours))
    top1 = None
    if reference.ndim == 2 and reference.shape[1] > 1:
        top1 = float(np.mean(ours.argmax(axis=1) == reference.argmax(axis=1)))
    return {"rel_l2": rel_l2, "top1_agreement": top1}


# --- opplugin ---------------------------------------------------------------------------------


def time_opplugin(model: Model, feeds: dict[str, np.ndarray], warmup: int, repeat: int, cuda_graphs: bool) -> dict[str, Any]:
    """opplugin host to host and device-resident, with `cuda_graphs` as given (never the default)."""
    from ..runtime import Runner

    batch = next(iter(feeds.values())).shape[0]
    warmup = max(warmup, 2) if cuda_graphs else warmup  # the first pass runs eagerly, the second captures
    runner = Runner(model, batch, "cuda", cuda_graphs=cuda_graphs)
    warm_up(lambda: runner.run(feeds), warmup, E2E_WARMUP_MS)  # as every peer is warmed up
    profile = runner.profile(feeds, warmup, repeat)
    # Device-resident: a runner that takes the batch in one chunk on one stream, so that the copies of
    # the graph's inputs and outputs overlap nothing and the rest of each run is what they leave
    whole = Runner(model, batch, "cuda", chunk=batch, streams=1, cuda_graphs=cuda_graphs).profile(feeds, warmup, repeat)
    graph_tensors = {value.name for value in model.inputs} | set(model.outputs)
    io_copies = [name for name, kind in whole.kinds.items() if kind == "copy" and name.split(" ", 2)[-1] in graph_tensors]
    resident = [total - sum(whole.step_ms[name][run] for name in io_copies) for run, total in enumerate(whole.total_ms)]
    steps = {name: statistics.median(readings) for name, readings in profile.step_ms.items()}
    by_kind: dict[str, float] = {}
    for name, ms in steps.items():
        by_kind[profile.kinds[name]] = by_kind.get(profile.kinds[name], 0.0) + ms
    plan = profile.plan
    kernels = sorted({step.implementation for step in plan.plugin_steps})
    return {
        "host_to_host_ms": statistics.median(profile.total_ms),
        "device_ms": statistics.median(resident) if whole.result.chunks == 1 else None,
        "output": profile.result.outputs[model.outputs[0]],
        "implementation": f"{len(plan.plugin_steps)} plugin steps ({', '.join(kernels)}), "
                          f"{len(plan.steps) - len(plan.plugin_steps)} onnxruntime steps on {plan.onnxruntime_provider}",
        "chunks": profile.result.chunks,
        "step_ms": steps,
        "ms_by_kind": by_kind,
    }


def release_device_memory() -> int:
    """Free what the last candidate left cached (CuPy's pool, PyTorch's allocator, onnxruntime's sessions
    once collected), so the next one finds the device empty; returns the free bytes before that."""
    import gc

    import cupy

    free_before = int(cupy.cuda.runtime.memGetInfo()[0])
    gc.collect()
    cuda.release_cached_memory()
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()
    return free_before


# --- one case: every candidate on one model at one batch ----------------------------------------


def empty_row(model: str, batch: int, candidate: str) -> dict[str, Any]:
    return {"model": model, "batch": batch, "peer": candidate, "status": "ok", "reason": None,
            "host_to_host_ms": None, "device_ms": None, "rel_l2": None, "top1_agreement": None,
            "implementation": None, "device_free_bytes": None}


def measured_row(row: dict[str, Any], timer: Callable[[], dict[str, Any]], reference: np.ndarray) -> dict[str, Any]:
    """`row` filled by one candidate's timer: its figures and agreement with the reference, or why it has none.
    A peer that cannot run is "unavailable"; one that breaks is "error", in one line either way."""
    try:
        measured = timer()
    except PeerUnavailable as why:
        release_device_memory()
        return {**row, "status": "unavailable", "reason": str(why)}
    except Exception as err:  # a candidate that breaks is a row that says so; the others still run
        return {**row, "status": "error", "reason": f"{type(err).__name__}: {first_line(err)}",
                "device_free_bytes": release_device_memory()}
    output = measured.pop("output")
    row = {**row, **measured, "device_free_bytes": release_device_memory(), **agreement(output, reference)}
    if not row["rel_l2"] <= FP32_TOLERANCE:
        row.update(status="incorrect", reason=f"relative L2 error {row['rel_l2']:.3g} against onnxruntime CPU")
    return row


def bench_case(path: Path, model: Model, batch: int, warmup: int, repeat: int, seed: int = 0,
               torch_model: e2e_torch.TorchModel | None = None, peers: tuple[str, ...] = PEERS) -> list[dict[str, Any]]:
    """A row per candidate (CANDIDATES, in order) for one model at one batch; a peer not in
    `peers` gets a "skipped" row, so every table keeps its columns."""
    feeds = make_inputs(model, batch, "random", seed, pinned=True).feeds
    references = sessions.Reference(model.original)({k: np.array(v) for k, v in feeds.items()})
    outputs = {name: tuple(references[name].shape) for name in model.outputs}
    torch_model = torch_model or e2e_torch.TorchModel(path, model)
    x = next(iter(feeds.values()))
    timers = {
        "opplugin_graphs": lambda: time_opplugin(model, feeds, warmup, repeat, cuda_graphs=True),
        "opplugin_eager": lambda: time_opplugin(model, feeds, warmup, repeat, cuda_graphs=False),
        "pytorch_eager": lambda: e2e_torch.time_eager(torch_model.get(), x, warmup, repeat),
        "pytorch_graph": lambda: e2e_torch.time_graph(torch_model.get(), x, warmup, repeat, compiled=False),
        "torch_compile_graph": lambda: e2e_torch.time_graph(torch_model.get(), x, warmup, repeat, compiled=True),
        "onnxruntime_cuda": lambda: e2e_onnxruntime.time_cuda(model, feeds, outputs, warmup, repeat),
        "onnxruntime_cuda_graph": lambda: e2e_onnxruntime.time_cuda_graph(model, feeds, outputs, warmup, repeat),
    }
    rows = []
    varies = output_varies(references[model.outputs[0]])
    for candidate in CANDIDATES:
        if candidate in PEERS and candidate not in peers:
            rows.append({**empty_row(model.name, batch, candidate), "status": "skipped", "reason": "not asked for (--peers)"})
            continue
        row = measured_row(empty_row(model.name, batch, candidate) | {"output_varies": varies}, timers[candidate],
                           references[model.outputs[0]])
        rows.append(row)
        print(f"{model.name} batch {batch} {candidate}: {row['status']}, {row['host_to_host_ms']} ms host to host, "
              f"{row['device_ms']} ms resident", file=sys.stderr, flush=True)
    return rows


def fastest_peer(rows: list[dict[str, Any]]) -> tuple[str | None, float | None]:
    """The peer (not opplugin) with the least host-to-host time among those that ran correctly."""
    times = {row["peer"]: row["host_to_host_ms"] for row in rows
             if row["peer"] in PEERS and row["status"] == "ok" and row["host_to_host_ms"]}
    if not times:
        return None, None
    best = min(times, key=times.__getitem__)
    return best, times[best]


def case_record(model: str, batch: int, rows: list[dict[str, Any]], floor: dict[str, Any] | None) -> dict[str, Any]:
    """One model at one batch: the fastest peer, each opplugin mode's time over it and over the
    floor (host to host; below 1.0 opplugin is faster), and the floor's figures (model_floor.ModelWork.record)."""
    peer, peer_ms = fastest_peer(rows)
    floor_ms = floor["floor_ms"] if floor else None
    record: dict[str, Any] = {"model": model, "batch": batch, "fastest_peer": peer, "fastest_peer_ms": peer_ms}
    varies = [row["output_varies"] for row in rows if "output_varies" in row]  # rows of runs before it was kept lack it
    if varies:
        record["output_varies"] = varies[0]
    for row in rows:
        if row["peer"] in OPPLUGIN:
            ours = row["host_to_host_ms"] if row["status"] == "ok" else None
            record[f"{row['peer']}_ms"] = ours
            record[f"{row['peer']}_over_fastest_peer"] = ours / peer_ms if ours and peer_ms else None
            record[f"{row['peer']}_over_floor"] = ours / floor_ms if ours and floor_ms else None
    return record | (floor or {"flops": None, "weight_bytes": None, "input_bytes": None, "activation_bytes": None,
                               "floor_ms": None, "floor_bound": None})


# --- one run over models and batches ------------------------------------------------------------


def load_torch_cudnn_first() -> None:
    """Let PyTorch load its own cuDNN before onnxruntime's CUDA provider loads one: the process
    keeps the first library of that name, and PyTorch refuses one older than it was built with."""
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3, device="cuda"), torch.ones(1, 1, 3, 3, device="cuda"))
        torch.cuda.synchronize()


def run_e2e(models: list[str], batches: list[int], warmup: int, repeat: int,
            checkpoint: Callable[[dict[str, Any]], None] | None = None, peers: tuple[str, ...] = PEERS) -> dict[str, Any]:
    device = select_device("cuda")
    load_torch_cudnn_first()
    loaded = [(Path(name), load_model(name)) for name in models]
    for _, model in loaded:
        if model.fixed_batch is not None:
            raise InputError(f"{model.name} has a fixed batch of {model.fixed_batch}; --e2e needs a model with a free batch")
    roof = roofline.measure()
    release_device_memory()
    payload = header(SCHEMA, device, [m.name for _, m in loaded], list(batches))
    payload.update(warmup=warmup, warmup_ms=E2E_WARMUP_MS, repeat=repeat, tolerance=FP32_TOLERANCE, opplugin_default=opplugin_default(), peers=list(peers),
                   roofline=roof.record(), cases=[], rows=[])
    for path, model in loaded:
        torch_model = e2e_torch.TorchModel(path, model)
        for batch in batches:
            rows = bench_case(path, model, batch, warmup, repeat, torch_model=torch_model, peers=peers)
            floor = model_work(model, batch).record(roof.bytes_per_s, roof.flops_per_s)
            payload["rows"].extend(rows)
            payload["cases"].append(case_record(model.name, batch, rows, floor))
            if checkpoint:
                checkpoint(json_safe(payload))
    return payload


def failed(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows that make the run fail: any candidate incorrect, or opplugin broken
    (a peer that breaks is its own problem; its row says so)."""
    return [row for row in payload["rows"]
            if row["status"] == "incorrect" or (row["status"] == "error" and row["peer"] in OPPLUGIN)]
