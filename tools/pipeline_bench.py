"""Host-to-host timing of the chunked, multi-stream runner on a GPU.

    PYTHONPATH=$PWD python3 tools/pipeline_bench.py --out bench.json

Measures, for lenet86:
- raw host-to-device copy bandwidth, pageable and pinned (the ceiling for the input);
- 10,000 images host to host with the default plan (Conv on the GPU, the other
  ops in onnxruntime, on its CPU provider when that is all that is installed);
- the same with every op on the GPU: the Convs with their fused Relu and MaxPool,
  and CuPy plugins (below) for Flatten, Gemm(+Relu) and Softmax standing in for
  onnxruntime's CUDA provider, so the time is what the pipeline itself costs;
  pinned and pageable input, several chunk sizes and stream counts;
- 100,000 random images, every op on the GPU and with the default plan, against 10,000.
The CuPy plugins are a bench helper, not part of opplugin: they show what the
runner does when no step has to leave the GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from opplugin.gpu import cuda
from opplugin.verify.check import agreement
from opplugin.inputs.feeds import make_inputs
from opplugin.gpu.device import current_cuda_device
from opplugin.graph.model import load_model
from opplugin.ops.conv import ConvPlugin
from opplugin.registry import Kernel, Plugin
from opplugin.runtime import Runner


class _CupyKernel(Kernel):
    def __init__(self, name, fn):
        self.name, self._fn = name, fn

    def flops(self, batch):
        return 0

    def bytes_moved(self, batch):
        return 0

    def __call__(self, inputs, stream=None):
        import cupy

        with cuda.on_stream(stream):
            return [cupy.ascontiguousarray(self._fn(*inputs))]


class _CupyOp(Plugin):
    """A plugin running one ONNX op with CuPy array operations (any batch)."""

    def __init__(self, op_type, make):
        self.op_type, self._make = op_type, make

    def supports(self, node, device):
        return None if device.is_cuda else "CuPy ops need a GPU"

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        return _CupyKernel(f"cupy.{self.op_type.lower()}", self._make(node))


class _CupyGemm(_CupyOp):
    """Gemm, taking a following Relu into the same step (the plan leaves a Relu that
    has a plugin of its own to that plugin, which would stop the Convs fusing theirs)."""

    def __init__(self):
        super().__init__("Gemm", _gemm)

    def fuse(self, node, followers, device):
        return 1 if followers and followers[0].op_type == "Relu" else 0

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        import cupy

        gemm = _gemm(node)
        if not fused:
            return _CupyKernel("cupy.gemm", gemm)
        return _CupyKernel("cupy.gemm+relu", lambda *inputs: cupy.maximum(gemm(*inputs), 0))


def _gemm(node):
    a = node.attributes
    assert a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0 and not a.get("transA", 0)
    trans_b = a.get("transB", 0)

    def gemm(x, w, b=None):
        y = x @ (w.T if trans_b else w)
        return y + b if b is not None else y

    return gemm


def _softmax(node):
    axis = node.attributes.get("axis", -1)

    def softmax(x):
        import cupy

        e = cupy.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    return softmax


def all_gpu_registry():
    # no Relu, Tanh or MaxPool plugins: the Conv plugin fuses those after a Conv into its kernel
    return {
        "Conv": ConvPlugin(),
        "Flatten": _CupyOp("Flatten", lambda node: lambda x: x.reshape(x.shape[0], -1)),
        "Gemm": _CupyGemm(),
        "Softmax": _CupyOp("Softmax", _softmax),
    }


def copy_bandwidth(nbytes: int) -> dict:
    import cupy

    device = cupy.empty(nbytes, np.uint8)
    out = {}
    for label, host in (("pageable", np.ones(nbytes, np.uint8)), ("pinned", cuda.pinned_empty((nbytes,), np.uint8))):
        host[:] = 1
        times = []
        for _ in range(5):
            cuda.synchronize()
            start = time.perf_counter()
            device.data.copy_from_host(host.ctypes.data, nbytes)
            cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[f"h2d_{label}_GBps"] = nbytes / statistics.median(times) / 1e9
    return out


def overlap_probe(nbytes: int) -> dict:
    """Whether this machine overlaps a host-to-device copy with a kernel on another
    stream: the copy alone, a compute loop alone, then both at once."""
    import os

    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    out = {"asyncEngineCount": props.get("asyncEngineCount"), "concurrentKernels": props.get("concurrentKernels"),
           "CUDA_LAUNCH_BLOCKING": os.environ.get("CUDA_LAUNCH_BLOCKING")}
    host, device = cuda.pinned_empty((nbytes,), np.uint8), cupy.empty(nbytes, np.uint8)
    data = cupy.random.random(25_000_000, dtype=cupy.float32)
    copier, computer = cuda.new_stream(), cuda.new_stream()

    def copy():
        device.data.copy_from_host_async(host.ctypes.data, nbytes, copier)

    def compute():
        with computer:
            for _ in range(40):
                cupy.sin(data, out=data)

    def timed(*work):
        cuda.synchronize()
        start = time.perf_counter()
        for fn in work:
            fn()
        copier.synchronize()
        computer.synchronize()
        return (time.perf_counter() - start) * 1e3

    for fn in (copy, compute):
        timed(fn)
    out["copy_ms"] = statistics.median(timed(copy) for _ in range(3))
    out["compute_ms"] = statistics.median(timed(compute) for _ in range(3))
    out["both_ms"] = statistics.median(timed(copy, compute) for _ in range(3))
    return out


def spans_of(result) -> list:
    return [(s.name, s.chunk, round(s.start_ms, 3), round(s.end_ms, 3)) for s in result.spans]


def host_to_host(runner, feeds, repeat=7):
    for _ in range(2):
        runner.run(feeds)
    results = [runner.run(feeds) for _ in range(repeat)]
    best = sorted(results, key=lambda r: r.total_ms)[len(results) // 2]
    return {
        "median_ms": statistics.median(r.total_ms for r in results),
        "min_ms": min(r.total_ms for r in results),
        "chunks": best.chunks, "chunk": best.chunk_size, "streams": best.streams, "pinned": best.input_pinned,
        "copy_ms": best.copy_ms, "copy_hidden_ms": best.copy_hidden_ms, "copy_exposed_ms": best.copy_exposed_ms,
        "steps": {t.name: round(t.ms, 3) for t in best.times},
    }, results[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--large", type=int, default=100000)
    args = parser.parse_args()
    model = load_model("lenet86")
    report: dict = {"device": current_cuda_device().name}
    report["copy"] = copy_bandwidth(10000 * 86 * 86 * 4)
    print("copy", report["copy"], flush=True)
    report["overlap_probe"] = overlap_probe(10000 * 86 * 86 * 4)
    print("overlap probe", report["overlap_probe"], flush=True)

    pageable = make_inputs(model, 10000)
    pinned = make_inputs(model, 10000, pinned=True)
    default = Runner(model, 10000, "cuda")
    plan = default.plan_record(10000)

    def agrees(result) -> bool:
        return agreement(plan, pageable.feeds, result.outputs["probabilities"])["passed"]

    figures, last = host_to_host(default, pinned.feeds, repeat=3)
    figures["agreement"] = agrees(last)
    report["default_plan_10k_pinned"] = figures
    print("default plan, 10k pinned", json.dumps(figures), flush=True)

    registry = all_gpu_registry()
    gpu = Runner(model, 10000, "cuda", registry=registry)
    report["all_gpu_plan"] = [f"{s.name}: {' > '.join(s.ops)} ({s.implementation})" for s in gpu.plan_record().steps]
    auto_chunk = gpu.chunk
    runs = {}
    for chunk in (auto_chunk, 10000, 1134):
        for label, feeds in (("pinned", pinned.feeds), ("pageable", pageable.feeds)):
            gpu.chunk = chunk
            figures, last = host_to_host(gpu, feeds)
            figures["agreement"] = agrees(last)
            if chunk == auto_chunk:
                report[f"spans_{label}"] = spans_of(last)
            runs[f"chunk{chunk}_{label}"] = figures
            print(f"all-GPU 10k chunk {chunk} {label}", json.dumps(figures), flush=True)
    for streams in (1, 2):
        fewer = Runner(model, 10000, "cuda", registry=registry, streams=streams)
        figures, _ = host_to_host(fewer, pinned.feeds)
        runs[f"chunk{fewer.chunk}_pinned_{streams}stream"] = figures
        print(f"all-GPU 10k, {streams} stream(s)", json.dumps(figures), flush=True)
    report["all_gpu_10k"] = runs

    gpu.chunk = auto_chunk
    large = make_inputs(model, args.large, "random", seed=1, pinned=True)
    figures, last = host_to_host(gpu, large.feeds, repeat=5)
    small_key = f"chunk{auto_chunk}_pinned"
    figures["images_per_s"] = args.large / figures["median_ms"] * 1e3
    figures["images_per_s_10k"] = 10000 / runs[small_key]["median_ms"] * 1e3
    figures["ratio_to_10k"] = figures["images_per_s"] / figures["images_per_s_10k"]
    report[f"all_gpu_{args.large}"] = figures
    print(f"all-GPU {args.large}", json.dumps(figures), flush=True)

    figures, _ = host_to_host(default, large.feeds, repeat=3)
    figures["images_per_s"] = args.large / figures["median_ms"] * 1e3
    figures["images_per_s_10k"] = 10000 / report["default_plan_10k_pinned"]["median_ms"] * 1e3
    figures["ratio_to_10k"] = figures["images_per_s"] / figures["images_per_s_10k"]
    report[f"default_plan_{args.large}"] = figures
    print(f"default plan {args.large}", json.dumps(figures), flush=True)

    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
    print(f"\n10k host to host, all on GPU, pinned input: {runs[small_key]['median_ms']:.2f} ms "
          f"(pageable: {runs[f'chunk{auto_chunk}_pageable']['median_ms']:.2f} ms); "
          f"default plan (onnxruntime CPU steps): {report['default_plan_10k_pinned']['median_ms']:.2f} ms")
    for plan in ("all_gpu", "default_plan"):
        big = report[f"{plan}_{args.large}"]
        print(f"{plan}, {args.large} images: {big['images_per_s']:,.0f} images/s vs {big['images_per_s_10k']:,.0f} at 10k "
              f"(ratio {big['ratio_to_10k']:.3f})")


if __name__ == "__main__":
    main()
