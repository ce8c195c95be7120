"""The onnxruntime peers of `bench --e2e`: its CUDA provider (FP32, TF32 off) on the
model's own file, without and with its CUDA-graph mode.

- cuda: host to host is `session.run` on host arrays; device-resident is IOBinding on
  device memory.
- cuda_graph: the provider's `enable_cuda_graph`, which captures a run once and replays it.
  A replay reads and writes the same addresses, so inputs and outputs are bound once, to
  fixed device buffers: host to host copies the input into its buffer, replays and copies
  the output back; device-resident is the replay alone.

`session.run` and `run_with_iobinding` return once their work is done, so the host clock
times both. Without a CUDA build of onnxruntime, each says so (PeerUnavailable).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..gpu import cuda
from ..ort import sessions
from ..graph.model import Model
from .peers import PeerUnavailable
from .trial import E2E_WARMUP_MS, host_ms


def unavailable_reason() -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, or None when it can."""
    if sessions.has_cuda():
        return None
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (the CPU build is installed)"


def cuda_session(model: Model, graph: bool):
    """A session of the model's original graph on the CUDA provider (TF32 off), the CPU provider
    behind it for what CUDA lacks; with `graph`, in the provider's CUDA-graph mode."""
    reason = unavailable_reason()
    if reason:
        raise PeerUnavailable(reason)
    name, options = sessions.cuda_provider(cuda.device_id())
    if graph:
        options = {**options, "enable_cuda_graph": "1"}
    try:
        session = sessions.session(model.original, [(name, options), sessions.CPU_PROVIDER])
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


def _implementation(graph: bool) -> str:
    import onnxruntime

    extra = ", enable_cuda_graph=1, IOBinding on fixed buffers" if graph else ""
    return f"onnxruntime {onnxruntime.__version__} CUDAExecutionProvider, use_tf32=0{extra}"


def time_cuda(model: Model, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]],
              warmup: int, repeat: int) -> dict[str, Any]:
    session = cuda_session(model, graph=False)
    first = model.outputs[0]
    host = host_ms(lambda: session.run([first], feeds), warmup, repeat, E2E_WARMUP_MS)
    binding, _, results = bound_on_device(session, feeds, outputs)
    device = host_ms(lambda: session.run_with_iobinding(binding), warmup, repeat, E2E_WARMUP_MS)
    return {"host_to_host_ms": host, "device_ms": device, "output": results[first].get(),
            "implementation": _implementation(graph=False)}


def time_cuda_graph(model: Model, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]],
                    warmup: int, repeat: int) -> dict[str, Any]:
    session = cuda_session(model, graph=True)
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
    return {"host_to_host_ms": host, "device_ms": device, "output": host_to_host(), "implementation": _implementation(graph=True)}
