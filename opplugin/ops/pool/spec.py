"""ONNX 2-D pooling as one normalised shape record: MaxPool, AveragePool, GlobalAveragePool
and GlobalMaxPool on an (N, C, H, W) float32 tensor, and ReduceMean over H and W (what
PyTorch's exporter writes for a global average pool), which is a global average pool.

The record holds what the numpy reference and the CUDA kernel both need: the window
(kernel, strides, dilations), the pads at the start and end of each axis after auto_pad
is resolved, and the output size, computed as onnxruntime computes it (ceil_mode may add
a last window that starts inside the input or its start pads, never one that starts in
the end pads). A global pool is the window that covers the whole plane.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import PluginError
from ...registry import NodeInfo

MAX, AVERAGE = "max", "average"
# op type -> (what the window computes, whether the window is the whole plane)
OPS = {"MaxPool": (MAX, False), "AveragePool": (AVERAGE, False), "GlobalMaxPool": (MAX, True), "GlobalAveragePool": (AVERAGE, True),
       "ReduceMean": (AVERAGE, True)}


@dataclass(frozen=True)
class PoolSpec:
    mode: str  # MAX or AVERAGE
    is_global: bool
    channels: int
    size: tuple[int, int]  # input H, W
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right (ONNX's begin..., end... order)
    ceil_mode: bool = False
    count_include_pad: bool = False
    keep_dims: bool = True  # False: a ReduceMean with keepdims=0, whose output is (N, C)

    @property
    def output_size(self) -> tuple[int, int]:
        return tuple(_output_length(self, axis) for axis in (0, 1))

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.channels, *self.output_size) if self.keep_dims else (batch, self.channels)

    @property
    def window(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def suffix(self) -> str:
        """For kernel names: "global", or "3x3s2" with "p1"/"d2"/"ceil"/"incpad" where they apply."""
        if self.is_global:
            return "global" if self.keep_dims else "global_flat"
        text = f"{self.kernel[0]}x{self.kernel[1]}s{self.strides[0]}" + (f"x{self.strides[1]}" if self.strides[0] != self.strides[1] else "")
        if any(self.pads):
            text += "p" + ("_".join(map(str, self.pads)) if len(set(self.pads)) > 1 else str(self.pads[0]))
        if self.dilations != (1, 1):
            text += f"d{self.dilations[0]}" + (f"x{self.dilations[1]}" if self.dilations[0] != self.dilations[1] else "")
        text += "ceil" if self.ceil_mode else ""
        text += "incpad" if self.count_include_pad and self.mode == AVERAGE and any(self.pads) else ""
        return text

    def flops(self, batch: int) -> int:
        """One comparison or add per window element, plus a divide per output for an average."""
        outputs = batch * self.channels * self.output_size[0] * self.output_size[1]
        return outputs * (self.window + (1 if self.mode == AVERAGE else 0))

    def bytes_moved(self, batch: int) -> int:
        """The input read once and the output written once (FP32)."""
        return 4 * batch * self.channels * (self.size[0] * self.size[1] + self.output_size[0] * self.output_size[1])

    @classmethod
    def from_node(cls, node: NodeInfo) -> "PoolSpec":
        where = f"{node.op_type} {node.name}"
        mode, is_global = OPS[node.op_type]
        shape = node.inputs[0].shape
        if len(shape) != 4:
            raise PluginError(f"{where}: only 2-D pooling (an N x C x H x W input) is implemented, the input is {list(shape)}")
        channels, height, width = (int(d) for d in shape[1:])
        if is_global:
            keep_dims = _spatial_mean_keepdims(node, where) if node.op_type == "ReduceMean" else True
            return cls(mode, True, channels, (height, width), (height, width), keep_dims=keep_dims)
        attributes = node.attributes
        if "kernel_shape" not in attributes:
            raise PluginError(f"{where}: kernel_shape is missing")
        kernel = _pair(attributes["kernel_shape"], "kernel_shape", where)
        strides = _pair(attributes.get("strides", (1, 1)), "strides", where)
        dilations = _pair(attributes.get("dilations", (1, 1)), "dilations", where)
        if min(*kernel, *strides, *dilations) < 1:
            raise PluginError(f"{where}: kernel_shape, strides and dilations must be positive")
        ceil_mode = bool(attributes.get("ceil_mode", 0))
        auto_pad = attributes.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad in ("NOTSET", ""):
            pads = tuple(int(p) for p in attributes.get("pads", (0, 0, 0, 0)))
            if len(pads) != 4 or min(pads) < 0:
                raise PluginError(f"{where}: pads must be 4 non-negative numbers, not {list(pads)}")
        elif auto_pad == "VALID":
            pads = (0, 0, 0, 0)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pads = _same_pads((height, width), kernel, strides, auto_pad == "SAME_UPPER", where)
        else:
            raise PluginError(f"{where}: unknown auto_pad {auto_pad!r}")
        spec = cls(mode, False, channels, (height, width), kernel, strides, dilations, pads, ceil_mode,
                   bool(attributes.get("count_include_pad", 0)))
        if min(spec.output_size) < 1:
            raise PluginError(f"{where}: the window is larger than the padded input {[height, width]}")
        return spec


def _spatial_mean_keepdims(node: NodeInfo, where: str) -> bool:
    """A ReduceMean is a global average pool when its axes are H and W; its keepdims, else PluginError."""
    axes = node.attributes.get("axes")  # an attribute before opset 18, a constant input since
    if len(node.node.input) > 1 and node.node.input[1]:
        if node.node.input[1] not in node.constants:
            raise PluginError(f"{where}: the axes are computed at run time")
        axes = node.constants[node.node.input[1]].reshape(-1).tolist()
    if sorted(int(a) % 4 for a in axes or ()) != [2, 3]:
        raise PluginError(f"{where}: only a mean over H and W (axes 2 and 3) is implemented, not axes {list(axes or [])}")
    return bool(node.attributes.get("keepdims", 1))


def _pair(values, what: str, where: str) -> tuple[int, int]:
    values = tuple(int(v) for v in values)
    if len(values) != 2:
        raise PluginError(f"{where}: {what} must have 2 entries for a 2-D pool, not {list(values)}")
    return values


def _same_pads(size, kernel, strides, upper: bool, where: str) -> tuple[int, int, int, int]:
    """SAME_UPPER / SAME_LOWER: the pads for an output of ceil(size / stride), the odd one at the end (upper)
    or the start (lower). As in onnxruntime, the pads are sized for the undilated kernel (with dilations
    the output comes out smaller), and the output size then follows from them like explicit pads."""
    begin, end = [], []
    for length, k, s in zip(size, kernel, strides):
        total = (math.ceil(length / s) - 1) * s + k - length
        if total < 0:
            raise PluginError(f"{where}: SAME padding of a kernel smaller than its stride needs negative pads "
                              "(onnxruntime's own rule), which are not implemented")
        small, large = total // 2, total - total // 2
        begin.append(small if upper else large)
        end.append(large if upper else small)
    return (*begin, *end)


def _output_length(spec: PoolSpec, axis: int) -> int:
    if spec.is_global:
        return 1
    length, k, s, d = spec.size[axis], spec.kernel[axis], spec.strides[axis], spec.dilations[axis]
    begin, end = spec.pads[axis], spec.pads[axis + 2]
    span = length + begin + end - ((k - 1) * d + 1)
    if span < 0:
        return 0
    if not spec.ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    # onnxruntime (and ONNX since opset 19) drop a last window that would start in the end pads
    return out - 1 if (out - 1) * s >= length + begin else out
