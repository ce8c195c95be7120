"""A whole model's floor on this device: the least time any implementation could take.

The floor is the larger of two lower bounds (lab/roofline.py measures both rates):

- compute: the model's FLOPs at the measured FP32 rate;
- memory: its weights read once, its graph inputs read once and its activations written
  once, at the measured copy bandwidth.

Both are counted on the graph opplugin runs (BatchNormalization already folded into its
Conv, identities dropped), with the shapes at the batch. An activation is the output of a
node that must write one: views (Reshape, Flatten, ...) write nothing, a zero-copy
Concat's producers write into it, and a pointwise op can fuse into the node that
produces its input, so none of those counts. FLOPs: a multiply-add is 2 (Conv, Gemm,
MatMul), a pool window costs its size per output, a global pool or a reduction one per
input element, and every other node one per output element.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..graph.model import Model
from ..registry import NodeInfo
from . import roofline

# outputs that are no write of their own: views, shape arithmetic, zero-copy Concat
NO_WRITE = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Concat",
    "Shape", "Size", "Constant", "ConstantOfShape", "Gather", "Range",
})
# one element in, one element out (with broadcasting): can fuse into its producer's write
POINTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf",
    "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Elu", "Selu", "Clip", "HardSigmoid", "HardSwish",
    "Softplus", "Min", "Max", "Where", "Cast", "Gelu", "PRelu", "BatchNormalization", "Not",
    "Equal", "Less", "Greater", "Mish",
})
POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


@dataclass(frozen=True)
class ModelWork:
    """What one run of a model at a batch must compute and move."""

    flops: int
    weight_bytes: int
    input_bytes: int
    activation_bytes: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.input_bytes + self.activation_bytes

    def floor_ms(self, bytes_per_s: float, flops_per_s: float) -> float:
        return roofline.floor_ms(self.flops, self.bytes, bytes_per_s, flops_per_s)

    def bound(self, bytes_per_s: float, flops_per_s: float) -> str:
        return roofline.bound_by(self.flops, self.bytes, bytes_per_s, flops_per_s)

    def record(self, bytes_per_s: float, flops_per_s: float) -> dict[str, Any]:
        """The figures and the floor they give at these rates, for the JSON."""
        return {"flops": self.flops, "weight_bytes": self.weight_bytes, "input_bytes": self.input_bytes,
                "activation_bytes": self.activation_bytes, "floor_ms": self.floor_ms(bytes_per_s, flops_per_s),
                "floor_bound": self.bound(bytes_per_s, flops_per_s)}


def _elements(shape: tuple[int, ...]) -> int:
    return math.prod(max(d, 0) for d in shape)


def _nbytes(shape: tuple[int, ...], dtype) -> int:
    return _elements(shape) * dtype.itemsize


def node_flops(info: NodeInfo) -> int:
    """The node's floating-point operations at the inferred shapes (see the module's docstring)."""
    op = info.op_type
    out = _elements(info.outputs[0].shape) if info.outputs else 0
    if op == "Conv":
        return 2 * out * _elements(info.inputs[1].shape[1:])  # W is (M, C/group, kernel...)
    if op == "ConvTranspose":
        return 2 * _elements(info.inputs[0].shape) * _elements(info.inputs[1].shape[1:])
    if op == "Gemm":
        a = info.inputs[0].shape
        return 2 * out * (a[0] if info.attributes.get("transA", 0) else a[-1])
    if op == "MatMul":
        return 2 * out * info.inputs[0].shape[-1]
    if op in POOLS:
        return out * _elements(tuple(info.attributes.get("kernel_shape", ())))
    if op.startswith("Global") or op.startswith("Reduce"):  # every input element takes part once
        return _elements(info.inputs[0].shape)
    if op in NO_WRITE:
        return 0
    return out


def node_writes(info: NodeInfo) -> int:
    """Bytes the node must write: its outputs, unless it is a view, a zero-copy Concat or pointwise."""
    if info.op_type in NO_WRITE or info.op_type in POINTWISE:
        return 0
    return sum(_nbytes(t.shape, t.dtype) for t in info.outputs if t.name)


def model_work(model: Model, batch: int) -> ModelWork:
    """FLOPs and bytes of one run of `model` at `batch`."""
    tensors = model.infer(batch)
    infos = model.node_infos(batch, tensors)
    weights = sum(int(array.nbytes) for array in model.initializers.values())
    inputs = sum(_nbytes(tensors[v.name].shape, tensors[v.name].dtype) for v in model.inputs)
    # a graph output is written even when a pointwise op produced it (a view's is its source's)
    pointwise = {t.name for info in infos if info.op_type in POINTWISE for t in info.outputs}
    outputs = sum(_nbytes(tensors[name].shape, tensors[name].dtype) for name in model.outputs if name in pointwise)
    return ModelWork(flops=sum(node_flops(info) for info in infos), weight_bytes=weights, input_bytes=inputs,
                     activation_bytes=sum(node_writes(info) for info in infos) + outputs)
