"""The onnxruntime peers of `bench --e2e`: its CUDA provider (FP32, TF32 off) on the
model's own file, without and with its CUDA-graph mode.

- cuda: host to host is `session.run` on host arrays; device-resident is IOBinding on
  device memory.
- cuda_graph: the provider's `enable_cuda_graph`, which captures a run once and replays it.
  A replay reads and writes the same addresses, so inputs and outputs are bound once, to
  fixed device buffers: host to host copies the input into its buffer, replays and copies
  the output back; device-resident is the replay alone.

Each in the run's precision: FP32 as above; tf32 the same file with the provider's `use_tf32`
switch on; fp16 the file converted by onnxconverter-common (`float16.convert_float_to_float16`,
inputs and outputs kept FP32, so the same FP32 buffers bind), where that package is installed;
bf16 not at all, as neither onnxruntime nor that package converts a model to BF16.

`session.run` and `run_with_iobinding` return once their work is done, so the host clock
times both. Without a CUDA build of onnxruntime, or without a way to run the precision, each
says so (PeerUnavailable).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx

from ..core.number_formats import FP32
from ..gpu import cuda
from ..ort import sessions
from ..graph.model import Model
from ..errors import first_line
from .peers import PeerUnavailable
from .trial import E2E_WARMUP_MS, host_ms

FP16_CONVERTER_MISSING = "onnxconverter-common is not installed: pip install onnxconverter-common"
NO_BF16 = "onnxruntime has no BF16 conversion of a model (onnxconverter-common converts to FP16 only)"


def unavailable_reason() -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, or None when it can."""
    if sessions.has_cuda():
        return None
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (the CPU build is installed)"


def graph_in(model: Model, precision: str) -> onnx.ModelProto:
    """The graph onnxruntime runs in `precision`: the file's own in FP32 and TF32 (TF32 is the provider's
    switch), its FP16 conversion in fp16; PeerUnavailable for bf16."""
    if precision == "bf16":
        raise PeerUnavailable(NO_BF16)
    return fp16_graph(model) if precision == "fp16" else model.original


@functools.lru_cache(maxsize=1)  # converted once per model, for both peers and every batch
def fp16_graph(model: Model) -> onnx.ModelProto:
    """The model's original graph in FP16 by onnxconverter-common, its inputs and outputs kept FP32
    (its shape inference works on a copy; the model is left as it is)."""
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise PeerUnavailable(FP16_CONVERTER_MISSING) from None
    try:
        return float16.convert_float_to_float16(model.original, keep_io_types=True)
    except Exception as err:  # a graph the converter refuses: the peer cannot run, the others still do
        raise PeerUnavailable(f"onnxconverter-common could not convert {model.name} to FP16: {type(err).__name__}: "
                              f"{first_line(err)}") from None


def cuda_session(model: Model, graph: bool, precision: str = FP32):
    """A session of the model's original graph (in `precision`: graph_in) on the CUDA provider (TF32 off
    but under tf32), the CPU provider behind it for what CUDA lacks; with `graph`, in the provider's CUDA-graph mode."""
    reason = unavailable_reason()
    if reason:
        raise PeerUnavailable(reason)
    proto = graph_in(model, precision)
    name, options = sessions.cuda_provider(cuda.device_id())
    if precision == "tf32":
        options = {**options, "use_tf32": "1"}
    if graph:
        options = {**options, "enable_cuda_graph": "1"}
    try:
        session = sessions.session(proto, [(name, options), sessions.CPU_PROVIDER])
    except Exception as err:  # the graph mode refuses a model with nodes outside the CUDA provider
        raise PeerUnavailable(f"onnxruntime refused the session: {type(err).__name__}: {str(err).strip().splitlines()[-1]}") from None
    if sessions.CUDA_PROVIDER not in session.get_providers():
        raise PeerUnavailable("onnxruntime fell back to the CPU provider (CUDA libraries not loadable?)")
    return session


def bound_on_device(session, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]]):
    """(binding, device inputs, device outputs): every input and output bound to a device buffer of its own."""
    import cupy

    device_id = cuda.device_id()
    binding = session.io_binding()
    inputs = {name: cupy.asarray(value) for name, value in feeds.items()}
    results = {name: cupy.empty(shape, cupy.float32) for name, shape in outputs.items()}
    for name, array in inputs.items():
        binding.bind_input(name, "cuda", device_id, np.float32, list(array.shape), array.data.ptr)
    for name, array in results.items():
        binding.bind_output(name, "cuda", device_id, np.float32, list(array.shape), array.data.ptr)
    return binding, inputs, results


def _implementation(graph: bool, precision: str = FP32) -> str:
    import onnxruntime

    extra = ", enable_cuda_graph=1, IOBinding on fixed buffers" if graph else ""
    converted = ""
    if precision == "fp16":
        import onnxconverter_common

        converted = f", FP16 model by onnxconverter-common {onnxconverter_common.__version__} (inputs and outputs FP32)"
    return (f"onnxruntime {onnxruntime.__version__} CUDAExecutionProvider, use_tf32={int(precision == 'tf32')}"
            f"{converted}{extra}")


def time_cuda(model: Model, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]],
              warmup: int, repeat: int, precision: str = FP32) -> dict[str, Any]:
    session = cuda_session(model, graph=False, precision=precision)
    first = model.outputs[0]
    host = host_ms(lambda: session.run([first], feeds), warmup, repeat, E2E_WARMUP_MS)
    binding, _, results = bound_on_device(session, feeds, outputs)
    device = host_ms(lambda: session.run_with_iobinding(binding), warmup, repeat, E2E_WARMUP_MS)
    return {"host_to_host_ms": host, "device_ms": device, "output": results[first].get(),
            "implementation": _implementation(graph=False, precision=precision)}


def time_cuda_graph(model: Model, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]],
                    warmup: int, repeat: int, precision: str = FP32) -> dict[str, Any]:
    session = cuda_session(model, graph=True, precision=precision)
    first = model.outputs[0]
    binding, inputs, results = bound_on_device(session, feeds, outputs)

    def host_to_host():
        for name, array in inputs.items():
            array.set(feeds[name])  # a synchronous copy: done before onnxruntime's stream starts
        session.run_with_iobinding(binding)
        return results[first].get()

    warmup = max(warmup, 3)  # onnxruntime runs once plainly, then captures, then replays
    host = host_ms(host_to_host, warmup, repeat, E2E_WARMUP_MS)
    device = host_ms(lambda: session.run_with_iobinding(binding), warmup, repeat, E2E_WARMUP_MS)
    return {"host_to_host_ms": host, "device_ms": device, "output": host_to_host(),
            "implementation": _implementation(graph=True, precision=precision)}
