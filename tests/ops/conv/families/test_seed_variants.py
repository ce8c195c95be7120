"""The seeds' single-step optimisations as Conv variant families: `unrolled`
(__restrict__ + unrolled loops over the plain `baseline`), `tiled` (shared-memory
input tiles), `reduce_tree` and `reduce_atomic` (input channels split over threads).

CPU tests: names, configurations, reasons, launch geometry (with a recording
stand-in for the CUDA function). GPU tests (`gpu` marker): what is particular to
these kernels: tiles at ragged edges, uneven channel slices, the atomic
variant's output initialisation, determinism, run-time weights.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opplugin.core import paths
from opplugin.errors import PluginError
from opplugin.ops.conv import families
from opplugin.ops.conv.families.base import BLOCK
from opplugin.ops.conv.families.reduction import SlicedKernel, SlicesConfig
from opplugin.ops.conv.families.tiled import TiledConfig, TiledKernel
from onnx_builders import conv_spec as conv
from conv_problems import assert_close, device_inputs, expected_output, poisoned_output, random_problem

SEED_FAMILIES = ("unrolled", "tiled", "reduce_tree", "reduce_atomic")
LENET_CONV1 = conv(10000, 1, 4, (86, 86), (7, 7))
LENET_CONV2 = conv(10000, 4, 16, (40, 40), (7, 7))
ECE408_CONV = conv(10000, 1, 50, (28, 28), (5, 5))


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


# ---- CPU: registry, names, reasons ----


def test_families_are_registered_in_the_seeds_order():
    assert families.FAMILY_MODULES[:4] == ("direct", "unrolled", "tiled", "reduction")
    for name in SEED_FAMILIES:
        family = families.FAMILIES[name]
        assert family.exact and family.summary
        assert family.constant_weights == (name != "unrolled")
    assert families.family_of("tiled_b8x32").name == "tiled"
    assert families.family_of("reduce_tree_c4").name == "reduce_tree"
    assert families.family_of("reduce_atomic_c2").name == "reduce_atomic"


def test_unrolled_serves_run_time_weights_like_the_baseline():
    spec = conv(1, 64, 64, (10, 10), (3, 3), pads=(1, 1, 1, 1))  # 147 KiB of filters: no constant memory
    assert families.unsupported_reason(spec, "unrolled", None) is None
    assert "64 KiB" in families.unsupported_reason(spec, "tiled", ones(spec))


def test_baseline_is_the_plain_kernel_and_unrolled_adds_exactly_restrict_and_unrolling():
    baseline = paths.kernel_source("conv_baseline.cu")
    unrolled = paths.kernel_source("conv_unrolled.cu")
    code = lambda source: "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    assert "__restrict__" not in code(baseline)
    assert code(baseline).count("#pragma unroll 1") == 3 and code(baseline).count("#pragma unroll") == 3
    assert code(unrolled).count("__restrict__") >= 4 and "#pragma unroll 1" not in code(unrolled)
    # the same arithmetic in the same order: only the pragmas differ
    body = lambda source: [line for line in code(source).split("float acc = 0.0f;")[1].splitlines() if "#pragma" not in line]
    assert body(baseline) == body(unrolled)


@pytest.mark.parametrize("spec", [LENET_CONV1, LENET_CONV2, ECE408_CONV], ids=["lenet86.conv1", "lenet86.conv2", "ece408"])
def test_configuration_lists_are_short_and_valid(spec):
    for name in SEED_FAMILIES:
        configs = families.FAMILIES[name].configs(spec)
        assert len(configs) <= 4
        for config in configs:
            assert families.unsupported_reason(spec, config, ones(spec)) is None, config


def test_tiled_prefers_whole_warp_rows_unless_they_overhang_too_far():
    assert families.configure(LENET_CONV1, "tiled").name() == "tiled_b16x16"  # 80 x 80 out: 96 columns of t32 tiles, 20% more
    assert families.configure(LENET_CONV2, "tiled").name() == "tiled_b8x32"  # 34 x 34: 64 x 40 vs 48 x 48, 11% more
    assert families.configure(ECE408_CONV, "tiled").name() == "tiled_b8x32"  # 24 x 24: 32 x 24 vs 32 x 32
    assert [c.name() for c in families.FAMILIES["tiled"].configs(LENET_CONV1)] == ["tiled_b16x16", "tiled_b8x32"]


def test_tiled_limits():
    spec = conv(1, 2, 3, (20, 20), (3, 3))
    assert "tile width" in families.unsupported_reason(spec, "tiled_b16x12", ones(spec))
    assert "tile width" in families.unsupported_reason(spec, "tiled_b2x128", ones(spec))
    assert families.unsupported_reason(spec, "tiled_b32x8", ones(spec)) is None
    assert "not constant" in families.unsupported_reason(spec, "tiled_b16x16", None)
    # stride 8: the input tile of any width is over 48 KiB
    wide = conv(1, 1, 1, (600, 600), (3, 3), strides=(8, 8))
    assert "shared memory" in families.unsupported_reason(wide, "tiled_b8x32", ones(wide))
    assert "shared memory" in families.unsupported_reason(wide, "tiled", ones(wide))
    assert "tiled" not in families.usable_families(wide, ones(wide))


@pytest.mark.parametrize("family", ["reduce_tree", "reduce_atomic"])
def test_one_channel_per_group_has_nothing_to_reduce(family):
    depthwise = conv(1, 8, 8, (19, 21), (3, 3), group=8)
    for spec in (LENET_CONV1, ECE408_CONV, depthwise):
        for variant in (family, f"{family}_c2"):
            assert "nothing to reduce" in families.unsupported_reason(spec, variant, ones(spec))
        with pytest.raises(PluginError, match="nothing to reduce"):
            families.configure(spec, family)  # no configuration to stand for
        assert family not in families.usable_families(spec, ones(spec))
        assert not any(c.family == family for c in families.tuning_configs(spec, ones(spec)))


@pytest.mark.parametrize("family", ["reduce_tree", "reduce_atomic"])
def test_slice_counts(family):
    configs = lambda c, g=1: [config.name() for config in families.FAMILIES[family].configs(conv(1, c, 2 * g, (9, 9), (3, 3), group=g))]
    assert configs(4) == [f"{family}_c2", f"{family}_c4"]  # fewest slices first
    assert configs(3) == [f"{family}_c2"]  # 2 channels + 1
    assert configs(16) == [f"{family}_c2", f"{family}_c4", f"{family}_c8"]
    assert configs(8, g=4) == [f"{family}_c2"]  # 2 channels a group
    assert families.configure(LENET_CONV2, family).name() == f"{family}_c2"
    spec = conv(1, 3, 4, (9, 9), (3, 3))
    assert "idle" in families.unsupported_reason(spec, f"{family}_c4", ones(spec))
    big = conv(1, 32, 4, (9, 9), (3, 3))
    assert "one of 2, 4, 8" in families.unsupported_reason(big, f"{family}_c16", ones(big))


def test_atomic_variant_initialises_its_output_in_its_own_launch_sequence():
    units = families.compile_units(LENET_CONV2, "reduce_atomic_c2")
    assert [u.function for u in units] == ["conv_reduce_atomic_init", "conv_reduce_atomic"]
    assert units[0].defines == units[1].defines and units[0].defines["SL"] == 2
    [tree] = families.compile_units(LENET_CONV2, "reduce_tree_c4")
    assert tree.defines["SL"] == 4 and tree.defines["UNROLL_K"] == 1  # one channel per slice
    [tree] = families.compile_units(LENET_CONV2, "reduce_tree")
    assert tree.defines["SL"] == 2 and tree.defines["UNROLL_K"] == 2  # both passes unrolled


class RecordingFunction:
    """Stands in for a CuPy kernel function: records (grid, block, args) per launch."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, grid, block, args):
        self.calls.append((self, grid, block, args))


