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

Everything runs in one precision (`precision`, --precision): FP32 with TF32 off by default;
under tf32, fp16 or bf16 opplugin's Runner takes it (each step with a kernel in it runs in it), and
each peer runs in it as its own tools allow (lab/e2e_torch.py, lab/e2e_onnxruntime.py), or says why
it cannot. Every figure is a median after warm-up: host to host
by the host clock (it includes the copies); device-resident by CUDA events for PyTorch,
by the host clock around a call that returns once its work is done for onnxruntime, and
for opplugin from the runs' own timelines. Each row also gives `device_free_bytes`: the
device's free memory right after the candidate, before its caches are released for the
next. Every candidate's output is compared with a reference first (`Accuracy`): in FP32 with
onnxruntime's CPU provider on the original graph, within FP32_TOLERANCE; in a reduced precision with
the model evaluated in float64 (verify/float64.py), within reduced_precision_bound. One that differs
is marked "incorrect". A peer that cannot run here (no torch,
no CUDA build of onnxruntime, torch.compile failing) is "unavailable", with the reason in one line.

Per model and batch, a case record names the fastest peer (host to host), opplugin's ratio
to it, and the model's floor on this device (lab/model_floor.py at the rates lab/roofline.py
measures once per run; only in FP32, whose rate and 4-byte values it counts). lab/e2e_table.py prints them.
"""
from __future__ import annotations

import inspect
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.number_formats import FP32, UNIT_ROUNDOFF
from ..gpu import cuda
from ..ort import sessions
from ..inputs.feeds import make_inputs
from ..gpu.device import select_device
from ..errors import InputError, first_line
from ..report.jsonout import header, json_safe
from ..graph.model import Model, load_model
from ..plan.precision import UNIFORM_PRECISIONS, checked_precision
from ..verify import float64
from . import e2e_onnxruntime, e2e_torch, roofline
from .model_floor import model_work
from .peers import PeerUnavailable
from .trial import E2E_WARMUP_MS, warm_up

# 3: opplugin's rows named for their mode (opplugin_graphs, opplugin_eager); PyTorch in a CUDA graph,
# torch.compile in a CUDA graph and onnxruntime's CUDA-graph mode as peers; the measured roofline;
# a case record per model and batch (fastest peer, opplugin's ratio to it, the model's floor).
# 4: the run's `precision` and the `reference` its `tolerance` applies to ("onnxruntime CPU" in FP32,
# "float64" in a reduced precision)
SCHEMA = "opplugin-bench-e2e/4"
DEFAULT_BATCHES = (1, 32)
# relative L2 error against onnxruntime CPU that an FP32 result must stay within
FP32_TOLERANCE = 1e-4
FP32_REFERENCE, FLOAT64_REFERENCE = "onnxruntime CPU", "float64"  # what a run's outputs are compared with
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


# --- what a candidate's output is compared with -------------------------------------------------


def reduced_precision_bound(precision: str) -> float:
    """The relative L2 error against float64 within which a whole model run in `precision` (tf32, fp16 or
    bf16) counts as correct: 64 unit roundoffs of the format (1/32 for TF32 and FP16, 1/4 for BF16).

    Why that many: a run in a reduced precision rounds each layer's operands (weights and activations) to
    the format, each by up to one unit roundoff u relatively, and sums in FP32. Over a network's tens of
    layers those roundings add up, mostly at random (as the square root of their count), and normalisation
    keeps each layer's gain near one, so a correct run is expected a few u to some tens of u from the exact
    result (`check --precision` measures it node by node). 64 u leaves room for that, while a wrong kernel
    (a wrong index, a lost term) errs by the order of one, well above the bound of each format."""
    return 64 * UNIT_ROUNDOFF[precision]


@dataclass(frozen=True)
class Accuracy:
    """What every candidate's output in a run is compared with, and the error a correct one stays within."""

    output: np.ndarray  # the reference output
    reference: str  # what it is: FP32_REFERENCE or FLOAT64_REFERENCE
    bound: float  # the relative L2 error a correct output stays within
    precision: str = FP32

    def wrong(self, rel_l2: float) -> str | None:
        """Why an output with this error is incorrect, in one line; None when it is within the bound."""
        if rel_l2 <= self.bound:
            return None
        said = f"relative L2 error {rel_l2:.3g} against {self.reference}"
        return said if self.precision == FP32 else f"{said}, over the {self.precision} bound of {self.bound:.3g}"


