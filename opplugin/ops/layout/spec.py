"""The layout ops as plain records: attributes and constant inputs resolved once
(`LayoutPlugin.make_spec`), each able to say its output shape for an input shape, so that one
record serves every chunk of a batch. A node none of these can read raises a
PluginError whose text is the reason `opplugin plan` shows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import PluginError
from ...registry import NodeInfo


def _constant(node: NodeInfo, position: int, what: str) -> np.ndarray | None:
    """The node's input `position` as a constant array; None where the input is left out."""
    if len(node.inputs) <= position or not node.inputs[position].name:
        return None
    value = node.constants.get(node.inputs[position].name)
    if value is None:
        raise PluginError(f"its {what} (input {position}) is computed at run time; the layout kernels need it as a constant")
    return np.asarray(value)


def _float32(node: NodeInfo, data_inputs: int = 1) -> None:
    """The tensors moved (the first `data_inputs` inputs and the outputs) are float32; else the reason."""
    for tensor in [*node.inputs[:data_inputs], *node.outputs]:
        if tensor.dtype != np.float32:
            raise PluginError(f"{tensor.name} is {tensor.dtype}; the layout kernels move float32 tensors")


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise PluginError(f"{what} {axis} is outside rank {rank}")
    return axis % rank


@dataclass(frozen=True)
class ConcatSpec:
    axis: int
    widths: tuple[int, ...]  # each input's extent along the axis

    @classmethod
    def from_node(cls, node: NodeInfo) -> "ConcatSpec":
        _float32(node, len(node.inputs))
        inputs = [t for t in node.inputs if t.name]
        rank = len(inputs[0].shape)
        axis = _axis(int(node.attributes["axis"]), rank)
        for tensor in inputs:
            if len(tensor.shape) != rank or any(a != b for d, (a, b) in enumerate(zip(tensor.shape, inputs[0].shape)) if d != axis):
                raise PluginError(f"input {tensor.name} of shape {list(tensor.shape)} does not concatenate with {list(inputs[0].shape)}")
        return cls(axis, tuple(int(t.shape[axis]) for t in inputs))

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(int(s) for s in np.cumsum((0,) + self.widths[:-1]))

    def output_shape(self, first: tuple[int, ...]) -> tuple[int, ...]:
        return (*first[: self.axis], sum(self.widths), *first[self.axis + 1:])


@dataclass(frozen=True)
class TransposeSpec:
    perm: tuple[int, ...]

    @classmethod
    def from_node(cls, node: NodeInfo) -> "TransposeSpec":
        _float32(node)
        rank = len(node.inputs[0].shape)
        perm = tuple(int(p) for p in node.attributes.get("perm", range(rank - 1, -1, -1)))
        if sorted(perm) != list(range(rank)):
            raise PluginError(f"perm {list(perm)} is not a permutation of the {rank} axes")
        return cls(perm)

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[p] for p in self.perm)


