"""How far each output of a Conv step may be from float64 when its kernel rounds X and W once to a 16-bit
format and sums in FP32 (wg_fp16, wg_bf16): what `tune --precision fp16|bf16` holds each configuration
to, element by element, before it times it. The bound is tests/ops/conv/families/test_wgmma_half.py's,

    (2.1 u + 2 k 2^-24) * conv(|x|, |w|) + slack

with u the format's unit roundoff (two operands rounded once each: 2u + u^2, and a little more) and k
the terms a sum adds in FP32, carried through the step's epilogue."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.number_formats import UNIT_ROUNDOFF
from ..ops.conv import reference
from ..ops.conv.epilogue import Epilogue
from ..ops.conv.spec import ConvSpec

FP32_SUMS = 2.0 ** -24  # a float32 sum of k terms is off by about k times this of the terms' magnitudes, at most
# the bias, the residual add and the epilogue's FP32 arithmetic, relative to what they add, and an absolute floor
SLACK = 1e-6
# An activation multiplies an input's error by its slope at most: 1 for Relu, Tanh and Clip, about 1.1 for SiLU and
# GELU, 1.5 for HardSwish with its defaults; the ones with a slope parameter take it where it is steeper.
ACTIVATION_SLOPE = 2.0
STEEPER_BY_PARAMETER = {"LeakyRelu": lambda a, b: abs(a), "HardSigmoid": lambda a, b: abs(a), "HardSwish": lambda a, b: 2.0 + abs(b)}

RULE = "|kernel - float64| <= (2.1u + 2k 2^-24) conv(|x|,|w|) + 1e-6, per element, through the epilogue"


def activation_slope(epilogue: Epilogue) -> float:
    """The most the step's activation can stretch an error (1 without one)."""
    act = epilogue.activation
    if act is None:
        return 1.0
    steeper = STEEPER_BY_PARAMETER.get(act.op)
    return max(ACTIVATION_SLOPE, steeper(act.a, act.b)) if steeper else ACTIVATION_SLOPE


def element_bound(spec: ConvSpec, epilogue: Epilogue, precision: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                  residual: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """The bound on each output of the step for these operands (host arrays, the images checked), shaped as its output."""
    x = np.asarray(x, np.float64)
    if epilogue.prologue:  # the kernel rounds the prologue's result, so that is what the magnitudes take
        x = epilogue.prologue.apply(x, None if scale is None else np.asarray(scale, np.float64))
    k = spec.in_channels // spec.group * math.prod(spec.kernel)
    bias = None if b is None else np.abs(np.asarray(b, np.float64))
    magnitudes = reference.conv(np.abs(x), np.abs(np.asarray(w, np.float64)), bias, spec.strides, spec.pads, spec.dilations, spec.group)
    bound = (2.1 * UNIT_ROUNDOFF[precision] + 2 * k * FP32_SUMS) * magnitudes + SLACK
    if epilogue.residual:
        bound = bound + SLACK * np.abs(np.asarray(residual, np.float64))
    bound = bound * activation_slope(epilogue)
    # a window's maximum moves by at most the largest bound in the window
    return Epilogue(pool=epilogue.pool).apply(bound) if epilogue.pool else bound


def worst_ratio(got: Any, expected: np.ndarray, bound: np.ndarray) -> float:
    """The largest |got - expected| / bound over the elements (NaN where any is NaN)."""
    return float(np.max(np.abs(np.asarray(got, np.float64) - expected) / bound))
