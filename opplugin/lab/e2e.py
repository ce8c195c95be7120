"""`opplugin bench --e2e MODEL ...`: whole models end to end on this GPU, beside the peers
a user would otherwise run them with, in one process.

For each model and batch (default 1 and 32), on the same seeded random input:

- opplugin, host to host (`Runner.run` from pinned host arrays to host arrays) and
  device-resident (the same runs less the copies of the graph's inputs and outputs), once
  as it runs by default and once with `cuda_graphs` (runs of plugin steps replayed as CUDA graphs);
- onnxruntime's CUDA provider (FP32: TF32 off) on the same ONNX file, host to host
  (`session.run` on host arrays) and device-resident (IOBinding on device memory);
- PyTorch eager (cuDNN FP32, `cudnn.benchmark` on, TF32 off) on the same weights: the
  torchvision model that `tools/export_models.py` saved beside the file (MODEL.pt), else
  the model onnx2torch makes of the file, when it is installed.

Every figure is a median after warm-up: host to host by the host clock (it includes the
copies); device-resident by CUDA events for PyTorch, by the host clock around a call that
returns once its work is done for onnxruntime, and for opplugin from the runs' own
timelines. Each row also gives `device_free_bytes`: the device's free memory right after the
candidate, before its caches are released for the next. Every candidate's output is compared with onnxruntime's CPU provider on the
original graph first; one that differs is marked "incorrect" and counts as a failure.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import cuda, sessions
from ..data import make_inputs
from ..device import select_device
from ..errors import DeviceError, InputError, batch_sizes, first_line
from ..files import write_atomic
from ..jsonout import dumps, header, json_safe
from ..model import Model, load_model
from ..texttable import elide_middle
from .trial import BENCH_REPEAT, BENCH_WARMUP

# 2: an opplugin_graphs row per case (opplugin with CUDA graphs)
SCHEMA = "opplugin-bench-e2e/2"
DEFAULT_BATCHES = (1, 32)
# relative L2 error against onnxruntime CPU that an FP32 result must stay within
FP32_TOLERANCE = 1e-4
PEERS = ("opplugin", "opplugin_graphs", "onnxruntime_cuda", "pytorch")
NOTE_WIDTH = 200  # characters of a failed candidate's reason in the table's notes


class Unavailable(Exception):
    """A peer that cannot run here; the message says why."""


def host_ms(fn: Callable[[], Any], warmup: int, repeat: int) -> float:
    """Median host-clock milliseconds of fn() after `warmup` calls; fn must return once its work is done."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def agreement(ours: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """Relative L2 error and, for a classifier's (images, classes) output, top-1 agreement."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    norm = float(np.linalg.norm(reference))
    rel_l2 = float(np.linalg.norm(ours - reference)) / norm if norm else float(np.linalg.norm(ours))
    top1 = None
    if reference.ndim == 2 and reference.shape[1] > 1:
        top1 = float(np.mean(ours.argmax(axis=1) == reference.argmax(axis=1)))
    return {"rel_l2": rel_l2, "top1_agreement": top1}


# --- the candidates: each returns (host_to_host_ms, device_ms, output, implementation) -------------


def time_opplugin(model: Model, feeds: dict[str, np.ndarray], warmup: int, repeat: int, cuda_graphs: bool = False) -> dict[str, Any]:
    from ..runtime import Runner

    batch = next(iter(feeds.values())).shape[0]
    warmup = max(warmup, 2) if cuda_graphs else warmup  # the first pass runs eagerly, the second captures
    profile = Runner(model, batch, "cuda", cuda_graphs=cuda_graphs).profile(feeds, warmup, repeat)
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


