"""The PyTorch peers of `bench --e2e`, on the same weights as the ONNX file:

- eager: the module as it is (cuDNN FP32, `cudnn.benchmark` on, TF32 off);
- graph: the same module captured once in a `torch.cuda.CUDAGraph` and replayed;
- compile_graph: `torch.compile` (inductor, default mode, TF32 off) captured the same way.

Each in the run's precision (TorchPeer): FP32 as above; tf32 the FP32 module with TF32 allowed
for cuDNN and cuBLAS; fp16 and bf16 a copy of the module converted to that dtype and to
channels_last (which reorders 4-D weights only), the FP32 input cast to it (channels_last when
4-D) and the output cast back to FP32 on the device, inside the timed call, as opplugin takes
and gives FP32 too. One FP32 module is loaded per model; the converted one is derived from it.

A capture works on fixed tensors: the input is copied into a static input tensor, the
graph replays, and its static output is read. Warm-up calls (cuDNN's algorithm search,
inductor's compile) run on a side stream first, as PyTorch asks before a capture.

Each timer returns host-to-host ms (pinned host input to a host output, by the host
clock), device-resident ms (CUDA events around the device work alone), the output and
what ran. Nothing here runs without torch and a GPU: the rest of `bench --e2e` is
tested on the CPU, this module on the GPU.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..core.number_formats import FP32
from ..errors import first_line
from ..graph.model import Model
from .peers import PeerUnavailable, torch_or_reason
from .torch_precision import TORCH_DTYPES, converted_input, converted_module, fp32_settings, precision_settings
from .trial import E2E_WARMUP_MS, host_ms, warm_up


@dataclass(frozen=True)
class TorchPeer:
    """The module the PyTorch peers time, in one precision."""

    torch: Any
    module: Any  # in eval mode on the GPU; converted to TORCH_DTYPES[precision] where it names one
    source: str  # where its weights came from
    precision: str = FP32

    def forward(self, x_device: Any) -> Any:
        """The module on an FP32 device tensor, its output FP32: under fp16 and bf16 the input cast to the
        module's dtype (channels_last when 4-D) and the output cast back, both on the device."""
        if self.precision not in TORCH_DTYPES:
            return self.module(x_device)
        return self.module(converted_input(self.torch, x_device, self.precision)).float()

    @property
    def arithmetic(self) -> str:
        """How the module computes, in the words of the implementation strings."""
        if self.precision in TORCH_DTYPES:
            return f"{self.precision.upper()} channels_last"
        return "TF32" if self.precision == "tf32" else "FP32"


class TorchModel:
    """The PyTorch module of one ONNX file, on the GPU, loaded on first use and kept for
    every batch and peer, and its conversion for each reduced precision asked for; raises
    PeerUnavailable (the same reason each time) when it cannot be loaded."""

    def __init__(self, path: Path, model: Model):
        self.path, self.model = path, model
        self._loaded: tuple[Any, Any, str] | None = None
        self._reason: str | None = None
        self._converted: dict[str, Any] = {}  # precision -> the FP32 module converted to it

    def get(self, precision: str = FP32) -> TorchPeer:
        """The module in `precision`, with torch's switches set for it (precision_settings)."""
        torch, module, source = self._fp32()
        if precision in TORCH_DTYPES and precision not in self._converted:
            self._converted[precision] = converted_module(torch, module, precision)
        precision_settings(torch, precision)
        return TorchPeer(torch, self._converted.get(precision, module), source, precision)

    def _fp32(self) -> tuple[Any, Any, str]:
        """(torch, module in eval mode on the GPU, where its weights came from)."""
        if self._loaded is None and self._reason is None:
            try:
                self._loaded = self._load()
            except PeerUnavailable as why:
                self._reason = str(why)
        if self._reason is not None:
            raise PeerUnavailable(self._reason)
        return self._loaded

    def _load(self) -> tuple[Any, Any, str]:
        torch, reason = torch_or_reason()
        if torch is None:
            raise PeerUnavailable(reason)
        if len(self.model.inputs) != 1:
            raise PeerUnavailable(f"the PyTorch peers feed one input; {self.model.name} has {len(self.model.inputs)}")
        module, source = torch_module(torch, self.path, self.model)
        fp32_settings(torch)
        return torch, module.eval().cuda(), source