def test_tiled_launch_geometry_covers_ragged_edges():
    spec = conv(3, 2, 5, (37, 71), (3, 3))  # 35 x 69 out
    calls = []
    kernel = TiledKernel(spec, TiledConfig("tiled", (8, 32)), RecordingFunction(calls))
    kernel._launch("x", (), "y", 3)
    [(_, grid, block, args)] = calls
    assert block == (32, 8, 1) and grid == (3 * 5 * 3, 5, 1)  # ceil(35/8) x ceil(69/32) tiles per image
    assert args[:2] == ("x", "y") and int(args[2]) == 3


def test_atomic_launch_sets_the_output_before_adding_into_it():
    spec = conv(3, 4, 6, (12, 12), (3, 3))  # 10 x 10 out
    calls = []
    init, summed = RecordingFunction(calls), RecordingFunction(calls)
    SlicedKernel(spec, SlicesConfig("reduce_atomic", 4), summed, init=init)._launch("x", (), "y", 3)
    assert [c[0] for c in calls] == [init, summed]
    assert calls[0][1:3] == ((-(-300 // BLOCK), 6, 1), (BLOCK, 1, 1)) and calls[0][3][0] == "y"
    assert calls[1][1:3] == ((-(-300 // 64), 6, 1), (64, 4, 1)) and calls[1][3][:2] == ("x", "y")


# ---- GPU ----

RAGGED = {
    # output sizes that no tile width divides, image smaller than a tile, strides, dilations, pads
    "ragged_stride_dilation": conv(3, 2, 3, (37, 71), (3, 5), strides=(2, 1), pads=(1, 2, 0, 1), dilations=(1, 2)),
    "image_smaller_than_a_tile": conv(2, 1, 2, (5, 7), (3, 3)),
    "stride3_no_pads_ragged": conv(2, 3, 4, (50, 41), (4, 4), strides=(3, 3), bias=False),
    "groups_pads_odd": conv(2, 6, 4, (19, 33), (3, 3), pads=(2, 1, 1, 2), group=2),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["tiled_b32x8", "tiled_b16x16", "tiled_b8x32", "tiled_b4x64"])
@pytest.mark.parametrize("case", list(RAGGED))
def test_tiles_at_ragged_edges(case, variant):
    spec = RAGGED[case]
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, variant, (w, b))
    [y] = kernel(device_inputs(x, w, b), None, out=poisoned_output(spec))
    assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} on {case} (seed {seed})")


UNEVEN = conv(2, 13, 5, (9, 10), (3, 3), pads=(1, 0, 0, 1))  # 13 channels: every slice count leaves a short pass


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["reduce_tree_c2", "reduce_tree_c4", "reduce_tree_c8", "reduce_atomic_c8"])
def test_uneven_channel_slices(variant):
    seed, x, w, b = random_problem(UNEVEN)
    kernel = families.build_kernel(UNEVEN, variant, (w, b))
    [y] = kernel(device_inputs(x, w, b), None, out=poisoned_output(UNEVEN))
    assert_close(y, expected_output(UNEVEN, x, w, b), f"{kernel.name} (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [True, False])
def test_atomic_output_is_initialised_on_every_call(bias):
    import cupy

    spec = conv(3, 4, 6, (15, 14), (3, 3), pads=(1, 1, 1, 1), bias=bias)
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, "reduce_atomic_c2", (w, b))
    expected = expected_output(spec, x, w, b)
    out = cupy.full(spec.output_shape(), 1e6, dtype=cupy.float32)  # stale values must not leak in
    inputs = device_inputs(x, w, b)
    for _ in range(3):  # the same output again: nothing may accumulate across calls
        [y] = kernel(inputs, None, out=out)
        assert_close(y, expected, f"call on a used output (bias {bias}, seed {seed})")


@pytest.mark.gpu
def test_atomic_init_and_sum_run_on_the_callers_stream():
    import cupy

    spec = conv(64, 4, 16, (40, 40), (7, 7))
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, "reduce_atomic_c4", (w, b))
    inputs = device_inputs(x, w, b)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    out = poisoned_output(spec)
    cupy.cuda.Device().synchronize()
    [y] = kernel(inputs, stream, out=out)
    stream.synchronize()
    assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} on a side stream (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["tiled_b16x16", "reduce_tree_c2", "reduce_atomic_c4"])
def test_batch_is_a_run_time_argument(variant):
    spec = dataclasses.replace(conv(6, 4, 16, (40, 40), (7, 7)), batch=6)
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, variant, (w, b))
    for batch in (1, 5, 6):
        [y] = kernel(device_inputs(x[:batch], w, b), None, out=poisoned_output(spec, batch))
        assert_close(y, expected_output(spec, x[:batch], w, b), f"{kernel.name}, batch {batch} (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["unrolled", "tiled_b8x32", "reduce_tree_c4"])
def test_deterministic_variants_repeat_bit_for_bit(variant):
    import cupy

    spec = conv(8, 4, 16, (40, 40), (7, 7))
    _, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, variant, (w, b))
    inputs = device_inputs(x, w, b)
    first = cupy.asnumpy(kernel(inputs)[0])
    assert np.array_equal(first, cupy.asnumpy(kernel(inputs)[0]))


@pytest.mark.gpu
def test_unrolled_matches_the_plain_baseline_bit_for_bit_and_reads_weights_per_call():
    import cupy

    spec = conv(4, 3, 8, (17, 23), (3, 3), strides=(2, 2), pads=(1, 0, 2, 1))
    unrolled = families.build_kernel(spec, "unrolled", None)
    baseline = families.build_kernel(spec, "baseline", None)
    for _ in range(2):  # new weights each call
        seed, x, w, b = random_problem(spec)
        inputs = device_inputs(x, w, b)
        [y] = unrolled(inputs, None, out=poisoned_output(spec))
        assert_close(y, expected_output(spec, x, w, b), f"unrolled, run-time weights (seed {seed})")
        # same multiply-adds in the same order: unrolling and __restrict__ change no result bit
        assert np.array_equal(cupy.asnumpy(y), cupy.asnumpy(baseline(inputs)[0])), f"seed {seed}"
