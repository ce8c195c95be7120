"""What the GPU tests of one Conv family at a time share: fresh random operands, a
configuration's output, poisoned with NaN first, against the float64 reference (or, for a 16-bit
configuration, returned for the test's own bound), and a run in a 16-bit format against onnxruntime."""
from __future__ import annotations

import numpy as np

from opplugin.ops.conv import families, reference

MAX_RELATIVE_L2 = 1e-5


def draw(spec, residual: bool = False):
    """(seed, x, w, b, r): standard-normal float32 drawn fresh, never all zeros."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape(), dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    b = rng.standard_normal(spec.out_channels, dtype=np.float32)
    r = rng.standard_normal(spec.output_shape(), dtype=np.float32) if residual else None
    return seed, x, w, b, r


def run_and_compare(spec, config, epilogue, x, w, b, r, context, scale=None, x_on_device=None):
    """`scale`: a prologue's operand (input 4); `x_on_device`: X as given to the kernel (a view), else x copied there."""
    import cupy

    kernel = families.build_kernel(spec, config, (w, b), epilogue)
    assert kernel.variant == str(config)  # a Config or its name
    out = cupy.full(spec.output_shape(), cupy.nan, dtype=cupy.float32)
    x_given = cupy.asarray(x) if x_on_device is None else x_on_device
    inputs = [x_given] + [cupy.asarray(a) for a in (w, b)] + ([] if r is None else [cupy.asarray(r)])
    if scale is not None:
        inputs += [None] * (4 - len(inputs)) + [cupy.asarray(scale)]
    [y] = kernel(inputs, None, out=out)
    assert y is out
    got = cupy.asnumpy(y)
    assert not np.isnan(got).any(), f"{context}: {int(np.isnan(got).sum())} outputs never written"
    expected = reference.expected(spec, epilogue, x, w, b, r, scale)
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error <= MAX_RELATIVE_L2, f"{context}: relative L2 error {error:.3g} > {MAX_RELATIVE_L2}"


def run_poisoned(spec, config, epilogue, x, w, b, r=None, scale=None) -> np.ndarray:
    """A 16-bit configuration's FP32 output on these operands (host arrays; `scale`: a prologue's operand), written into
    an output poisoned with NaN first: every element must be written. Its NaN and Inf are no proof of the inputs' (a
    chunk that meets them runs again exactly), so the kernel says it is not nonfinite_exact."""
    import cupy

    kernel = families.build_kernel(spec, config, (w, b), epilogue)
    assert kernel.variant == config.name() and not kernel.nonfinite_exact
    out = cupy.full(spec.output_shape(), cupy.nan, dtype=cupy.float32)
    inputs = [cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b)]
    if r is not None or scale is not None:
        inputs += [None if r is None else cupy.asarray(r), None if scale is None else cupy.asarray(scale)]
    [y] = kernel(inputs, None, out=out)
    assert y is out
    got = cupy.asnumpy(y)
    assert not np.isnan(got).any(), f"{config}: {int(np.isnan(got).sum())} outputs never written"
    return got


def assert_within_the_formats_bounds(got, spec, epilogue, x, w, b, r, precision: str, context: str) -> None:
    """A 16-bit configuration's output `got` within the format's per-element bound against float64, and within FP32
    sums' bound against the same Conv on operands rounded to the format (so the kernel rounds as the format does)."""
    from opplugin.core.number_formats import round_to
    from opplugin.lab.format_bound import FormatBound, bound_fraction

    exact = reference.expected(spec, epilogue, x, w, b, r)
    fraction = bound_fraction(got, exact, FormatBound(precision).per_element(spec, epilogue, x, w, b, r))
    assert fraction <= 1.0, f"{context}: {fraction:.3g} of the bound"
    rx, rw = round_to(x, precision), round_to(w, precision)
    as_rounded = reference.expected(spec, epilogue, rx, rw, b, r)
    sums_alone = FormatBound(precision, operands_in_format=True).per_element(spec, epilogue, rx, rw, b, r)
    fraction = bound_fraction(got, as_rounded, sums_alone)
    assert fraction <= 1.0, f"{context}: {fraction:.3g} of FP32 sums' bound from {precision} operands"


def assert_within_the_formats_rule(got, expected, precision: str) -> None:
    """A run in a 16-bit format against onnxruntime's FP32 output: within the rule a run in that precision is held
    to (verify/check.py), and moved by some rounding, as a run that stayed FP32 would not be."""
    from opplugin.verify.check import default_tolerance

    atol, rtol = default_tolerance(precision)
    scale = max(1.0, float(np.sqrt(np.mean(expected.astype(np.float64) ** 2))))
    assert np.all(np.abs(got - expected) <= atol * scale + rtol * np.abs(expected))
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error > 1e-6, "the run moved by no rounding at all: was it in FP32?"