def time_onnxruntime_cuda(model: Model, feeds: dict[str, np.ndarray], warmup: int, repeat: int) -> dict[str, Any]:
    import onnxruntime

    if not sessions.has_cuda():
        raise Unavailable(f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (the CPU build is installed)")
    import cupy

    device_id = cuda.device_id()
    session = sessions.session(model.original, [sessions.cuda_provider(device_id), sessions.CPU_PROVIDER])
    if sessions.CUDA_PROVIDER not in session.get_providers():
        raise Unavailable("onnxruntime fell back to the CPU provider (CUDA libraries not loadable?)")
    first = model.outputs[0]
    host = host_ms(lambda: session.run([first], feeds), warmup, repeat)
    on_device = {name: cupy.asarray(value) for name, value in feeds.items()}
    binding = session.io_binding()
    for name, array in on_device.items():
        binding.bind_input(name, "cuda", device_id, np.float32, list(array.shape), array.data.ptr)
    binding.bind_output(first, "cuda", device_id)
    device = host_ms(lambda: session.run_with_iobinding(binding), warmup, repeat)
    return {"host_to_host_ms": host, "device_ms": device, "output": binding.copy_outputs_to_cpu()[0],
            "implementation": f"onnxruntime {onnxruntime.__version__} CUDAExecutionProvider, use_tf32=0"}


def torch_module(path: Path, model: Model):
    """The PyTorch model with the file's weights: the export script's MODEL.pt, else onnx2torch's conversion."""
    import torch

    saved = path.with_suffix(".pt")
    if saved.is_file():
        import torchvision

        state = torch.load(saved, map_location="cpu", weights_only=True)
        module = getattr(torchvision.models, state["arch"])(weights=None)
        module.load_state_dict(state["state_dict"])
        return module, f"torchvision {state['arch']} ({saved.name})"
    try:
        from onnx2torch import convert
    except ImportError:
        raise Unavailable(f"no {saved.name} beside the model (tools/export_models.py writes one) and onnx2torch is not installed") from None
    return convert(model.original), "onnx2torch"


def time_pytorch(path: Path, model: Model, feeds: dict[str, np.ndarray], warmup: int, repeat: int) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed") from None
    if len(feeds) != 1:
        raise Unavailable(f"the PyTorch peer feeds one input; {model.name} has {len(feeds)}")
    module, source = torch_module(path, model)
    module = module.eval().cuda()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    x_host = torch.from_numpy(np.array(next(iter(feeds.values())))).pin_memory()
    x_device = x_host.cuda()

    def host_to_host():
        with torch.inference_mode():
            return module(x_host.cuda(non_blocking=True)).cpu()

    host = host_ms(host_to_host, warmup, repeat)
    with torch.inference_mode():
        for _ in range(warmup):
            module(x_device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(repeat):
            start.record()
            module(x_device)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    return {"host_to_host_ms": host, "device_ms": statistics.median(samples), "output": host_to_host().numpy(),
            "implementation": f"PyTorch {torch.__version__} eager, cuDNN {torch.backends.cudnn.version()} FP32, {source}"}


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


# --- one run over models and batches ------------------------------------------------------------


def bench_case(path: Path, model: Model, batch: int, warmup: int, repeat: int, seed: int = 0) -> list[dict[str, Any]]:
    """A row per peer for one model at one batch."""
    feeds = make_inputs(model, batch, "random", seed, pinned=True).feeds
    reference = sessions.Reference(model.original)({k: np.array(v) for k, v in feeds.items()})[model.outputs[0]]
    timers = {
        "opplugin": lambda: time_opplugin(model, feeds, warmup, repeat),
        "opplugin_graphs": lambda: time_opplugin(model, feeds, warmup, repeat, cuda_graphs=True),
        "onnxruntime_cuda": lambda: time_onnxruntime_cuda(model, feeds, warmup, repeat),
        "pytorch": lambda: time_pytorch(path, model, feeds, warmup, repeat),
    }
    rows = []
    for peer, timer in timers.items():
        row: dict[str, Any] = {"model": model.name, "batch": batch, "peer": peer, "status": "ok", "reason": None,
                               "host_to_host_ms": None, "device_ms": None, "rel_l2": None, "top1_agreement": None,
                               "implementation": None, "device_free_bytes": None}
        try:
            measured = timer()
        except Unavailable as why:
            release_device_memory()
            row.update(status="unavailable", reason=str(why))
            rows.append(row)
            continue
        except Exception as err:  # a peer that breaks is a row that says so; the others still run
            row.update(status="error", reason=f"{type(err).__name__}: {first_line(err)}", device_free_bytes=release_device_memory())
            rows.append(row)
            continue
        output = measured.pop("output")
        row.update(measured, device_free_bytes=release_device_memory())
        row.update(agreement(output, reference))
        if not row["rel_l2"] <= FP32_TOLERANCE:
            row.update(status="incorrect", reason=f"relative L2 error {row['rel_l2']:.3g} against onnxruntime CPU")
        rows.append(row)
        print(f"{model.name} batch {batch} {peer}: {row['host_to_host_ms']} ms host to host, {row['device_ms']} ms resident",
              file=sys.stderr, flush=True)
    return rows


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
            checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    device = select_device("cuda")
    load_torch_cudnn_first()
    loaded = [(Path(name), load_model(name)) for name in models]
    payload = header(SCHEMA, device, [m.name for _, m in loaded], list(batches))
    payload.update(warmup=warmup, repeat=repeat, tolerance=FP32_TOLERANCE, rows=[])
    for path, model in loaded:
        if model.fixed_batch is not None:
            raise InputError(f"{model.name} has a fixed batch of {model.fixed_batch}; --e2e needs a model with a free batch")
        for batch in batches:
            payload["rows"].extend(bench_case(path, model, batch, warmup, repeat))
            if checkpoint:
                checkpoint(json_safe(payload))
    return payload


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def format_markdown(payload: dict[str, Any]) -> str:
    """The rows as one Markdown table: a line per model and batch, ms host to host / device-resident,
    and opplugin's time over each peer's (host to host; below 1.00x opplugin is faster)."""
    def cell(row: dict[str, Any] | None) -> str:
        if row is None or row["status"] != "ok":
            return row["status"] if row else "-"
        resident = f"{row['device_ms']:.3f}" if row["device_ms"] is not None else "-"
        return f"{row['host_to_host_ms']:.3f} / {resident}"

    lines = [f"End to end on {payload['device']['name']}: ms host to host / device-resident, medians of {payload['repeat']} "
             f"after {payload['warmup']} warm-up runs; random weights and inputs, FP32 everywhere.", "",
             "| model | batch | opplugin | opplugin, CUDA graphs | onnxruntime CUDA | PyTorch eager | opplugin / PyTorch | "
             "with graphs / PyTorch | opplugin / onnxruntime | with graphs / onnxruntime |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cases = dict.fromkeys((row["model"], row["batch"]) for row in payload["rows"])
    for model, batch in cases:
        peers = {row["peer"]: row for row in payload["rows"] if (row["model"], row["batch"]) == (model, batch)}
        h2h = {peer: (row["host_to_host_ms"] if row["status"] == "ok" else None) for peer, row in peers.items()}
        ours, graphs, ort_cuda, torch = (h2h.get(p) for p in PEERS)
        lines.append(f"| {model} | {batch} | {' | '.join(cell(peers.get(p)) for p in PEERS)} | {ratio(ours, torch)} | "
                     f"{ratio(graphs, torch)} | {ratio(ours, ort_cuda)} | {ratio(graphs, ort_cuda)} |")
    notes = [f"- {row['model']} batch {row['batch']} {row['peer']}: {row['status']}: {elide_middle(row['reason'], NOTE_WIDTH)}"
             for row in payload["rows"] if row["status"] != "ok"]
    how = ("", "opplugin's host-to-host figure is its default runner (chunks on several streams); its device-resident one is a "
           "runner taking the batch in one chunk on one stream, less the copies of the graph's inputs and outputs.")
    return "\n".join(lines + list(how) + ([""] + notes if notes else [])) + "\n"


def main_from_args(args: Any) -> int:
    """`opplugin bench --e2e MODEL ...`: 0 when every candidate that ran was correct, 1 otherwise."""
    batches = batch_sizes(args.batches, DEFAULT_BATCHES)
    if not cuda.is_available():
        raise DeviceError("bench --e2e needs a CUDA device, and CuPy sees none")
    warmup = BENCH_WARMUP if args.warmup is None else args.warmup
    repeat = BENCH_REPEAT if args.repeat is None else args.repeat

    def write(payload: dict[str, Any]) -> None:
        write_atomic(args.json, dumps(payload))

    payload = json_safe(run_e2e(list(args.e2e), batches, warmup, repeat, checkpoint=write if args.json else None))
    print(format_markdown(payload), end="")
    if args.json:
        write(payload)
    wrong = [row for row in payload["rows"] if row["status"] in ("incorrect", "error")]
    return 1 if wrong else 0