def torch_module(torch: Any, path: Path, model: Model) -> tuple[Any, str]:
    """The module with the file's weights: tools/export_models.py's MODEL.pt, else onnx2torch's conversion."""
    saved = path.with_suffix(".pt")
    if saved.is_file():
        state = torch.load(saved, map_location="cpu", weights_only=True)
        source = state.get("source", "torchvision")  # files written before timm models were exported have no source
        module = _architecture(source, saved.name)(state["arch"], **state.get("kwargs", {}))
        module.load_state_dict(state["state_dict"])
        return module, f"{source} {state['arch']} ({saved.name})"
    try:
        from onnx2torch import convert
    except ImportError:
        raise PeerUnavailable(f"no {saved.name} beside the model (tools/export_models.py writes one) and onnx2torch is not installed") from None
    return convert(model.original), "onnx2torch"


def _architecture(source: str, saved: str) -> Callable[..., Any]:
    """The constructor of an architecture by name, random weights, from the library `source` names."""
    try:
        if source == "timm":
            import timm

            return lambda arch, **kwargs: timm.create_model(arch, pretrained=False, **kwargs)
        import torchvision

        return lambda arch, **kwargs: getattr(torchvision.models, arch)(weights=None, **kwargs)
    except ImportError:
        raise PeerUnavailable(f"{saved} names a {source} model and {source} is not installed") from None


def _event_ms(torch: Any, fn: Callable[[], Any], warmup: int, repeat: int) -> float:
    warm_up(lambda: (fn(), torch.cuda.synchronize()), warmup, E2E_WARMUP_MS)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def time_eager(peer: TorchPeer, x: np.ndarray, warmup: int, repeat: int) -> dict[str, Any]:
    torch = peer.torch
    x_host = torch.from_numpy(np.ascontiguousarray(x)).pin_memory()
    x_device = x_host.cuda()
    with torch.no_grad():
        host = host_ms(lambda: peer.forward(x_host.cuda(non_blocking=True)).cpu(), warmup, repeat, E2E_WARMUP_MS)
        device = _event_ms(torch, lambda: peer.forward(x_device), warmup, repeat)
        output = peer.forward(x_host.cuda(non_blocking=True)).cpu().numpy()
    return {"host_to_host_ms": host, "device_ms": device, "output": output,
            "implementation": f"PyTorch {torch.__version__} eager, cuDNN {torch.backends.cudnn.version()} {peer.arithmetic}, {peer.source}"}


def capture(torch: Any, forward: Callable[[Any], Any], x_device: Any, warmup: int) -> tuple[Any, Any, Any]:
    """(graph, static input, static output): `forward` warmed up on a side stream, then captured once."""
    static_x = x_device.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 2)):
            forward(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = forward(static_x)
    return graph, static_x, static_y


def time_graph(peer: TorchPeer, x: np.ndarray, warmup: int, repeat: int, compiled: bool) -> dict[str, Any]:
    """The module (or torch.compile's version of it) replayed from one CUDA graph; the casts of a
    reduced precision are inside the graph (and inside what torch.compile compiles)."""
    torch = peer.torch
    x_host = torch.from_numpy(np.ascontiguousarray(x)).pin_memory()
    what = f"PyTorch {torch.__version__} in one CUDA graph, cuDNN {torch.backends.cudnn.version()} {peer.arithmetic}"
    forward = peer.forward
    if compiled:
        try:
            # the casts of fp16 and bf16 compiled with the module; FP32 and TF32 compile the module as it is
            target = peer.forward if peer.precision in TORCH_DTYPES else peer.module
            forward = torch.compile(target, backend="inductor", mode="default", dynamic=False)
        except Exception as err:
            raise PeerUnavailable(f"torch.compile failed: {type(err).__name__}: {first_line(err)}") from None
        arithmetic = "TF32 off" if peer.precision == FP32 else peer.arithmetic
        what = f"torch.compile {torch.__version__} (inductor, default mode, {arithmetic}) in one CUDA graph"
    with torch.no_grad():
        try:
            graph, static_x, static_y = capture(torch, forward, x_host.cuda(), warmup)
        except Exception as err:  # inductor's compile runs here, at the first call; a capture may be refused
            step = "torch.compile or its capture" if compiled else "the CUDA graph capture"
            raise PeerUnavailable(f"{step} failed: {type(err).__name__}: {first_line(err)}") from None

        def host_to_host():
            static_x.copy_(x_host, non_blocking=True)
            graph.replay()
            return static_y.cpu()

        host = host_ms(host_to_host, warmup, repeat, E2E_WARMUP_MS)
        device = _event_ms(torch, graph.replay, warmup, repeat)
        output = host_to_host().numpy()
    return {"host_to_host_ms": host, "device_ms": device, "output": output, "implementation": f"{what}, {peer.source}"}