@dataclass(frozen=True)
class SliceSpec:
    """Per axis (start, stop, step) in Python's slice terms, clamped for the node's input shape;
    axis 0's is worked out again for each chunk's rows."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]

    @classmethod
    def from_node(cls, node: NodeInfo) -> "SliceSpec":
        _float32(node)
        rank = len(node.inputs[0].shape)
        if "starts" in node.attributes:  # opset 1-9: attributes
            starts, ends = node.attributes["starts"], node.attributes["ends"]
            axes = node.attributes.get("axes", range(len(starts)))
            steps = [1] * len(starts)
        else:
            starts, ends = _constant(node, 1, "starts"), _constant(node, 2, "ends")
            axes = _constant(node, 3, "axes")
            steps = _constant(node, 4, "steps")
            axes = range(len(starts)) if axes is None else axes
            steps = [1] * len(starts) if steps is None else steps
        axes = tuple(_axis(int(a), rank) for a in axes)
        if len(set(axes)) != len(axes):
            raise PluginError(f"axes {list(axes)} repeat an axis")
        if any(int(s) == 0 for s in steps):
            raise PluginError("a step is 0")
        return cls(tuple(int(s) for s in starts), tuple(int(e) for e in ends), axes, tuple(int(s) for s in steps))

    def slices(self, shape: Sequence[int]) -> tuple[slice, ...]:
        """The numpy index taking this slice of a tensor of `shape` (ONNX's clamping)."""
        index = [slice(None)] * len(shape)
        for start, end, axis, step in zip(self.starts, self.ends, self.axes, self.steps):
            start, stop, step = slice(*_clamped(start, end, step, shape[axis])).indices(shape[axis])
            index[axis] = slice(start, stop if stop >= 0 else None, step)
        return tuple(index)

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(len(range(*s.indices(d))) for s, d in zip(self.slices(shape), shape))


def _clamped(start: int, end: int, step: int, dim: int) -> tuple[int, int | None, int]:
    """ONNX Slice's start and end for one axis, clamped as the operator says (going forward both to
    [0, dim]; going backward the start to [0, dim - 1], the end to [-1, dim - 1], -1 meaning before
    the first element), as arguments of Python's slice."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim), step
    if dim == 0:
        return 0, 0, 1
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return start, (None if end < 0 else end), step


@dataclass(frozen=True)
class SplitSpec:
    axis: int
    sizes: tuple[int, ...]

    @classmethod
    def from_node(cls, node: NodeInfo) -> "SplitSpec":
        _float32(node)
        shape = node.inputs[0].shape
        axis = _axis(int(node.attributes.get("axis", 0)), len(shape))
        split = node.attributes.get("split")
        if split is None and len(node.inputs) > 1 and node.inputs[1].name:
            split = _constant(node, 1, "split")
        outputs = len(node.outputs)
        if split is None:
            # equal parts, the last one smaller where the axis does not divide (opset 18's rule)
            size = -(-shape[axis] // max(1, outputs))
            split = [size] * (outputs - 1) + [shape[axis] - size * (outputs - 1)]
        sizes = tuple(int(s) for s in split)
        if len(sizes) != outputs or sum(sizes) != shape[axis] or min(sizes) < 0:
            raise PluginError(f"split {list(sizes)} does not cut axis {axis} of extent {shape[axis]} into {outputs} outputs")
        return cls(axis, sizes)

    def slices(self, shape: Sequence[int]) -> list[tuple[slice, ...]]:
        starts = np.cumsum((0,) + self.sizes)
        lead = (slice(None),) * self.axis
        return [lead + (slice(int(a), int(b)),) for a, b in zip(starts[:-1], starts[1:])]


@dataclass(frozen=True)
class GatherSpec:
    """Gather by constant indices, the indices' shape taking the place of the gathered axis. Indices that
    step evenly (one index, or a run first, first + step, ...) are a strided slice of the data, a view;
    any others are a `table`, and a copy of the blocks they name (a row gather: graph/passes/row_gather.py)."""

    axis: int
    first: int  # the first index, as a position in the axis
    step: int
    index_shape: tuple[int, ...]
    table: tuple[int, ...] | None = None  # every index (positions in the axis), where they do not step evenly

    @classmethod
    def from_node(cls, node: NodeInfo) -> "GatherSpec":
        _float32(node)
        indices = _constant(node, 1, "indices")
        shape = node.inputs[0].shape
        axis = _axis(int(node.attributes.get("axis", 0)), len(shape))
        flat = indices.reshape(-1).astype(np.int64)
        if not flat.size:
            raise PluginError("it gathers no index")
        if flat.min() < -shape[axis] or flat.max() >= shape[axis]:
            raise PluginError(f"an index of {flat.tolist()[:8]} is outside axis {axis} of extent {shape[axis]}")
        flat = np.where(flat < 0, flat + shape[axis], flat)
        steps = np.diff(flat)
        even = not steps.size or (steps == steps[0]).all()
        return cls(axis, int(flat[0]), int(steps[0]) if steps.size else 1, tuple(int(d) for d in indices.shape),
                   None if even else tuple(int(i) for i in flat))

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[: self.axis], *self.index_shape, *shape[self.axis + 1:])

    def indices(self) -> np.ndarray:
        if self.table is not None:
            return np.array(self.table, dtype=np.int64).reshape(self.index_shape)
        count = int(np.prod(self.index_shape, dtype=np.int64))
        return (self.first + self.step * np.arange(count)).reshape(self.index_shape)


PAD_MODES = ("constant", "reflect", "edge")


@dataclass(frozen=True)
class PadSpec:
    mode: str
    begins: tuple[int, ...]  # per axis (negative: crop)
    ends: tuple[int, ...]
    value: float

    @classmethod
    def from_node(cls, node: NodeInfo) -> "PadSpec":
        _float32(node)
        rank = len(node.inputs[0].shape)
        mode = node.attributes.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in PAD_MODES:
            raise PluginError(f"mode {mode!r} is not one of {', '.join(PAD_MODES)}")
        if "pads" in node.attributes:  # opset 1-10
            pads, value = node.attributes["pads"], float(node.attributes.get("value", 0.0))
            axes = None
        else:
            pads = _constant(node, 1, "pads")
            constant = _constant(node, 2, "constant value")
            value = 0.0 if constant is None or constant.size == 0 else float(constant.reshape(-1)[0])
            axes = _constant(node, 3, "axes")
        pads = [int(p) for p in np.asarray(pads).reshape(-1)]
        axes = list(range(rank)) if axes is None else [_axis(int(a), rank) for a in axes]
        if len(pads) != 2 * len(axes):
            raise PluginError(f"pads has {len(pads)} values for {len(axes)} axes")
        begins, ends = [0] * rank, [0] * rank
        for i, axis in enumerate(axes):
            begins[axis], ends[axis] = pads[i], pads[i + len(axes)]
        spec = cls(mode, tuple(begins), tuple(ends), value)
        shape = node.inputs[0].shape
        if mode != "constant" and any(min(b, e) < 0 for b, e in zip(begins, ends)):
            raise PluginError(f"{mode} padding with negative pads (a crop) is left to onnxruntime")
        if mode == "reflect" and any(max(b, e) >= d for b, e, d in zip(begins[1:], ends[1:], shape[1:])):
            raise PluginError("reflect padding wider than its axis minus one is left to onnxruntime")
        if min(spec.output_shape(tuple(shape))) < 0:
            raise PluginError(f"pads {pads} crop more than the input has")
        return spec

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d + b + e for d, b, e in zip(shape, self.begins, self.ends))


RESIZE_MODES = ("nearest", "linear")
COORDINATE_MODES = ("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True)
class ResizeSpec:
    """Resize of some axes by a scale each (an output size, when given as sizes); nearest or
    (multi)linear, with the coordinate mapping exporters write."""

    mode: str
    coordinates: str
    nearest: str
    scales: tuple[float, ...]  # per axis; 1.0 leaves it
    sizes: tuple[int, ...]  # per axis, the output extent at the node's shape

    @classmethod
    def from_node(cls, node: NodeInfo) -> "ResizeSpec":
        _float32(node)
        text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in node.attributes.items()}
        mode = text.get("mode", "nearest")
        coordinates = text.get("coordinate_transformation_mode", "half_pixel")
        nearest = text.get("nearest_mode", "round_prefer_floor")
        if mode not in RESIZE_MODES:
            raise PluginError(f"mode {mode!r} is not one of {', '.join(RESIZE_MODES)}")
        if coordinates not in COORDINATE_MODES:
            raise PluginError(f"coordinate_transformation_mode {coordinates!r} is not one of {', '.join(COORDINATE_MODES)}")
        if nearest not in NEAREST_MODES:
            raise PluginError(f"nearest_mode {nearest!r} is not one of {', '.join(NEAREST_MODES)}")
        if int(text.get("antialias", 0)) or text.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise PluginError("antialias and keep_aspect_ratio_policy other than stretch are left to onnxruntime")
        shape = node.inputs[0].shape
        rank = len(shape)
        axes = [_axis(int(a), rank) for a in text.get("axes", range(rank))]
        if len(node.inputs) == 2:  # opset 10: X, scales
            scales, sizes = _constant(node, 1, "scales"), None
        else:
            scales = _constant(node, 2, "scales")
            sizes = _constant(node, 3, "sizes")
        full_scales, full_sizes = [1.0] * rank, list(shape)
        if sizes is not None and sizes.size:
            for axis, size in zip(axes, sizes.reshape(-1)):
                full_sizes[axis] = int(size)
                full_scales[axis] = int(size) / shape[axis]
        elif scales is not None and scales.size:
            for axis, scale in zip(axes, scales.reshape(-1)):
                full_scales[axis] = float(scale)
                full_sizes[axis] = int(np.floor(shape[axis] * float(scale)))
        else:
            raise PluginError("neither scales nor sizes is given")
        if tuple(full_sizes) == tuple(shape):  # the output's shape is the input's: a copy, whatever the scales, as onnxruntime does
            full_scales = [1.0] * rank
        spec = cls(mode, coordinates, nearest, tuple(full_scales), tuple(full_sizes))
        if spec.resized_axes and spec.resized_axes[0] < rank - 2:
            raise PluginError(f"it resizes axes {list(spec.resized_axes)}; the kernel resizes the last two axes only")
        if min(full_sizes) < 1:
            raise PluginError(f"its output shape {full_sizes} is empty")
        return spec

    @property
    def resized_axes(self) -> tuple[int, ...]:
        return tuple(a for a, s in enumerate(self.scales) if s != 1.0)

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], *self.sizes[1:]) if self.scales[0] == 1.0 else tuple(self.sizes)
