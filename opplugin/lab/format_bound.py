"""How far a Conv's output computed in a 16-bit format (FP16, BF16) may be from float64, element by element:
the check `bench --precision fp16|bf16` holds every candidate to before timing it.

A relative L2 tolerance cannot tell a kernel that rounds a little everywhere from one that is wrong on a
few elements; a bound per element can, and rounding analysis gives one. With u the format's unit
roundoff and M = conv(|x|, |w|) the sum of the magnitudes of an output's k products:

- each operand rounded once to the format: 2u + u^2 of each product's magnitude, 2.1u with slack;
- the products summed in FP32: about k * 2^-24 of M at worst, twice that with slack;
- the bias added in FP32: 2^-24 of |b| + |y| at most, twice that with slack;

(tests/ops/conv/families/test_wgmma_half.py's bound). A candidate that stores its result in the format
(cuDNN on half tensors: PyTorch adds the bias to the rounded conv in the format) rounds three values once
more: the conv's result, the bias and their sum, u of each (1.1u with slack). The bound covers a Conv and
its bias alone: an epilogue's activation and pooling would need bounds of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.number_formats import UNIT_ROUNDOFF
from ..ops.conv import reference
from ..ops.conv.spec import ConvSpec

FP32_ROUNDOFF = 2.0 ** -24
HALF_FORMATS = ("fp16", "bf16")


@dataclass(frozen=True)
class FormatBound:
    """The bound of a candidate in `precision`; `rounded_output`: it stores its result in the format too."""

    precision: str
    rounded_output: bool = False

    def __post_init__(self):
        if self.precision not in HALF_FORMATS:
            raise ValueError(f"a format bound is for {' and '.join(HALF_FORMATS)}, not {self.precision!r}")

    def per_element(self, spec: ConvSpec, magnitudes: np.ndarray, b: np.ndarray | None, expected: np.ndarray) -> np.ndarray:
        """The bound of each output element, from M (`magnitudes`, conv_magnitudes) and the float64 result."""
        u = UNIT_ROUNDOFF[self.precision]
        k = spec.in_channels // spec.group * int(np.prod(spec.kernel))
        bias = np.zeros(1) if b is None else np.abs(np.asarray(b, np.float64)).reshape(1, -1, *([1] * spec.rank))
        bound = (2.1 * u + 2 * k * FP32_ROUNDOFF) * magnitudes + 2 * FP32_ROUNDOFF * (bias + np.abs(expected))
        if self.rounded_output:
            bound = bound + 1.1 * u * (magnitudes + bias + np.abs(expected))
        return bound


def conv_magnitudes(spec: ConvSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """M: each output's products' magnitudes summed, in float64."""
    return reference.conv(np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64)), None, spec.strides, spec.pads,
                          spec.dilations, spec.group)


def bound_words(precision: str) -> str:
    """Both bounds of a 16-bit run, as the bench's header states them."""
    return (f"|error| <= (2.1u + 2k 2^-24) M + 2^-23 (|b| + |y|) per element, with u = {UNIT_ROUNDOFF[precision]:.3g} "
            f"({precision.upper()}'s unit roundoff), k products an output, M = conv(|x|, |w|); a result stored in "
            f"{precision.upper()} (cuDNN's) 1.1u (M + |b| + |y|) more")


def bound_fraction(got: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> float:
    """The largest |got - expected| / bound over the elements: at most 1 when every one is within its bound
    (NaN counts as infinitely far)."""
    excess = np.abs(np.asarray(got, np.float64) - expected)
    fractions = np.divide(excess, bound, out=np.where(excess == 0, 0.0, np.inf), where=bound > 0)
    return float(np.inf) if np.isnan(fractions).any() else float(fractions.max(initial=0.0))
