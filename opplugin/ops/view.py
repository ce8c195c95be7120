"""Flatten, Reshape, Squeeze and Unsqueeze as views: no copy, no kernel, no onnxruntime step.

Between a Conv step and a Gemm step, a Flatten left to onnxruntime would take the
tensor to the host and back (onnxruntime's CPU provider) or cost a session call; as a
plugin step it is the same device memory seen with another shape (CuPy's reshape of a
contiguous array), so the plugin steps on either side run back to back on the device.
Reshape needs its target shape as a constant; 0 copies the input's dimension unless
`allowzero`, -1 takes what is left, as in ONNX.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..gpu import cuda
from ..gpu.device import Device
from ..errors import PluginError
from ..registry import Kernel, NodeInfo, Plugin
from .specs import reason_against, spec_of


class ViewKernel(Kernel):
    """The input, reshaped: zero FLOPs and zero bytes, whatever the batch."""

    # no device work to time: CUDA events around it would time the device's idle wait
    # for the host instead, so its step is timed by the host clock (see Kernel)
    device_work = False
    nonfinite_exact = True

    def __init__(self, name: str, target: Any):
        self.name = name
        self._target = target  # input shape -> output shape

    def flops(self, batch: int) -> int:
        return 0

    def bytes_moved(self, batch: int) -> int:
        return 0

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        x = inputs[0]
        # a view of a contiguous array; a strided one is copied, on the caller's stream
        with cuda.on_stream(None if isinstance(x, np.ndarray) else stream):
            return [x.reshape(self._target(tuple(x.shape)))]


def flatten_shape(axis: int, shape: tuple[int, ...]) -> tuple[int, int]:
    axis = axis + len(shape) if axis < 0 else axis
    return int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))


def reshape_shape(target: Sequence[int], allowzero: bool, shape: tuple[int, ...]) -> tuple[int, ...]:
    dims = [shape[i] if d == 0 and not allowzero else int(d) for i, d in enumerate(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
        dims[dims.index(-1)] = int(np.prod(shape, dtype=np.int64)) // max(1, known)
    return tuple(dims)


class ViewPlugin(Plugin):
    """A plugin whose kernel is a view: its name is known without building it, and it compiles nothing
    (Plugin.compile_jobs declares none)."""

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        return f"view.{self.op_type.lower()}"

    def target(self, node: NodeInfo) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
        """The output's shape for an input's shape (any batch)."""
        raise NotImplementedError

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        return ViewKernel(self.kernel_name(node, device), self.target(node))

    def view_of(self, node: NodeInfo, output: str) -> Callable[[Any], Any] | None:
        if self.supports(node, None) is not None or node.inputs[0].dtype != np.float32:
            return None
        target = self.target(node)
        return lambda x: x.reshape(target(tuple(x.shape)))


class FlattenPlugin(ViewPlugin):
    op_type = "Flatten"

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return None

    def target(self, node: NodeInfo) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
        axis = int(node.attributes.get("axis", 1))
        return lambda shape: flatten_shape(axis, shape)


class ReshapePlugin(ViewPlugin):
    op_type = "Reshape"

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        if len(node.inputs) < 2 or node.inputs[1].name not in node.constants:
            return "the target shape is computed at run time (a view needs it as a constant)"
        return None

    def target(self, node: NodeInfo) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
        dims = [int(d) for d in np.asarray(node.constants[node.inputs[1].name]).reshape(-1)]
        allowzero = bool(node.attributes.get("allowzero", 0))
        return lambda shape: reshape_shape(dims, allowzero, shape)


def _float32_data(node: NodeInfo) -> None:
    """Squeeze and Unsqueeze take float32 data: shape arithmetic (int64) stays with onnxruntime or is folded."""
    if node.inputs[0].dtype != np.float32:
        raise PluginError(f"{node.inputs[0].name} is {node.inputs[0].dtype}; the views take float32 tensors")


def _axes(node: NodeInfo, rank: int) -> list[int] | None:
    """Squeeze's or Unsqueeze's axes (an attribute up to opset 12, a constant input after), each in
    [0, rank); None where none are given."""
    if "axes" in node.attributes:
        axes = node.attributes["axes"]
    elif len(node.inputs) > 1 and node.inputs[1].name:
        if node.inputs[1].name not in node.constants:
            raise PluginError("its axes are computed at run time (a view needs them as a constant)")
        axes = np.asarray(node.constants[node.inputs[1].name]).reshape(-1)
    else:
        return None
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise PluginError(f"axes {list(axes)} do not fit rank {rank}")
    return sorted(axes)


class SqueezePlugin(ViewPlugin):
    """Squeeze as a view: the axes of extent 1 it names (all of them at the plan's shape, where it names none) dropped."""

    op_type = "Squeeze"

    def make_spec(self, node: NodeInfo) -> list[int]:
        _float32_data(node)
        shape = node.inputs[0].shape
        axes = _axes(node, len(shape))
        axes = [a for a, d in enumerate(shape) if d == 1] if axes is None else axes
        if any(shape[a] != 1 for a in axes):
            raise PluginError(f"it squeezes axes {axes} of shape {list(shape)}, not all of extent 1")
        return axes

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return reason_against(node, self.make_spec)

    def target(self, node: NodeInfo) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
        axes = set(spec_of(node, self.make_spec))
        return lambda shape: tuple(d for a, d in enumerate(shape) if a not in axes)


class UnsqueezePlugin(ViewPlugin):
    """Unsqueeze as a view: axes of extent 1 inserted where the output has them."""

    op_type = "Unsqueeze"

    def make_spec(self, node: NodeInfo) -> list[int]:
        _float32_data(node)
        rank = len(node.inputs[0].shape)
        axes = _axes(node, len(node.outputs[0].shape))
        if axes is None:
            raise PluginError("it names no axes")
        if len(node.outputs[0].shape) != rank + len(axes):
            raise PluginError(f"its output's rank is not known at plan time (input rank {rank}, {len(axes)} axes)")
        return axes

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return reason_against(node, self.make_spec)

    def target(self, node: NodeInfo) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
        axes = spec_of(node, self.make_spec)

        def unsqueezed(shape: tuple[int, ...]) -> tuple[int, ...]:
            dims = list(shape)
            for axis in axes:
                dims.insert(axis, 1)
            return tuple(dims)

        return unsqueezed
