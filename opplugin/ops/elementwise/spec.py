"""Which elementwise nodes the elementwise plugin runs, as one record: a binary op (Add, a
two-input Sum, Mul) or a unary activation of ops/activation.py's table, then the activation
that may follow a binary op inside the same kernel.

A binary op's operands are float32 tensors of the output's shape (a residual Add), or one
of them a constant that broadcasts into the other without a batch axis of its own (a
per-channel scale or bias, a scalar): numpy's broadcasting is ONNX's, so the kernels
broadcast it as given. A constant with the batch axis is refused: it would not follow the
batch through chunked runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import PluginError
from ...registry import NodeInfo
from .. import activation as activations
from ..activation import Activation

# op type -> (the operation on a and b in numpy, and as a CUDA expression)
BINARY = {"Add": (np.add, "a + b"), "Sum": (np.add, "a + b"), "Mul": (np.multiply, "a * b")}


@dataclass(frozen=True)
class ElementwiseSpec:
    op: str  # "Add", "Sum", "Mul", or an activation's op type
    unary: Activation | None = None  # the activation a unary node computes
    then: Activation | None = None  # the activation fused after a binary op

    @property
    def suffix(self) -> str:
        """For kernel names: "add+relu", "mul", "clip0_6"."""
        base = self.unary.suffix[1:] if self.unary else self.op.lower()
        return base + (self.then.suffix if self.then else "")

    def fused(self, follower: Activation) -> "ElementwiseSpec":
        return ElementwiseSpec(self.op, self.unary, follower)

    def apply(self, inputs: list[Any], xp: Any = np) -> Any:
        """The meaning, in the inputs' dtype (float64 for the oracle)."""
        if self.unary:
            return self.unary.apply(inputs[0], xp)
        y = BINARY[self.op][0](inputs[0], inputs[1])
        return self.then.apply(y, xp) if self.then else y

    @classmethod
    def from_node(cls, node: NodeInfo) -> "ElementwiseSpec":
        where = f"{node.op_type} {node.name}"
        if any(t.dtype != np.float32 for t in [*node.inputs, *node.outputs] if t.name):
            raise PluginError(f"{where}: only float32 tensors are implemented")
        if node.op_type not in BINARY:
            unary = activations.from_node(node)
            if unary is None:
                raise PluginError(f"{where}: a bound computed at run time cannot be compiled in")
            return cls(node.op_type, unary)
        operands = [t for t in node.inputs if t.name]
        if len(operands) != 2:
            raise PluginError(f"{where}: only two operands are implemented, not {len(operands)}")
        output = tuple(node.outputs[0].shape)
        for operand in operands:
            shape = tuple(operand.shape)
            if shape == output and operand.name not in node.constants:
                continue
            if operand.name not in node.constants:
                raise PluginError(f"{where}: an operand computed at run time must have the output's shape {list(output)}, "
                                  f"not {list(shape)}")
            if len(shape) == len(output) and shape[:1] != (1,) or len(shape) > len(output):
                raise PluginError(f"{where}: a constant operand of shape {list(shape)} has a batch axis; "
                                  "it would not follow the batch through chunked runs")
            if np.broadcast_shapes(shape, output) != output:
                raise PluginError(f"{where}: the constant of shape {list(shape)} does not broadcast to {list(output)}")
        if all(t.name in node.constants for t in operands):
            raise PluginError(f"{where}: both operands are constants (a constant folding would remove the node)")
        return cls(node.op_type)
