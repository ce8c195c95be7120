"""The element bound a 16-bit run of the Conv suites holds each candidate to (lab/format_bound.py), and
the one verdict every trial and peer gets (trial.judge), on host arrays: no GPU needed."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import conv_spec

from opplugin.core.number_formats import UNIT_ROUNDOFF, round_to
from opplugin.lab.format_bound import FormatBound, activation_slope, bound_fraction, bound_words
from opplugin.lab.trial import Problem, judge
from opplugin.ops.conv import reference
from opplugin.ops.conv.epilogue import NONE, Epilogue

SPEC = conv_spec(3, 64, 32, (9, 9), (3, 3), pads=(1, 1, 1, 1))


def operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SPEC.input_shape()).astype(np.float32)
    w = (rng.standard_normal(SPEC.weight_shape) * np.sqrt(2 / (64 * 9))).astype(np.float32)
    b = (rng.standard_normal(SPEC.out_channels) * 0.1).astype(np.float32)
    return x, w, b


def host_problem(x, w, b, epilogue=NONE) -> Problem:
    """A Problem whose checked images are all of x's, made on the host (a real one uploads x to the GPU)."""
    problem = Problem.__new__(Problem)
    problem.spec, problem.epilogue, problem.weights, problem.x = SPEC, epilogue, (w, b), None
    problem.indices = list(range(x.shape[0]))
    problem.checked_operands = (x, w, b, None, None)
    problem.expected = reference.expected(SPEC, epilogue, x, w, b)
    problem._bounds = {}
    return problem


def in_format(x, w, b, precision, rounded_output=False) -> np.ndarray:
    """The Conv as a 16-bit kernel computes it: operands rounded to the format, FP32 sums; with `rounded_output`,
    as cuDNN on half tensors: the conv's result, the bias and their sum each rounded to the format too."""
    rx, rw = round_to(x, precision), round_to(w, precision)
    if not rounded_output:
        return reference.conv(rx, rw, b, SPEC.strides, SPEC.pads, SPEC.dilations, SPEC.group)
    conv = round_to(reference.conv(rx, rw, None, SPEC.strides, SPEC.pads, SPEC.dilations, SPEC.group), precision)
    return round_to(conv + round_to(b, precision).reshape(1, -1, 1, 1), precision)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_conv_computed_in_the_format_is_within_its_bound(precision):
    x, w, b = operands()
    problem = host_problem(x, w, b)
    got = in_format(x, w, b, precision)
    fraction = problem.bound_fraction(got.astype(np.float64), FormatBound(precision))
    assert 0 < fraction <= 1, fraction  # rounded (not FP32 itself), and within the bound
    stored = in_format(x, w, b, precision, rounded_output=True)
    assert problem.bound_fraction(stored.astype(np.float64), FormatBound(precision, rounded_output=True)) <= 1


def test_a_result_stored_in_the_format_gets_the_wider_bound_and_bf16s_is_wider_than_fp16s():
    x, w, b = operands(1)
    expected = reference.expected(SPEC, NONE, x, w, b)
    fp16, stored, bf16 = (FormatBound(p, r).per_element(SPEC, NONE, x, w, b)
                          for p, r in [("fp16", False), ("fp16", True), ("bf16", False)])
    assert fp16.shape == expected.shape and np.all(fp16 > 0)
    assert np.all(stored > fp16) and np.all(bf16 > fp16)
    with pytest.raises(ValueError, match="fp16 and bf16, not 'tf32'"):
        FormatBound("tf32")
    assert "u = 0.000488" in bound_words("fp16") and "FP16 (cuDNN's) 2.2u M more" in bound_words("fp16")


def test_the_fraction_is_the_worst_element_over_its_bound_and_nan_is_infinitely_far():
    expected, bound = np.array([1.0, 2.0, 0.0]), np.array([0.1, 0.5, 0.0])
    assert bound_fraction(np.array([1.05, 2.0, 0.0]), expected, bound) == pytest.approx(0.5)
    assert bound_fraction(np.array([1.0, 3.0, 0.0]), expected, bound) == pytest.approx(2.0)
    assert bound_fraction(np.array([1.0, 2.0, 1e-30]), expected, bound) == np.inf  # no error allowed where the bound is 0
    assert bound_fraction(np.array([np.nan, 2.0, 0.0]), expected, bound) == np.inf


