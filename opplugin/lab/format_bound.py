"""How far a Conv step's output computed in a 16-bit format (FP16, BF16) may be from float64, element by
element: the check `bench --precision fp16|bf16` and `tune --precision fp16|bf16` hold every candidate to
before timing it.

A relative L2 tolerance cannot tell a kernel that rounds a little everywhere from one that is wrong on a
few elements; a bound per element can, and rounding analysis gives one. With u the format's unit
roundoff, k the products an output sums and M = conv(|x|, |w|) + |b| (the magnitudes of what it adds):

- each operand rounded once to the format: 2u + u^2 of each product's magnitude, 2.1u with slack;
- the products and the bias summed in FP32: about k * 2^-24 of M at worst, twice that with slack;
- a candidate that stores its result in the format (cuDNN on half tensors, where PyTorch adds the bias to
  the rounded conv in the format) rounds the conv, the bias and their sum once more: u of each, at most
  |conv| + |b| + |y| <= 2M, so 2.2u M with slack;
- a fused residual Add, the epilogue's FP32 arithmetic and an absolute floor: 1e-6 of what they add;
- an activation stretches an error by at most its slope, and a max pool's window moves by at most the
  largest bound in it.

tests/ops/conv/families/test_wgmma_half.py holds the kernels to the same bound on the GPU, and
test_depthwise_half.py the depthwise ones (through this class).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.number_formats import UNIT_ROUNDOFF
from ..ops.conv import reference
from ..ops.conv.epilogue import Epilogue
from ..ops.conv.spec import ConvSpec

FP32_ROUNDOFF = 2.0 ** -24
HALF_FORMATS = ("fp16", "bf16")
SLACK = 1e-6  # relative to the residual and absolute: the FP32 arithmetic after the sum
# An activation multiplies an input's error by its slope at most: 1 for Relu, Tanh and Clip, about 1.1 for SiLU and
# GELU, 1.5 for HardSwish with its defaults; the ones with a slope parameter take it where it is steeper.
ACTIVATION_SLOPE = 2.0
STEEPER_BY_PARAMETER = {"LeakyRelu": lambda a, b: abs(a), "HardSigmoid": lambda a, b: abs(a), "HardSwish": lambda a, b: 2.0 + abs(b)}


def activation_slope(epilogue: Epilogue) -> float:
    """The most the step's activation can stretch an error (1 without one)."""
    act = epilogue.activation
    if act is None:
        return 1.0
    steeper = STEEPER_BY_PARAMETER.get(act.op)
    return max(ACTIVATION_SLOPE, steeper(act.a, act.b)) if steeper else ACTIVATION_SLOPE


@dataclass(frozen=True)
class FormatBound:
    """The bound of a candidate in `precision`; `rounded_output`: it stores its result in the format too;
    `operands_in_format`: its operands are values of the format already, so that rounding them moves nothing
    (what is left is the FP32 sums: a check that a kernel rounds to this format and no other)."""

    precision: str
    rounded_output: bool = False
    operands_in_format: bool = False

    def __post_init__(self):
        if self.precision not in HALF_FORMATS:
            raise ValueError(f"a format bound is for {' and '.join(HALF_FORMATS)}, not {self.precision!r}")

    def per_element(self, spec: ConvSpec, epilogue: Epilogue, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                    residual: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
        """The bound on each output of the step for these operands (host arrays), shaped as its output."""
        x = np.asarray(x, np.float64)
        if epilogue.prologue:  # the kernel rounds the prologue's result, so that is what the magnitudes take
            x = epilogue.prologue.apply(x, None if scale is None else np.asarray(scale, np.float64))
        u = UNIT_ROUNDOFF[self.precision]
        k = spec.in_channels // spec.group * math.prod(spec.kernel)
        bias = None if b is None else np.abs(np.asarray(b, np.float64))
        magnitudes = reference.conv(np.abs(x), np.abs(np.asarray(w, np.float64)), bias, spec.strides, spec.pads,
                                    spec.dilations, spec.group)
        rounding = 0.0 if self.operands_in_format else 2.1 * u
        bound = (rounding + 2 * k * FP32_ROUNDOFF + (2.2 * u if self.rounded_output else 0.0)) * magnitudes + SLACK
        if epilogue.residual:
            bound = bound + SLACK * np.abs(np.asarray(residual, np.float64))
        bound = bound * activation_slope(epilogue)
        return Epilogue(pool=epilogue.pool).apply(bound) if epilogue.pool else bound


def bound_words(precision: str) -> str:
    """The bound of a 16-bit run, as the bench's and tune's headers state it."""
    return (f"|error| <= (2.1u + 2k 2^-24) M + 1e-6 per element through the epilogue, with u = {UNIT_ROUNDOFF[precision]:.3g} "
            f"({precision.upper()}'s unit roundoff), k products an output, M = conv(|x|, |w|) + |b|; a result stored in "
            f"{precision.upper()} (cuDNN's) 2.2u M more")


def bound_fraction(got: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> float:
    """The largest |got - expected| / bound over the elements: at most 1 when every one is within its bound
    (NaN counts as infinitely far)."""
    excess = np.abs(np.asarray(got, np.float64) - expected)
    fractions = np.divide(excess, bound, out=np.where(excess == 0, 0.0, np.inf), where=bound > 0)
    return float(np.inf) if np.isnan(fractions).any() else float(fractions.max(initial=0.0))
