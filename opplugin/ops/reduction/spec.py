"""The reductions and normalisations as normalised records, one per node.

- ReduceSpec: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
  ReduceSumSquare and ReduceLogSum over any axes but the batch, keepdims either way. Axes that
  are not adjacent reduce in stages, one run of adjacent axes each (a mean of means over equal
  counts is the mean; an L2 norm's first stage sums squares, its last takes the square root).
- SoftmaxSpec: Softmax and LogSoftmax over one axis (opset 13 and later) or over every axis
  from `axis` on (before 13, the input seen as 2-D).
- NormSpec: LayerNormalization, GroupNormalization and InstanceNormalization: the mean and
  variance of each row, then a per-channel scale and bias. The channel of element (o, r) of a
  row is ((o % groups) * extent + r) // channel_size: a LayerNormalization row has one
  channel per element (groups 1, channel_size 1), an instance's row is one channel, a group's
  row holds extent // channel_size channels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...errors import PluginError
from ...graph.functions import OPPLUGIN_DOMAIN
from ...registry import NodeInfo
from .rows import Rows, normalised_axes, product, refuse_batch_axis, runs

SUM, MEAN, MAX, MIN, PROD = "sum", "mean", "max", "min", "prod"
L1, L2, SUM_SQUARE, LOG_SUM = "l1", "l2", "sumsquare", "logsum"
REDUCE_OPS = {"ReduceSum": SUM, "ReduceMean": MEAN, "ReduceMax": MAX, "ReduceMin": MIN, "ReduceProd": PROD,
              "ReduceL1": L1, "ReduceL2": L2, "ReduceSumSquare": SUM_SQUARE, "ReduceLogSum": LOG_SUM}


def _where(node: NodeInfo) -> str:
    return f"{node.op_type} {node.name}"


def _float32_input(node: NodeInfo) -> tuple[int, ...]:
    x = node.inputs[0]
    if x.dtype != np.float32:
        raise PluginError(f"{_where(node)}: only float32 is implemented, the input is {x.dtype}")
    if not x.shape or min(x.shape) < 0:
        raise PluginError(f"{_where(node)}: the input's shape {list(x.shape)} is not known at plan time")
    return tuple(int(d) for d in x.shape)


def _one_output(node: NodeInfo, what: str) -> None:
    if len([o for o in node.node.output if o]) > 1:
        raise PluginError(f"{_where(node)}: {what} outputs are not implemented")


@dataclass(frozen=True)
class ReduceSpec:
    op: str  # a value of REDUCE_OPS
    input_shape: tuple[int, ...]  # at the plan's batch
    axes: tuple[int, ...]
    keepdims: bool
    stages: tuple[Rows, ...] = field(default=())  # one per run of adjacent reduced axes, innermost first

    @property
    def reduced_shape(self) -> tuple[int, ...]:
        """The output's shape with keepdims (the reduced axes kept as 1) at the plan's batch."""
        return tuple(1 if a in self.axes else d for a, d in enumerate(self.input_shape))

    def output_shape(self, batch: int) -> tuple[int, ...]:
        dims = [batch, *self.reduced_shape[1:]]
        return tuple(dims) if self.keepdims else tuple(d for a, d in enumerate(dims) if a not in self.axes)

    def flops(self, batch: int) -> int:
        return batch * product(self.input_shape[1:])

    def bytes_moved(self, batch: int) -> int:
        return 4 * (batch * product(self.input_shape[1:]) + product(self.output_shape(batch)))

    @classmethod
    def from_node(cls, node: NodeInfo) -> "ReduceSpec":
        where = _where(node)
        shape = _float32_input(node)
        axes = node.attributes.get("axes")
        if len(node.node.input) > 1 and node.node.input[1]:
            if node.node.input[1] not in node.constants:
                raise PluginError(f"{where}: the axes are computed at run time")
            axes = np.asarray(node.constants[node.node.input[1]]).reshape(-1).tolist()
        if not axes:
            if node.attributes.get("noop_with_empty_axes", 0):
                raise PluginError(f"{where}: no axes with noop_with_empty_axes is a copy, not a reduction; not implemented")
            axes = list(range(len(shape)))  # every axis
        axes = normalised_axes(axes, len(shape), where)
        refuse_batch_axis(axes, where)
        stages, current = [], list(shape)
        for first, end in reversed(runs(axes, shape)):
            stages.append(Rows.of(tuple(current), first, end))
            current[first:end] = [1] * (end - first)
        return cls(REDUCE_OPS[node.op_type], shape, axes, bool(node.attributes.get("keepdims", 1)), tuple(stages))


@dataclass(frozen=True)
class SoftmaxSpec:
    log: bool  # LogSoftmax
    input_shape: tuple[int, ...]
    first: int  # the axes [first, end) are the ones each softmax runs over
    end: int

    @property
    def rows(self) -> Rows:
        return Rows.of(self.input_shape, self.first, self.end)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.input_shape[1:])

    def flops(self, batch: int) -> int:
        return 4 * batch * product(self.input_shape[1:])  # max, subtract, exp and sum, divide

    def bytes_moved(self, batch: int) -> int:
        return 8 * batch * product(self.input_shape[1:])

    @classmethod
    def from_node(cls, node: NodeInfo) -> "SoftmaxSpec":
        where = _where(node)
        shape = _float32_input(node)
        rank = len(shape)
        given = node.attributes.get("axis")
        opset = node.opset
        if opset >= 13:
            axis = normalised_axes([-1 if given is None else given], rank, where)[0]
            first, end = axis, axis + 1
        elif opset:
            axis = normalised_axes([1 if given is None else given], rank, where)[0]
            first, end = axis, rank  # the input as 2-D: [axis, rank) flattened into one row
        else:
            # no opset known (a node built by hand): take only what both readings agree on
            if given is None or int(given) % rank != rank - 1:
                raise PluginError(f"{where}: the model's opset is unknown, so axis {given} is ambiguous (one axis since opset 13, "
                                  "every axis from it before)")
            first, end = rank - 1, rank
        refuse_batch_axis(tuple(range(first, end)), where, "a softmax")
        return cls(node.op_type == "LogSoftmax", shape, first, end)


LAYER, GROUP, INSTANCE = "layer", "group", "instance"


@dataclass(frozen=True)
class NormSpec:
    kind: str  # LAYER, GROUP or INSTANCE
    input_shape: tuple[int, ...]
    rows: Rows
    epsilon: float
    groups: int = 1  # rows per image that share no channel (GROUP: num_groups; INSTANCE: C)
    channel_size: int = 1  # elements of a row in one channel (1 for LAYER)
    channels: int = 0  # entries of the per-channel scale and bias
    first: int = 1  # LAYER: the first normalised axis

    def channel_of(self, o, r):
        """The scale/bias index of element r of row o (numpy arrays or ints)."""
        return ((o % self.groups) * self.rows.extent + r) // self.channel_size

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.input_shape[1:])

    def flops(self, batch: int) -> int:
        return 7 * batch * product(self.input_shape[1:])  # sum; subtract, square, sum; subtract, scale, add

    def bytes_moved(self, batch: int) -> int:
        return 8 * batch * product(self.input_shape[1:]) + 8 * self.channels

    @classmethod
    def from_node(cls, node: NodeInfo) -> "NormSpec":
        where = _where(node)
        shape = _float32_input(node)
        rank = len(shape)
        epsilon = float(node.attributes.get("epsilon", 1e-5))
        if node.op_type == "LayerNormalization":
            _one_output(node, "the Mean and InvStdDev")
            if node.node.domain == OPPLUGIN_DOMAIN:
                axes = normalised_axes(node.attributes.get("axes", []), rank, where)
                if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
                    raise PluginError(f"{where}: the axes {list(axes)} are not adjacent")
                first, end = axes[0], axes[-1] + 1
            else:
                first, end = normalised_axes([node.attributes.get("axis", -1)], rank, where)[0], rank
            refuse_batch_axis(tuple(range(first, end)), where, "normalising")
            rows = Rows.of(shape, first, end)
            return cls(LAYER, shape, rows, epsilon, 1, 1, rows.extent, first)
        if rank < 3:
            raise PluginError(f"{where}: the input must be N x C x spatial..., not {list(shape)}")
        channels, size = shape[1], product(shape[2:])
        if node.op_type == "InstanceNormalization":
            return cls(INSTANCE, shape, Rows(channels, size, 1), epsilon, channels, size, channels)
        groups = int(node.attributes.get("num_groups", 0))
        if groups < 1 or channels % groups:
            raise PluginError(f"{where}: num_groups {groups} does not divide the {channels} channels")
        return cls(GROUP, shape, Rows(groups, channels // groups * size, 1), epsilon, groups, size, channels)


def affine(spec: NormSpec, node: NodeInfo) -> tuple[np.ndarray, np.ndarray]:
    """The node's scale and bias as `spec.channels` float32 values each (constants, broadcast as ONNX does)."""
    where = _where(node)
    arrays = []
    for index, what in ((1, "scale"), (2, "bias")):
        name = node.node.input[index] if len(node.node.input) > index else ""
        if not name:
            if spec.kind != LAYER or what == "scale":
                raise PluginError(f"{where}: the {what} input is missing")
            arrays.append(np.zeros(spec.channels, np.float32))
            continue
        if name not in node.constants:
            raise PluginError(f"{where}: the {what} is computed at run time (the kernel compiles it in as a constant)")
        arrays.append(_per_channel(spec, np.asarray(node.constants[name]), what, where))
    return arrays[0], arrays[1]


def _per_channel(spec: NormSpec, value: np.ndarray, what: str, where: str) -> np.ndarray:
    if value.dtype != np.float32:
        raise PluginError(f"{where}: the {what} is {value.dtype}, not float32")
    if spec.kind == LAYER:
        # broadcast against the normalised axes and those after them; constant along the latter
        normalised = spec.input_shape[spec.first:]
        try:
            full = np.broadcast_to(value, normalised) if value.ndim <= len(normalised) else None
        except ValueError:
            full = None
        if full is None:
            raise PluginError(f"{where}: the {what} of shape {list(value.shape)} does not broadcast to {list(normalised)}")
        rows = full.reshape(spec.rows.extent, spec.rows.inner)
        if not (rows == rows[:, :1]).all():
            raise PluginError(f"{where}: the {what} varies along axes that are not normalised")
        return np.ascontiguousarray(rows[:, 0], dtype=np.float32)
    if value.size == spec.channels:
        return value.reshape(-1).astype(np.float32)
    if spec.kind == GROUP and value.size == spec.groups:  # opset 18: one value per group
        return np.repeat(value.reshape(-1), spec.channels // spec.groups).astype(np.float32)
    raise PluginError(f"{where}: the {what} has {value.size} values for {spec.channels} channels")

