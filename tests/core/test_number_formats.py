"""The reduced-precision formats (core/number_formats.py): rounding to the nearest value of each, ties to even."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.core.number_formats import REDUCED, UNIT_ROUNDOFF, round_to


def test_rounding_goes_to_the_nearest_value_of_each_format():
    x = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, np.nan, -2.5], np.float32)
    half = round_to(x, "fp16")
    assert half[0] == 1.0 and half[1] == 1 + 2 ** -9  # ties to even, both ways
    assert np.isinf(half[2]) and np.isnan(half[3]) and half[4] == -2.5  # past 65504: infinite
    brain = round_to(np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 70000.0, np.nan], np.float32), "bf16")
    assert brain[0] == 1.0 and brain[1] == 1 + 2 ** -6 and brain[2] == 70144.0 and np.isnan(brain[3])
    tensor = round_to(np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 70000.0, 1 + 2 ** -12], np.float32), "tf32")
    assert tensor[0] == 1.0 and tensor[1] == 1 + 2 ** -9 and tensor[2] == 70016.0 and tensor[3] == 1.0  # FP32's range, 10 bits


@pytest.mark.parametrize("precision", REDUCED)
def test_rounding_moves_a_value_by_at_most_the_unit_roundoff(precision):
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    moved = np.abs(round_to(x, precision) - x) / np.abs(x)
    assert 0 < moved.max() <= UNIT_ROUNDOFF[precision]


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="fp8"):
        round_to(np.ones(2, np.float32), "fp8")
