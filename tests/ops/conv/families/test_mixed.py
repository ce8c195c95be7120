"""The reduced-precision and tensor-core variants (fp16, tf32, 3xtf32): opt-in only.

CPU: their names, limits and stated accuracy, and that neither the heuristic nor
tuning ever picks them. GPU (`gpu` marker): each against the float64 reference
within the bound its family states, on the shipped convs and on odd shapes,
with fresh random inputs and the output poisoned with NaN first.
"""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config
from opplugin.ops.conv.families import fp16
from opplugin.ops.conv.families.base import constant_bytes
from opplugin.ops.conv.epilogue import NONE, Epilogue
from onnx_builders import conv_spec as conv
from conv_problems import CASES as FP32_CASES
from conv_problems import expected_output, random_problem


INEXACT = ("fp16", "tf32", "3xtf32")

SHIPPED = {
    "lenet86.conv1": conv(10000, 1, 4, (86, 86), (7, 7)),
    "lenet86.conv2": conv(10000, 4, 16, (40, 40), (7, 7)),
    "ece408_high.conv": conv(10000, 1, 50, (28, 28), (5, 5)),
}

# the FP32 suite's cases (shipped shapes at small batches, then the semantics the
# kernels must also cover), plus a 1x1 kernel with more maps than one MMA tile
CASES = {**FP32_CASES, "pointwise_m20": conv(3, 7, 20, (5, 5), (1, 1))}


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


# ---- CPU ----


def test_the_families_are_registered_and_inexact():
    for name in INEXACT:
        family = families.FAMILIES[name]
        assert family.exact is False
        assert 0 < family.expected_relative_error < family.max_relative_error
    # 3xTF32 is held to the bar of the FP32-exact variants, yet stays opt-in by its name
    assert families.FAMILIES["3xtf32"].max_relative_error <= 1e-5
    assert families.FAMILIES["fp16"].max_relative_error <= 5e-3


@pytest.mark.parametrize("shape", list(SHIPPED))
def test_neither_the_heuristic_nor_tuning_picks_them(shape):
    spec = SHIPPED[shape]
    weights = ones(spec)
    for epilogue in (NONE, Epilogue("Relu", (2, 2))):
        assert not set(INEXACT) & set(families.usable_families(spec, weights, epilogue))
        assert not any(families.family_of(v).name in INEXACT for v in families.tuning_configs(spec, weights, epilogue))
        assert families.family_of(heuristic_config(spec, weights, epilogue)).exact
    # asked for explicitly, all three run the plain conv
    assert set(INEXACT) <= set(families.usable_families(spec, weights, NONE, exact_only=False))


@pytest.mark.parametrize("shape", list(SHIPPED))
def test_at_most_three_configurations_each_and_all_compile_units_resolve(shape):
    spec = SHIPPED[shape]
    for name in INEXACT:
        configs = families.FAMILIES[name].configs(spec)
        assert 1 <= len(configs) <= 3 and len(set(configs)) == len(configs)
        assert families.configure(spec, name) == configs[0]
        for variant in configs:
            assert families.family_of(variant).name == name
            assert families.unsupported_reason(spec, variant, ones(spec)) is None
            [unit] = families.compile_units(spec, variant)
            assert unit.defines["C"] == spec.in_channels


def test_configured_names():
    assert families.configure(SHIPPED["lenet86.conv2"], "fp16").name() == "fp16_m16"
    assert families.configure(SHIPPED["lenet86.conv2"], "tf32").name() == "tf32_n4"
    assert families.configure(SHIPPED["lenet86.conv2"], "3xtf32").name() == "3xtf32_n2"  # 25 k-steps x 3 MMAs: fewer pixel tiles
    assert families.configure(SHIPPED["ece408_high.conv"], "tf32").name() == "tf32_n4"  # 4 map tiles: 64 accumulators
    assert families.family_of("3xtf32_n8").name == "3xtf32"
    assert families.family_of("tf32_n8").name == "tf32"
    assert families.family_of("fp16_m5").name == "fp16"


