"""The CUDA Conv variants against the float64 numpy reference, and their contract.

GPU tests carry the `gpu` marker and skip without a CUDA device. Every run draws
fresh random inputs, weights and biases (the seed is in the failure message),
and poisons the output with NaN first, so an element the kernel never writes
fails the test. The unsupported_reason tests at the end run on the CPU.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opplugin.ops.conv import families
from onnx_builders import conv_spec as conv
from opplugin.ops.conv.spec import ConvSpec
from opplugin.ops.conv.families import Config
from opplugin.ops.conv.families.base import GridKernel
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.errors import PluginError
from conv_problems import CASES, MAX_RELATIVE_L2, assert_close, device_inputs, expected_output, poisoned_output, random_problem


# the plain names plus explicit configurations: 3 maps leave a short last group for most M
# FP32-exact families only: fp16/tf32 are held to their own bounds in ops/conv/families/test_mixed.py
EXACT = [name for name, family in families.FAMILIES.items() if family.exact]
VARIANTS = [*EXACT, "const_mo_m1", "const_mo_m3", "const_rb_t2x1_m1", "const_rb_t8x1_m4", "const_rb_t16x1_m3", "im2col_gemm_64x64", "implicit_gemm_4x1024", "implicit_gemm_128x64", "tiled_b32x8", "tiled_b16x16", "tiled_b8x32", "tiled_b4x64", "reduce_tree_c2", "reduce_tree_c4", "reduce_tree_c8", "reduce_atomic_c2", "reduce_atomic_c4", "reduce_atomic_c8",
            "tc_3xtf32_b128x128x32_w64x32_s3", "tc_3xtf32_b64x128x32_w32x64_s3", "tc_3xtf32_b32x64x32_w32x16_s3", "tc_3xtf32_b64x64x32_w32x32_s3_k4", "tc_3xtf32_b128x64x32_w64x32_s3_k16",
            "tc_3xtf32_b128x64x32_w64x32_s3_k3", "tc_3xtf32_b64x64x32_w32x32_s3_k5",
            "wg_3xtf32_b128x128x32_s3", "wg_3xtf32_b64x128x32_s3", "wg_3xtf32_b128x64x32_s3", "wg_3xtf32_b64x64x32_s3_k4",
            "wg_3xtf32_b128x128x32_s3_k3",
            "simt_gemm_b128x128x16_t8x8_s4_o1", "simt_gemm_b64x128x16_t8x8_s4_o3", "simt_gemm_b64x64x16_t8x4_s4_o4", "simt_gemm_b32x64x16_t4x4_s4_o4", "simt_gemm_b64x64x16_t8x4_s4_o4_k4", "simt_gemm_b128x64x16_t8x8_s4_o3_k16",
            "simt_gemm_b16x128x16_t2x8_s4_o4", "simt_gemm_b16x64x16_t2x4_s4_o4_k2", "simt_gemm_b8x128x16_t1x8_s4_o4",
            "depthwise_t1x1_b4x8_p4", "depthwise_t4x4_b16x32_p1", "depthwise_t2x4_b8x8_p2", "grouped_t1x1_b4x8_p2", "grouped_t2x4_b8x8_p4"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
def test_variant_matches_float64_reference(case, variant):
    spec = CASES[case]
    seed, x, w, b = random_problem(spec)
    reason = families.unsupported_reason(spec, variant, (w, b))
    if reason:
        pytest.skip(reason)
    kernel = families.build_kernel(spec, variant, (w, b))
    out = poisoned_output(spec)

    [y] = kernel(device_inputs(x, w, b), None, out=out)

    assert y is out
    assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} on {case} (seed {seed})")


# Conv -> activation -> max pool chains a fusing family runs in one kernel: the
# shipped ones, a window wider than tall, pads, and a conv output the pool's
# windows do not tile (floor mode drops the last row and column).
FUSED_CASES = {
    "lenet86.conv1+relu+pool2": (CASES["lenet86.conv1"], Epilogue("Relu", (2, 2))),
    "lenet86.conv2+relu+pool4": (CASES["lenet86.conv2"], Epilogue("Relu", (4, 4))),
    "ece408_high.conv+tanh+pool2": (CASES["ece408_high.conv"], Epilogue("Tanh", (2, 2))),
    "pads_pool2x4_no_bias": (conv(3, 3, 8, (17, 23), (3, 3), pads=(1, 2, 0, 1), bias=False), Epilogue("Relu", (2, 4))),
    "ragged_pool2_group2": (conv(5, 4, 6, (15, 15), (3, 3), group=2), Epilogue("Tanh", (2, 2))),
    # an activation alone (the tensor-core GEMM fuses no pool), also after split K
    "relu_only_k333": (conv(2, 37, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)), Epilogue("Relu")),
    "tanh_only_deep_k": (conv(1, 160, 96, (7, 7), (3, 3), pads=(1, 1, 1, 1)), Epilogue("Tanh")),
    "relu_only_c64_tails": (conv(2, 64, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)), Epilogue("Relu")),
}
# every fusing family by its plain name, plus tiles that pool within a thread,
# across 2 and 4 lanes, and in both at once
FUSED_VARIANTS = [
    *(name for name, family in families.FAMILIES.items() if family.fuses and family.exact),
    "const_tile_t4x4_m4", "const_tile_t2x2_m16", "const_tile_t1x4_m8", "const_tile_t2x1_m4", "const_tile_t4x1_m2",
    "tc_3xtf32_b64x64x32_w32x32_s3_k4", "simt_gemm_b64x64x16_t8x4_s4_o4_k4", "wg_3xtf32_b64x64x32_s3_k4",
]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FUSED_VARIANTS)
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_epilogue_matches_float64_reference(case, variant):
    spec, epilogue = FUSED_CASES[case]
    seed, x, w, b = random_problem(spec)
    reason = families.unsupported_reason(spec, variant, (w, b), epilogue)
    if reason:
        pytest.skip(reason)
    kernel = families.build_kernel(spec, variant, (w, b), epilogue)
    out = poisoned_output(spec).reshape(-1)[: int(np.prod(kernel.output_shape(spec.batch)))].reshape(kernel.output_shape(spec.batch))

    [y] = kernel(device_inputs(x, w, b), None, out=out)

    assert y is out
    assert_close(y, expected_output(spec, x, w, b, epilogue), f"{kernel.name} on {case} (seed {seed})")


@pytest.mark.gpu
def test_vector_loads_and_stores_take_misaligned_arrays():
    """const_tile reads and writes rows as float4 where the shape allows; arrays that
    start off a 16-byte boundary (views one float in) still give the right answer."""
    import cupy

    spec = conv(3, 1, 8, (20, 20), (5, 5))  # 16 x 16 outputs: 4-wide tiles, float4 rows
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, "const_tile_t2x4_m8", (w, b))
    assert kernel.alignment == 16
    shifted_x = cupy.empty(x.size + 1, dtype=cupy.float32)[1:].reshape(x.shape)
    shifted_x[...] = cupy.asarray(x)
    out = cupy.full(int(np.prod(spec.output_shape())) + 1, cupy.nan, dtype=cupy.float32)[1:].reshape(spec.output_shape())

    [y] = kernel([shifted_x], None, out=out)

    assert y is out
    assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} on misaligned arrays (seed {seed})")


DENSE_LAYER = conv(3, 20, 12, (7, 7), (7, 7))  # the filter covers the whole map: one output per map and image


@pytest.mark.gpu
@pytest.mark.parametrize("variant", EXACT)
def test_new_output_on_a_side_stream(variant):
    import cupy

    # the depthwise and grouped families run grouped layers only, the dense ones dense layers (a filter over
    # the whole map), wg_3xtf32 groups of 32 channels
    cases = [CASES[case] for case in ("stride2_asym_pads_odd", "depthwise_dilation2", "group2_stride2", "c32_stride2_odd_pads_m70")]
    cases += [DENSE_LAYER]
    spec = next(spec for spec in cases if families.unsupported_reason(spec, variant, random_problem(spec)[2:]) is None)
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, variant, (w, b))
    stream = cupy.cuda.Stream(non_blocking=True)
    inputs = device_inputs(x, w, b)
    cupy.cuda.Device().synchronize()  # the inputs were copied on the default stream

    [y] = kernel(inputs, stream)
    stream.synchronize()

    assert y.shape == spec.output_shape() and y.dtype == cupy.float32 and y.flags.c_contiguous
    assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} on a side stream (seed {seed})")


@pytest.mark.gpu
def test_batch_is_a_run_time_argument():
    spec = dataclasses.replace(CASES["lenet86.conv2"], batch=6)
    seed, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, "const_mo", (w, b))
    for batch in (1, 5, 6):
        out = poisoned_output(spec, batch)
        [y] = kernel(device_inputs(x[:batch], w, b), None, out=out)
        assert_close(y, expected_output(spec, x[:batch], w, b), f"batch {batch} (seed {seed})")


@pytest.mark.gpu
def test_baseline_reads_weights_at_call_time():
    spec = CASES["dilation2_m64"]
    kernel = families.build_kernel(spec, "baseline", None)
    for _ in range(2):  # new weights each call: nothing may be cached from the first
        seed, x, w, b = random_problem(spec)
        [y] = kernel(device_inputs(x, w, b), None, out=poisoned_output(spec))
        assert_close(y, expected_output(spec, x, w, b), f"run-time weights (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["const", "const_mo"])
def test_nodes_of_one_shape_keep_their_own_constant_weights(variant):
    spec = CASES["lenet86.conv1"]
    first, second = random_problem(spec), random_problem(spec)
    kernels = [families.build_kernel(spec, variant, (w, b)) for _, _, w, b in (first, second)]
    # run after both uploads: a shared module would hold the second node's filters
    for kernel, (seed, x, w, b) in zip(kernels, (first, second)):
        [y] = kernel(device_inputs(x, w, b), None, out=poisoned_output(spec))
        assert_close(y, expected_output(spec, x, w, b), f"{kernel.name}, node weights (seed {seed})")


@pytest.mark.gpu
def test_kernel_names_say_the_variant():
    spec = CASES["lenet86.conv1"]
    _, _, w, b = random_problem(spec)
    names = {v: families.build_kernel(spec, v, (w, b)).name for v in ("baseline", "const", "const_mo", "const_mo_m2")}
    assert names == {
        "baseline": "conv.baseline",
        "const": "conv.const",
        "const_mo": f"conv.const_mo_m{families.default_maps_per_thread(4)}",
        "const_mo_m2": "conv.const_mo_m2",
    }


@pytest.mark.gpu
def test_filters_over_64_kib_leave_only_the_baseline():
    spec = conv(2, 64, 64, (10, 10), (3, 3), pads=(1, 1, 1, 1))  # 147 KiB of filters
    seed, x, w, b = random_problem(spec)
    offered = families.usable_families(spec, (w, b))
    assert "baseline" in offered and not any(families.FAMILIES[v].constant_weights for v in offered)
    with pytest.raises(PluginError, match="64 KiB"):
        families.build_kernel(spec, "const", (w, b))
    for variant in offered:
        kernel = families.build_kernel(spec, variant, (w, b))
        [y] = kernel(device_inputs(x, w, b), None, out=poisoned_output(spec))
        assert_close(y, expected_output(spec, x, w, b), f"{kernel.name} with large filters (seed {seed})")


@pytest.mark.gpu
def test_bad_inputs_raise_plugin_errors():
    import cupy

    spec = CASES["lenet86.conv1"]
    _, x, w, b = random_problem(spec)
    kernel = families.build_kernel(spec, "baseline", None)
    good = device_inputs(x, w, b)
    with pytest.raises(PluginError, match="shape"):
        kernel([cupy.zeros((2, 3, 86, 86), cupy.float32), *good[1:]])  # wrong C
    with pytest.raises(PluginError, match="shape"):
        kernel([cupy.zeros((2, 1, 85, 86), cupy.float32), *good[1:]])  # wrong H
    with pytest.raises(PluginError, match="float32"):
        kernel([good[0].astype(cupy.float64), *good[1:]])
    with pytest.raises(PluginError, match="CuPy"):
        kernel([x, *good[1:]])  # numpy input
    with pytest.raises(PluginError, match="weights"):
        kernel([good[0], good[1][:, :, :5]])
    with pytest.raises(PluginError, match="output"):
        kernel(good, None, out=cupy.empty((2, 4, 80, 79), cupy.float32))
    [empty] = kernel([cupy.empty((0, 1, 86, 86), cupy.float32), *good[1:]])
    assert empty.shape == (0, 4, 80, 80)


# ---- unsupported_reason and naming: CPU only ----

WEIGHTS_3x3 = (np.ones((8, 4, 3, 3), np.float32), np.ones(8, np.float32))
WEIGHTS_1x4 = (np.ones((4, 1, 7, 7), np.float32), np.ones(4, np.float32))


def test_group_and_depthwise_run_on_cuda_variants():
    for group, maps in ((2, 8), (4, 4)):
        spec = ConvSpec(1, 4, maps, (10, 10), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), group, True)
        weights = (np.ones(spec.weight_shape, np.float32), np.ones(maps, np.float32))
        for variant in ("baseline", "const", "const_mo", "const_rb"):
            assert families.unsupported_reason(spec, variant, weights) is None, (group, variant)
    spec = ConvSpec(1, 4, 8, (10, 10), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), 2, True)
    weights = (np.ones(spec.weight_shape, np.float32), np.ones(8, np.float32))
    assert "one group" in families.unsupported_reason(spec, "const_mo_m3", weights)  # 3 does not divide 4 maps a group


def test_only_2d_convolution_is_supported():
    spec = ConvSpec(1, 4, 8, (10,), (3,), (1,), (1,), (0, 0), 1, False)
    for variant in families.VARIANTS:
        assert "2-D" in families.unsupported_reason(spec, variant, (np.ones((8, 4, 3), np.float32), None))


def test_constant_variants_need_constant_weights():
    spec = conv(1, 4, 8, (10, 10), (3, 3))
    assert families.unsupported_reason(spec, "baseline", None) is None
    for variant in ("const", "const_mo", "const_mo_m4"):
        assert "not constant" in families.unsupported_reason(spec, variant, None)
        assert families.unsupported_reason(spec, variant, WEIGHTS_3x3) is None


def test_constant_variants_are_not_offered_past_64_kib():
    spec = conv(1, 64, 64, (10, 10), (3, 3))
    weights = (np.ones(spec.weight_shape, np.float32), np.ones(64, np.float32))
    assert families.unsupported_reason(spec, "baseline", weights) is None
    for variant in ("const", "const_mo", "const_mo_m8"):
        assert "64 KiB" in families.unsupported_reason(spec, variant, weights)
    # exactly 64 KiB of filters leaves no room for the bias
    spec = conv(1, 16, 64, (10, 10), (4, 4), bias=True)
    assert "64 KiB" in families.unsupported_reason(spec, "const", (np.ones(spec.weight_shape, np.float32), None))
    spec = conv(1, 16, 64, (10, 10), (4, 4), bias=False)
    assert families.unsupported_reason(spec, "const", (np.ones(spec.weight_shape, np.float32), None)) is None


def test_maps_per_thread_must_fit_the_node():
    spec = conv(1, 4, 8, (10, 10), (3, 3))
    assert families.unsupported_reason(spec, "const_mo_m8", WEIGHTS_3x3) is None
    assert "maps per thread" in families.unsupported_reason(spec, "const_mo_m16", WEIGHTS_3x3)
    assert "maps per thread" in families.unsupported_reason(spec, "const_mo_m0", WEIGHTS_3x3)


def test_unknown_variants():
    spec = conv(1, 4, 8, (10, 10), (3, 3))
    assert "unknown" in families.unsupported_reason(spec, "winograd", WEIGHTS_3x3)
    with pytest.raises(PluginError, match="unknown"):
        families.build_kernel(spec, "winograd", WEIGHTS_3x3)


def test_variant_names_and_default_maps_per_thread():
    assert families.family_of("const_mo_m8").name == "const_mo"
    assert families.family_of("const_rb_t8x1_m4").name == "const_rb"
    assert [families.default_maps_per_thread(m) for m in (1, 4, 16, 50, 64, 17)] == [1, 4, 16, 10, 16, 8]
    assert families.configure(conv(1, 1, 4, (86, 86), (7, 7)), "const_mo").name() == "const_mo_m4"
    assert families.configure(conv(1, 1, 50, (28, 28), (5, 5)), "const_mo_m5").name() == "const_mo_m5"
    assert families.configure(conv(1, 1, 4, (86, 86), (7, 7)), "const_rb").name() == "const_rb_t4x1_m4"


def test_fused_tiles_cover_whole_pool_windows():
    spec = conv(1, 1, 4, (86, 86), (7, 7))
    pooled = Epilogue("Relu", (2, 2))
    assert "pool" in families.unsupported_reason(spec, "const_rb_t3x1_m4", WEIGHTS_1x4, pooled)
    assert families.unsupported_reason(spec, "const_rb_t4x1_m4", WEIGHTS_1x4, pooled) is None
    assert "epilogue" in families.unsupported_reason(spec, "const_mo", WEIGHTS_1x4, pooled)
    configs = [c for c in families.tuning_configs(spec, WEIGHTS_1x4, pooled) if c.family == "const_rb"]
    assert configs and all(c.rows % 2 == 0 for c in configs)


def test_tiles_cover_pool_windows_or_split_them_over_a_power_of_2_lanes():
    spec = conv(1, 1, 4, (86, 86), (7, 7))
    pool2, pool3 = Epilogue("Relu", (2, 2)), Epilogue("Relu", (3, 3))
    assert families.unsupported_reason(spec, "const_tile_t4x2_m4", WEIGHTS_1x4, pool2) is None  # within a thread
    assert families.unsupported_reason(spec, "const_tile_t1x1_m4", WEIGHTS_1x4, pool2) is None  # over 4 lanes
    assert "pool" in families.unsupported_reason(spec, "const_tile_t3x2_m4", WEIGHTS_1x4, pool2)
    assert "power of 2" in families.unsupported_reason(spec, "const_tile_t1x3_m4", WEIGHTS_1x4, pool3)
    assert families.configure(spec, "const_tile", pool2).name() == "const_tile_t2x4_m4"
    tile = families.FAMILIES["const_tile"]
    assert all(tile.reason(spec, v, pool2) is None for v in tile.configs(spec, pool2))


def test_costs_delegate_to_the_spec():
    spec = conv(10, 4, 16, (40, 40), (7, 7))
    kernel = GridKernel(spec, Config("baseline"), None, threads_per_image=1, grid_y=1, reads_weights=True)
    assert kernel.flops(10000) == spec.flops(10000)
    assert kernel.bytes_moved(3) == spec.bytes_moved(3)
    fused = GridKernel(spec, Config("x"), None, threads_per_image=1, grid_y=1, reads_weights=False, epilogue=Epilogue("Relu", (2, 2)))
    assert fused.output_shape(3) == (3, 16, 17, 17)
    assert fused.bytes_moved(3) == spec.bytes_moved(3) - 4 * 3 * 16 * (34 * 34 - 17 * 17)
    assert fused.flops(3) == spec.flops(3)  # a 2x2 pool reads all 34x34 outputs
    pool4 = GridKernel(spec, Config("x"), None, threads_per_image=1, grid_y=1, reads_weights=False, epilogue=Epilogue("Relu", (4, 4)))
    assert pool4.flops(3) == spec.flops(3) * (32 * 32) // (34 * 34)  # a 4x4 pool reads 32x32 of them


NONFINITE_CASES = ["lenet86.conv2", "pointwise_vectors_k16", "k333_m70_tile_tails", "deep_k_small_output"]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_nan_and_inf_in_the_input_land_where_float64_puts_them(case, variant):
    """+-inf and NaN in x reach exactly the outputs whose windows hold them, as infinities or
    NaN as float64 arithmetic makes them; a kernel that says it cannot (3xTF32, whose runner
    reruns such chunks on an exact variant) still puts them in the right places."""
    spec = CASES[case]
    seed, x, w, b = random_problem(spec)
    reason = families.unsupported_reason(spec, variant, (w, b))
    if reason:
        pytest.skip(reason)
    x[0, 0, 1, 1] = np.inf
    x[-1, -1, -2, -1] = -np.inf
    x[0, -1, 2, 0] = np.nan
    expected = expected_output(spec, x.astype(np.float64), w, b)
    kernel = families.build_kernel(spec, variant, (w, b))
    out = poisoned_output(spec)
    [y] = kernel(device_inputs(x, w, b), None, out=out)
    got = cuda_asnumpy(y)
    context = f"{kernel.name} on {case} (seed {seed})"
    finite = np.isfinite(expected)
    if not kernel.nonfinite_exact:  # 3xTF32: inf - inf in the split makes a NaN of an infinity, in the same places
        assert family_name(variant) in ("tc_3xtf32", "wg_3xtf32"), f"{context} says it is not NaN/Inf-exact"
        assert np.array_equal(np.isfinite(got), finite), f"{context}: NaN or Inf in other places than float64's"
    else:
        assert np.array_equal(np.isnan(got), np.isnan(expected)), f"{context}: NaN in other places than float64's"
        assert np.array_equal(np.isposinf(got), np.isposinf(expected)) and np.array_equal(np.isneginf(got), np.isneginf(expected)), context
    assert finite.any() and not finite.all()
    error = np.linalg.norm(got[finite] - expected[finite]) / np.linalg.norm(expected[finite])
    assert error <= MAX_RELATIVE_L2, f"{context}: relative L2 error {error:.3g} on the finite outputs"


def family_name(variant: str) -> str:
    return families.family_of(variant).name


def cuda_asnumpy(array) -> np.ndarray:
    import cupy

    return cupy.asnumpy(array)
