"""Elementwise activations a kernel may apply to its output: one table, any op.

Each entry gives an ONNX activation's meaning twice: as array code (numpy, or CuPy
through `xp`) for the references, and as a CUDA expression that a kernel receives
as the function-like macro ACTIVATION(v) (see kernels/activation.cuh, which holds
the helpers the expressions call). Parameters (LeakyRelu's alpha, Clip's bounds,
...) are read from the node once and compiled in as exact hexadecimal floats.

NaN propagates through every entry, as it does in onnxruntime's kernels: the
clamps compare (`v < lo ? lo : v`) rather than call fminf/fmaxf, which would drop it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..graph.functions import OPPLUGIN_DOMAIN
from ..registry import NodeInfo


FLOAT32_MAX = float(np.finfo(np.float32).max)
SILU = "Silu"
GELU = "Gelu"
GELU_TANH = 1.0  # Gelu's parameter a: 1 for approximate="tanh", 0 for the erf form

_erf64 = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math.erf is float64-accurate


def erf(v: Any, xp: Any = np) -> Any:
    """erf elementwise, in v's dtype (CuPy's own on CuPy arrays)."""
    if xp is np:
        return np.asarray(_erf64(v), dtype=v.dtype)
    import cupyx.scipy.special

    return cupyx.scipy.special.erf(v)


def _gelu(xp: Any, v: Any, tanh_form: float) -> Any:
    """0.5 v (1 + erf(v / sqrt 2)), or with tanh_form 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3)))."""
    if tanh_form == GELU_TANH:
        return 0.5 * v * (1 + xp.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v * v * v)))
    return 0.5 * v * (1 + erf(v / math.sqrt(2), xp))


@dataclass(frozen=True)
class Kind:
    """One activation op: its array meaning f(xp, v, a, b), its CUDA expression over
    `v` with {a} and {b} for the parameters, and the ONNX attribute defaults of a, b."""

    meaning: Callable[[Any, Any, float, float], Any]
    cuda: str
    defaults: tuple[float, float] = (0.0, 0.0)


def _clamp(xp: Any, v: Any, lo: float, hi: float) -> Any:
    """lo <= v <= hi, NaN kept: where() picks by comparison, so a NaN compares false and stays."""
    v = xp.where(v < lo, xp.asarray(lo, v.dtype), v)
    return xp.where(v > hi, xp.asarray(hi, v.dtype), v)


KINDS: dict[str, Kind] = {
    "Relu": Kind(lambda xp, v, a, b: xp.where(v < 0, xp.zeros((), v.dtype), v), "((v) < 0.0f ? 0.0f : (v))"),
    "Tanh": Kind(lambda xp, v, a, b: xp.tanh(v), "tanhf(v)"),
    "Sigmoid": Kind(lambda xp, v, a, b: 1 / (1 + xp.exp(-v)), "opplugin_sigmoid(v)"),
    "LeakyRelu": Kind(lambda xp, v, a, b: xp.where(v < 0, a * v, v), "((v) < 0.0f ? {a} * (v) : (v))", (0.01, 0.0)),
    # a missing bound is float32's lowest or largest finite value, as in onnxruntime: Clip maps -inf and +inf to them
    "Clip": Kind(lambda xp, v, a, b: _clamp(xp, v, a, b), "opplugin_clamp(v, {a}, {b})", (-FLOAT32_MAX, FLOAT32_MAX)),
    "HardSigmoid": Kind(lambda xp, v, a, b: _clamp(xp, a * v + b, 0.0, 1.0), "opplugin_clamp({a} * (v) + {b}, 0.0f, 1.0f)", (0.2, 0.5)),
    "HardSwish": Kind(lambda xp, v, a, b: v * _clamp(xp, a * v + b, 0.0, 1.0), "((v) * opplugin_clamp({a} * (v) + {b}, 0.0f, 1.0f))",
                      (1 / 6, 0.5)),
    # no ONNX op: the pattern x * Sigmoid(x) (a Sigmoid and a Mul reading both), which a plan recognises as one
    SILU: Kind(lambda xp, v, a, b: v * (1 / (1 + xp.exp(-v))), "((v) * opplugin_sigmoid(v))"),
    # ONNX's Gelu (opset 20) or the opplugin function of its erf form; a is GELU_TANH for approximate="tanh"
    GELU: Kind(lambda xp, v, a, b: _gelu(xp, v, a), "opplugin_gelu(v, {a})"),
}


def cuda_float(value: float) -> str:
    """`value` rounded to float32, as an exact CUDA literal (hexadecimal); infinities by their bits."""
    value = float(np.float32(value))
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    return f"{value.hex()}f" if value else "0.0f"


@dataclass(frozen=True)
class Activation:
    """One activation with its parameters resolved (a: alpha or the lower bound, b: beta or the upper)."""

    op: str
    a: float = 0.0
    b: float = 0.0

    def __post_init__(self):
        if self.op not in KINDS:
            raise ValueError(f"unsupported activation {self.op!r}; supported: {', '.join(KINDS)}")

    @classmethod
    def plain(cls, op: str) -> "Activation":
        """The op with ONNX's default parameters."""
        return cls(op, *KINDS[op].defaults)

    @property
    def suffix(self) -> str:
        """For kernel names: "+relu", "+leakyrelu", "+clip0_6"."""
        if self.op == GELU and self.a == GELU_TANH:
            return "+gelutanh"
        if self.op == "Clip":
            bounds = ["" if abs(x) >= FLOAT32_MAX else f"{x:g}" for x in (self.a, self.b)]  # no bound given: nothing shown
            return f"+clip{bounds[0]}_{bounds[1]}".replace("-", "m").replace(".", "p")
        return f"+{self.op.lower()}"

    @property
    def nondecreasing(self) -> bool:
        """Whether f(max(u, v)) = max(f(u), f(v)), so that a max pool may come before it."""
        if self.op in ("LeakyRelu", "HardSigmoid"):
            return self.a >= 0
        if self.op == "Clip":
            return self.a <= self.b
        return self.op in ("Relu", "Tanh", "Sigmoid")

    def apply(self, y: Any, xp: Any = np) -> Any:
        """The meaning on an array of any shape, in its dtype (float64 for an oracle)."""
        dtype = y.dtype
        return xp.asarray(KINDS[self.op].meaning(xp, y, dtype.type(self.a), dtype.type(self.b)), dtype)

    def cuda_expression(self) -> str:
        """The expression over `v` that the ACTIVATION(v) macro stands for."""
        return KINDS[self.op].cuda.format(a=cuda_float(self.a), b=cuda_float(self.b))

    def define(self) -> dict[str, str]:
        """The NVRTC -D option that compiles this activation into a kernel including activation.cuh."""
        return {"ACTIVATION(v)": self.cuda_expression()}


