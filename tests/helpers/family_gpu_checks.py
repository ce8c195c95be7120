"""What the GPU tests of one Conv family at a time share: fresh random operands, and a
configuration's output, poisoned with NaN first, against the float64 reference."""
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
