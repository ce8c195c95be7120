"""The per-element bound `tune --precision fp16|bf16` holds each configuration to (lab/rounding_bound.py): an exact
sum of operands rounded once to the format meets it, operands rounded to a coarser format or a result off by more
than the roundoff allows do not; the epilogue carries it to the step's output."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import conv_spec

from opplugin.core.number_formats import UNIT_ROUNDOFF, round_to
from opplugin.lab.rounding_bound import activation_slope, element_bound, worst_ratio
from opplugin.ops.conv import reference
from opplugin.ops.conv.epilogue import NONE, Epilogue

ONE_TERM = conv_spec(4, 1, 3, (16, 16), (1, 1), bias=False)  # k = 1: each output is one product, no cancellation
WIDE = conv_spec(2, 64, 8, (8, 8), (3, 3), pads=(1, 1, 1, 1))


def operands(spec, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape()).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32) if spec.has_bias else None
    return x, w, b


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("spec", [ONE_TERM, WIDE], ids=["one_term", "wide"])
def test_operands_rounded_once_to_the_format_meet_its_bound(spec, precision):
    x, w, b = operands(spec)
    exact = reference.expected(spec, NONE, x, w, b)
    rounded = reference.expected(spec, NONE, round_to(x, precision), round_to(w, precision), b).astype(np.float32)
    bound = element_bound(spec, NONE, precision, x, w, b)
    assert bound.shape == exact.shape
    ratio = worst_ratio(rounded, exact, bound)
    assert ratio <= 1.0
    if spec is ONE_TERM:  # nothing cancels in one product: the bound is nearly met
        assert ratio > 0.5


def test_bf16s_rounding_breaks_fp16s_bound_and_so_does_an_error_of_three_roundoffs():
    x, w, b = operands(ONE_TERM)
    exact = reference.expected(ONE_TERM, NONE, x, w, b)
    bound = element_bound(ONE_TERM, NONE, "fp16", x, w, b)
    coarse = reference.expected(ONE_TERM, NONE, round_to(x, "bf16"), round_to(w, "bf16"), b)
    assert worst_ratio(coarse, exact, bound) > 1.0
    assert worst_ratio(exact * (1 + 3 * UNIT_ROUNDOFF["fp16"]), exact, bound) > 1.0
    assert np.isnan(worst_ratio(np.where(exact > 0, np.nan, exact), exact, bound))  # a NaN never passes (not <= 1)


def test_the_epilogue_carries_the_bound_to_the_steps_output():
    x, w, b = operands(WIDE)
    r = np.random.default_rng(1).standard_normal(WIDE.output_shape()).astype(np.float32)
    plain = element_bound(WIDE, NONE, "fp16", x, w, b)
    added = element_bound(WIDE, Epilogue(residual=True), "fp16", x, w, b, r)
    assert np.allclose(added - plain, 1e-6 * np.abs(r))  # the FP32 add's own rounding
    relu_pool = Epilogue("Relu", (2, 2))
    pooled = element_bound(WIDE, relu_pool, "fp16", x, w, b)
    assert pooled.shape == reference.expected(WIDE, relu_pool, x, w, b).shape == (2, 8, 4, 4)
    assert np.array_equal(pooled, 2.0 * plain.reshape(2, 8, 4, 2, 4, 2).max(axis=(3, 5)))  # a window's largest, times the slope
    assert activation_slope(NONE) == 1.0 and activation_slope(Epilogue("LeakyRelu")) == 2.0