def from_node(node: NodeInfo) -> Activation | None:
    """The Activation a node computes, or None when it is no activation of the table
    (or a Clip whose bounds are not constants, a Gelu of no ONNX form). SiLU is two nodes: see `silu_pair`."""
    domains = ("", "ai.onnx", OPPLUGIN_DOMAIN) if node.op_type == GELU else ("", "ai.onnx")
    kind = KINDS.get(node.op_type) if node.op_type != SILU and node.node.domain in domains else None
    if kind is None or len([o for o in node.node.output if o]) != 1:
        return None
    a, b = kind.defaults
    if node.op_type == GELU:
        form = node.attributes.get("approximate", "none")
        form = form.decode() if isinstance(form, bytes) else form
        return Activation(GELU, GELU_TANH if form == "tanh" else 0.0) if form in ("none", "tanh") else None
    if node.op_type == "Clip":
        if node.attributes.keys() & {"min", "max"}:  # opset < 11: bounds are attributes
            a, b = float(node.attributes.get("min", a)), float(node.attributes.get("max", b))
        bounds = []
        for index, default in ((1, a), (2, b)):
            name = node.node.input[index] if len(node.node.input) > index else ""
            if not name:
                bounds.append(default)
            elif name in node.constants:
                bounds.append(float(np.asarray(node.constants[name]).reshape(())))
            else:
                return None  # a bound computed at run time cannot be compiled in
        a, b = bounds
    else:
        a = float(node.attributes.get("alpha", a))
        b = float(node.attributes.get("beta", b))
    return Activation(node.op_type, a, b)


def silu_pair(sigmoid: NodeInfo, mul: NodeInfo) -> bool:
    """Whether `mul` multiplies the Sigmoid's own input by the Sigmoid's output: x * Sigmoid(x)."""
    if sigmoid.op_type != "Sigmoid" or mul.op_type != "Mul" or {sigmoid.node.domain, mul.node.domain} - {"", "ai.onnx"}:
        return False
    x, s = sigmoid.node.input[0], sigmoid.node.output[0]
    return sorted(mul.node.input) == sorted([x, s]) and x != s