def accuracy(model: Model, feeds: dict[str, np.ndarray], onnxruntime_output: np.ndarray, precision: str) -> Accuracy:
    """In FP32, onnxruntime CPU's output within FP32_TOLERANCE. In a reduced precision, the model in float64
    on the same feeds within reduced_precision_bound: against onnxruntime's FP32 a candidate would also be
    charged FP32's own rounding, and what a precision costs is measured against the exact result."""
    if precision == FP32:
        return Accuracy(onnxruntime_output, FP32_REFERENCE, FP32_TOLERANCE)
    return Accuracy(float64_output(model, feeds), FLOAT64_REFERENCE, reduced_precision_bound(precision), precision)


def float64_output(model: Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The model's first output evaluated in float64 on `feeds`; an InputError in one line where onnx's
    evaluator cannot run the model. It runs on the host, so it says how long it took."""
    started = time.perf_counter()
    try:
        exact = float64.evaluate_model(model.original, {name: np.array(value) for name, value in feeds.items()})
    except Exception as err:  # an op or a typing the evaluator lacks: nothing could be judged
        raise InputError(f"--precision: onnx's float64 reference cannot evaluate {model.name}: {first_line(err)}") from None
    batch = next(iter(feeds.values())).shape[0]
    print(f"{model.name} batch {batch}: float64 reference in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return exact[model.outputs[0]]


# --- opplugin ---------------------------------------------------------------------------------


def time_opplugin(model: Model, feeds: dict[str, np.ndarray], warmup: int, repeat: int, cuda_graphs: bool,
                  precision: str = FP32) -> dict[str, Any]:
    """opplugin host to host and device-resident, with `cuda_graphs` as given (never the default), in `precision`."""
    from ..runtime import Runner

    batch = next(iter(feeds.values())).shape[0]
    warmup = max(warmup, 2) if cuda_graphs else warmup  # the first pass runs eagerly, the second captures
    runner = Runner(model, batch, "cuda", cuda_graphs=cuda_graphs, precision=precision)
    warm_up(lambda: runner.run(feeds), warmup, E2E_WARMUP_MS)  # as every peer is warmed up
    profile = runner.profile(feeds, warmup, repeat)
    # Device-resident: a runner that takes the batch in one chunk on one stream, so that the copies of
    # the graph's inputs and outputs overlap nothing and the rest of each run is what they leave
    whole = Runner(model, batch, "cuda", chunk=batch, streams=1, cuda_graphs=cuda_graphs,
                   precision=precision).profile(feeds, warmup, repeat)
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
                          f"{len(plan.steps) - len(plan.plugin_steps)} onnxruntime steps on {plan.onnxruntime_provider}"
                          + _steps_in(plan, precision),
        "chunks": profile.result.chunks,
        "step_ms": steps,
        "ms_by_kind": by_kind,
    }


def _steps_in(plan, precision: str) -> str:
    """Under a reduced precision, how many plugin steps run in it (the others stay FP32); nothing in FP32."""
    if precision == FP32:
        return ""
    ran = sum(step.precision == precision for step in plan.plugin_steps)
    return f"; {ran} of {len(plan.plugin_steps)} plugin steps in {precision}"


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


def measured_row(row: dict[str, Any], timer: Callable[[], dict[str, Any]], against: Accuracy) -> dict[str, Any]:
    """`row` filled by one candidate's timer: its figures and agreement with the run's reference, or why it has none.
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
    row = {**row, **measured, "device_free_bytes": release_device_memory(), **agreement(output, against.output)}
    wrong = against.wrong(row["rel_l2"])
    if wrong:
        row.update(status="incorrect", reason=wrong)
    return row


def bench_case(path: Path, model: Model, batch: int, warmup: int, repeat: int, seed: int = 0,
               torch_model: e2e_torch.TorchModel | None = None, peers: tuple[str, ...] = PEERS,
               precision: str = FP32) -> list[dict[str, Any]]:
    """A row per candidate (CANDIDATES, in order) for one model at one batch, each in `precision`; a peer
    not in `peers` gets a "skipped" row, so every table keeps its columns."""
    feeds = make_inputs(model, batch, "random", seed, pinned=True).feeds
    references = sessions.Reference(model.original)({k: np.array(v) for k, v in feeds.items()})
    outputs = {name: tuple(references[name].shape) for name in model.outputs}
    against = accuracy(model, feeds, references[model.outputs[0]], precision)
    torch_model = torch_model or e2e_torch.TorchModel(path, model)
    x = next(iter(feeds.values()))
    timers = {
        "opplugin_graphs": lambda: time_opplugin(model, feeds, warmup, repeat, cuda_graphs=True, precision=precision),
        "opplugin_eager": lambda: time_opplugin(model, feeds, warmup, repeat, cuda_graphs=False, precision=precision),
        "pytorch_eager": lambda: e2e_torch.time_eager(torch_model.get(precision), x, warmup, repeat),
        "pytorch_graph": lambda: e2e_torch.time_graph(torch_model.get(precision), x, warmup, repeat, compiled=False),
        "torch_compile_graph": lambda: e2e_torch.time_graph(torch_model.get(precision), x, warmup, repeat, compiled=True),
        "onnxruntime_cuda": lambda: e2e_onnxruntime.time_cuda(model, feeds, outputs, warmup, repeat, precision),
        "onnxruntime_cuda_graph": lambda: e2e_onnxruntime.time_cuda_graph(model, feeds, outputs, warmup, repeat, precision),
    }
    rows = []
    varies = output_varies(references[model.outputs[0]])
    for candidate in CANDIDATES:
        if candidate in PEERS and candidate not in peers:
            rows.append({**empty_row(model.name, batch, candidate), "status": "skipped", "reason": "not asked for (--peers)"})
            continue
        row = measured_row(empty_row(model.name, batch, candidate) | {"output_varies": varies}, timers[candidate], against)
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
            checkpoint: Callable[[dict[str, Any]], None] | None = None, peers: tuple[str, ...] = PEERS,
            precision: str = FP32) -> dict[str, Any]:
    """Every model at every batch, each candidate in `precision`. The floor is FP32's (the measured FP32 rate,
    4-byte values), so a run in a reduced precision gives none rather than one that is no floor."""
    precision = checked_precision(precision, "--precision", UNIFORM_PRECISIONS)
    device = select_device("cuda")
    load_torch_cudnn_first()
    loaded = [(Path(name), load_model(name)) for name in models]
    for _, model in loaded:
        if model.fixed_batch is not None:
            raise InputError(f"{model.name} has a fixed batch of {model.fixed_batch}; --e2e needs a model with a free batch")
    roof = roofline.measure()
    release_device_memory()
    payload = header(SCHEMA, device, [m.name for _, m in loaded], list(batches))
    reduced = precision != FP32
    payload.update(warmup=warmup, warmup_ms=E2E_WARMUP_MS, repeat=repeat, precision=precision,
                   reference=FLOAT64_REFERENCE if reduced else FP32_REFERENCE,
                   tolerance=reduced_precision_bound(precision) if reduced else FP32_TOLERANCE,
                   opplugin_default=opplugin_default(), peers=list(peers), roofline=roof.record(), cases=[], rows=[])
    for path, model in loaded:
        torch_model = e2e_torch.TorchModel(path, model)
        for batch in batches:
            rows = bench_case(path, model, batch, warmup, repeat, torch_model=torch_model, peers=peers, precision=precision)
            floor = None if reduced else model_work(model, batch).record(roof.bytes_per_s, roof.flops_per_s)
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
