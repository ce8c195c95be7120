"""The pointwise ops, each described once: its meaning as numpy code (float64 for the oracle and
the CPU device) and as a CUDA expression, side by side.

An op is what one value of a generated kernel computes from its operands (earlier values, the
group's inputs, constants). ONNX nodes lower to these ops in lower.py: most one to one, an
inference BatchNormalization to an `Affine` over the per-channel constants it derives. The
activations of the shared table (ops/activation.py: Relu, Sigmoid, Clip, ...) are taken from
it, parameters and all, so that a Conv epilogue and a pointwise kernel compute them alike.

CUDA arithmetic is float32 (a float16 value is rounded after its op, see codegen.py). NaN and
Inf follow onnxruntime's CPU kernels: Min and Max propagate NaN (fminf/fmaxf would drop it);
Softplus is the overflow-free log1p(exp(-|x|)) + max(x, 0); Gelu is written as its formula,
so Gelu(-inf) is NaN there as here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import activation as activations
from ..activation import Activation, cuda_float

VARIADIC = 1 << 30  # no upper bound on the operand count
GELU_TANH = activations.GELU_TANH
erf = activations.erf


@dataclass(frozen=True)
class Op:
    """One pointwise op: `meaning(operands, params)` on numpy arrays, and `cuda`, the expression
    over its operands ({0}, {1}, ...) and parameters ({p0}, {p1}, ..., compiled in as exact
    float literals); a variadic op's expression is folded pairwise over its operands."""

    meaning: Callable[[list[np.ndarray], tuple[float, ...]], np.ndarray]
    cuda: str
    arity: tuple[int, int] = (1, 1)  # fewest and most operands
    flops: int = 1  # arithmetic operations per element, for GFLOP/s

    def expression(self, operands: list[str], params: tuple[float, ...]) -> str:
        literals = {f"p{i}": cuda_float(p) for i, p in enumerate(params)}
        if self.arity[1] != VARIADIC:
            return self.cuda.format(*operands, **literals)
        folded = operands[0]
        for operand in operands[1:]:
            folded = self.cuda.format(folded, operand, **literals)
        return folded


def _fold(pairwise: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def meaning(operands, params):
        value = operands[0]
        for operand in operands[1:]:
            value = pairwise(value, operand)
        return value
    return meaning


@dataclass(frozen=True)
class ActivationOp(Op):
    """An op of the shared activation table, its (a, b) as the parameters: the table's expression
    over `v`, inside a lambda that binds `v` to the operand."""

    activation: str = ""

    def expression(self, operands: list[str], params: tuple[float, ...]) -> str:
        body = Activation(self.activation, *params).cuda_expression()
        return f"[&] {{ const float v = {operands[0]}; return {body}; }}()"


def _activation(op: str) -> Op:
    return ActivationOp(lambda o, p: Activation(op, *p).apply(o[0]), "", flops=10 if op == activations.GELU else 1, activation=op)


OPS: dict[str, Op] = {
    # numpy broadcasts the operands as ONNX does
    "Add": Op(lambda o, p: o[0] + o[1], "({0} + {1})", (2, 2)),
    "Sub": Op(lambda o, p: o[0] - o[1], "({0} - {1})", (2, 2)),
    "Mul": Op(lambda o, p: o[0] * o[1], "({0} * {1})", (2, 2)),
    "Div": Op(lambda o, p: o[0] / o[1], "({0} / {1})", (2, 2)),
    "Pow": Op(lambda o, p: np.power(o[0], o[1]), "powf({0}, {1})", (2, 2), 8),
    "Sum": Op(_fold(np.add), "({0} + {1})", (1, VARIADIC)),
    "Min": Op(_fold(np.minimum), "opplugin_min({0}, {1})", (1, VARIADIC)),
    "Max": Op(_fold(np.maximum), "opplugin_max({0}, {1})", (1, VARIADIC)),
    "Where": Op(lambda o, p: np.where(o[0], o[1], o[2]), "({0} ? {1} : {2})", (3, 3)),
    # x * a + b with per-channel constants a and b: an inference BatchNormalization
    "Affine": Op(lambda o, p: o[0] * o[1] + o[2], "fmaf({0}, {1}, {2})", (3, 3), 2),
    "Neg": Op(lambda o, p: -o[0], "(-{0})"),
    "Abs": Op(lambda o, p: np.abs(o[0]), "fabsf({0})"),
    "Sqrt": Op(lambda o, p: np.sqrt(o[0]), "sqrtf({0})"),
    "Reciprocal": Op(lambda o, p: 1 / o[0], "(1.0f / {0})"),
    "Exp": Op(lambda o, p: np.exp(o[0]), "expf({0})", flops=4),
    "Log": Op(lambda o, p: np.log(o[0]), "logf({0})", flops=4),
    "Erf": Op(lambda o, p: erf(o[0]), "erff({0})", flops=8),
    "Elu": Op(lambda o, p: np.where(o[0] < 0, p[0] * np.expm1(o[0]), o[0]), "({0} < 0.0f ? {p0} * expm1f({0}) : {0})", flops=4),
    "Softplus": Op(lambda o, p: np.log1p(np.exp(-np.abs(o[0]))) + np.maximum(o[0], 0), "opplugin_softplus({0})", flops=8),
    # a Cast's rounding is its value's own type (codegen.py, group.py): the op itself is the identity
    "Cast": Op(lambda o, p: o[0], "{0}", flops=0),
    # Expand by a constant shape: the identity, its value taking the output's shape (group.py broadcasts it)
    "Expand": Op(lambda o, p: o[0], "{0}", flops=0),
    **{op: _activation(op) for op in activations.KINDS if op != activations.SILU},
}