def test_the_verdict_names_what_is_wrong_by_the_bound_or_the_tolerance():
    x, w, b = operands(2)
    problem = host_problem(x, w, b)
    got = in_format(x, w, b, "fp16")
    ok = judge(problem, got, bound=FormatBound("fp16"))
    assert ok.wrong is None and 0 < ok.bound_fraction <= 1 and 0 < ok.rel_error < 1e-3
    bounds = FormatBound("fp16").per_element(SPEC, NONE, x, w, b)
    one_off = got.copy()
    one_off[1, 5, 4, 4] = problem.expected[1, 5, 4, 4] + 3 * bounds[1, 5, 4, 4]  # one element three bounds away
    wrong = judge(problem, one_off, bound=FormatBound("fp16"))
    assert wrong.bound_fraction == pytest.approx(3.0) and wrong.wrong.startswith("an element 3x its fp16 bound away from float64")
    assert judge(problem, one_off, tolerance=1e-2).wrong is None  # the relative L2 error of the whole hides it
    assert judge(problem, got, tolerance=1e-5).wrong.startswith("relative error ")
    assert judge(problem, got, tolerance=1e-2).bound_fraction is None
    unwritten = got.copy()
    unwritten[0, 0, :2] = np.nan
    assert judge(problem, unwritten, bound=FormatBound("fp16")).wrong == "18 output elements NaN (never written?)"


def test_one_rounding_of_each_product_nearly_meets_the_bound_and_a_coarser_format_breaks_it():
    one_term = conv_spec(4, 1, 3, (16, 16), (1, 1), bias=False)  # k = 1: each output one product, nothing cancels
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(one_term.input_shape()).astype(np.float32), rng.standard_normal(one_term.weight_shape).astype(np.float32)
    exact = reference.expected(one_term, NONE, x, w, None)
    bound = FormatBound("fp16").per_element(one_term, NONE, x, w, None)
    rounded = reference.expected(one_term, NONE, round_to(x, "fp16"), round_to(w, "fp16"), None).astype(np.float32)
    assert 0.5 < bound_fraction(rounded, exact, bound) <= 1.0
    coarse = reference.expected(one_term, NONE, round_to(x, "bf16"), round_to(w, "bf16"), None)
    assert bound_fraction(coarse, exact, bound) > 1.0
    assert bound_fraction(exact * (1 + 3 * UNIT_ROUNDOFF["fp16"]), exact, bound) > 1.0


def test_the_epilogue_carries_the_bound_to_the_steps_output():
    x, w, b = operands(5)
    r = np.random.default_rng(1).standard_normal(SPEC.output_shape()).astype(np.float32)
    plain = FormatBound("fp16").per_element(SPEC, NONE, x, w, b)
    added = FormatBound("fp16").per_element(SPEC, Epilogue(residual=True), x, w, b, r)
    assert np.allclose(added - plain, 1e-6 * np.abs(r))  # the FP32 add's own rounding
    relu_pool = Epilogue("Relu", (3, 3))
    pooled = FormatBound("fp16").per_element(SPEC, relu_pool, x, w, b)
    assert pooled.shape == reference.expected(SPEC, relu_pool, x, w, b).shape == (3, 32, 3, 3)
    assert np.array_equal(pooled, 2.0 * plain.reshape(3, 32, 3, 3, 3, 3).max(axis=(3, 5)))  # a window's largest, times the slope
    assert activation_slope(NONE) == 1.0 and activation_slope(Epilogue("LeakyRelu")) == 2.0


def test_a_relu_steps_output_in_the_format_is_judged_through_its_epilogue():
    x, w, b = operands(3)
    problem = host_problem(x, w, b, Epilogue("Relu"))
    got = np.maximum(in_format(x, w, b, "bf16"), 0)
    assert 0 < problem.bound_fraction(got.astype(np.float64), FormatBound("bf16")) <= 1