def test_tensor_core_variants_decline_groups_and_oversized_weights():
    grouped = CASES["group2_stride2"]
    for name in ("tf32", "3xtf32"):
        assert "group=1 only" in families.unsupported_reason(grouped, name, ones(grouped))
    assert families.unsupported_reason(grouped, "fp16", ones(grouped)) is None
    assert "one group" in families.unsupported_reason(grouped, "fp16_m4", ones(grouped))  # 2 maps a group
    big = conv(1, 64, 64, (10, 10), (3, 3), pads=(1, 1, 1, 1))  # 147 KiB of filters
    for name in ("tf32", "3xtf32"):
        assert "shared memory" in families.unsupported_reason(big, name, ones(big))
    assert "64 KiB" in families.unsupported_reason(big, "fp16", ones(big))


def test_fp16_needs_constant_weights_but_tensor_cores_read_them_at_call_time():
    spec = CASES["lenet86.conv2"]
    assert "not constant" in families.unsupported_reason(spec, "fp16", None)
    assert families.unsupported_reason(spec, "tf32", None) is None
    assert families.unsupported_reason(spec, "3xtf32", None) is None
    assert "epilogue" in families.unsupported_reason(spec, "tf32", None, Epilogue("Relu", (2, 2)))


def test_fp16_filters_are_half2_pairs_the_size_of_the_fp32_bank():
    w = np.array([[[[1.0, -2.0], [0.5, 65504.0]]]], np.float32)  # [1][1][2][2]
    pairs = fp16.half2_pairs(w)
    assert pairs.dtype == np.uint32 and pairs.shape == (1, 2, 2, 1)
    assert [hex(int(p)) for p in pairs.ravel()] == ["0x3c003c00", "0xc000c000", "0x38003800", "0x7bff7bff"]
    spec = CASES["lenet86.conv2"]
    assert pairs.itemsize * int(np.prod(spec.weight_shape)) + 4 * spec.out_channels == constant_bytes(spec)


# ---- GPU ----


def relative_l2(spec, x, w, b, got) -> float:
    import cupy

    got = cupy.asnumpy(got)
    assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} of {got.size} output elements were never written"
    expected = expected_output(spec, x, w, b)
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def run_variant(spec, variant, x, w, b, *, weights_at_build=True):
    import cupy

    kernel = families.build_kernel(spec, variant, (w, b) if weights_at_build else None)
    out = cupy.full(kernel.output_shape(spec.batch), cupy.nan, dtype=cupy.float32)
    inputs = [cupy.asarray(a) for a in (x, w, b) if a is not None]
    [y] = kernel(inputs, None, out=out)
    assert y is out
    return kernel, y


VARIANTS = [*INEXACT, "fp16_m4", "tf32_n8", "3xtf32_n8", "tc_tf32", "tc_tf32_b64x64x32_w32x32_s3_k4", "tc_fp16", "tc_bf16", "tc_bf16_b32x64x32_w32x16_s3_k2"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
def test_error_within_the_stated_bound(case, variant):
    spec = CASES[case]
    seed, x, w, b = random_problem(spec)
    reason = families.unsupported_reason(spec, variant, (w, b))
    if reason:
        pytest.skip(reason)
    kernel, y = run_variant(spec, variant, x, w, b)
    error = relative_l2(spec, x, w, b, y)
    bound = families.family_of(variant).max_relative_error
    assert error <= bound, f"{kernel.name} on {case} (seed {seed}): relative L2 error {error:.3g} > {bound}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tf32", "3xtf32"])
def test_tensor_cores_take_new_weights_on_every_call(name):
    spec = CASES["dilation2_m64"]
    for _ in range(2):
        seed, x, w, b = random_problem(spec)
        kernel, y = run_variant(spec, name, x, w, b, weights_at_build=False)
        error = relative_l2(spec, x, w, b, y)
        assert error <= kernel_bound(name), f"{kernel.name}, run-time weights (seed {seed}): {error:.3g}"


def kernel_bound(name: str) -> float:
    return families.FAMILIES[name].max_relative_error


@pytest.mark.gpu
@pytest.mark.parametrize("name", INEXACT)
def test_kernel_names_say_the_configuration(name):
    spec = CASES["lenet86.conv2"]
    _, _, w, b = random_problem(spec)
    assert families.build_kernel(spec, name, (w, b)).name == f"conv.{families.configure(spec, name)}"
