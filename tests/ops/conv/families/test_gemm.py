"""The GEMM families (im2col_gemm, implicit_gemm): names, limits, tile
geometry and workspace sizing on the CPU; on the GPU, chunked runs and every
tile shape against the float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_builders import conv_spec as conv
from opplugin.ops.conv import families
from opplugin.ops.conv.families import gemm
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.errors import PluginError

LENET1 = conv(10000, 1, 4, (86, 86), (7, 7))
LENET2 = conv(10000, 4, 16, (40, 40), (7, 7))
ECE408 = conv(10000, 1, 50, (28, 28), (5, 5))
FAMILY_NAMES = ("im2col_gemm", "implicit_gemm")


def test_both_families_are_registered_exact_and_read_weights_at_call_time():
    for name in FAMILY_NAMES:
        family = families.FAMILIES[name]
        assert family.exact and not family.constant_weights and not family.fuses
        assert families.unsupported_reason(LENET2, name, None) is None  # no constant weights needed
    assert families.family_of("im2col_gemm_b64x64x8_t4x4").name == "im2col_gemm"
    assert families.family_of("implicit_gemm_b128x64x16_t8x4").name == "implicit_gemm"
    with pytest.raises(PluginError, match="no field '64'"):
        families.family_of("implicit_gemm_64")


@pytest.mark.parametrize(
    ("spec", "tiles"),
    [
        (LENET1, ["4x1024", "4x512"]),
        (LENET2, ["16x256", "16x512", "16x128", "8x512"]),
        (ECE408, ["64x64", "64x128", "64x32", "32x128"]),
    ],
)
def test_configs_fit_the_maps_of_a_group(spec, tiles):
    for name in FAMILY_NAMES:
        configs = families.FAMILIES[name].configs(spec)
        assert [f"{c.bm}x{c.bn}" for c in configs] == tiles and {c.family for c in configs} == {name}
        assert families.configure(spec, name) == configs[0]
        assert all(families.unsupported_reason(spec, c, None) is None for c in configs)


def test_configs_of_a_large_grouped_conv():
    spec = conv(2, 256, 256, (14, 14), (3, 3), pads=(1, 1, 1, 1), group=2)  # 128 maps a group
    assert [c.name() for c in families.FAMILIES["implicit_gemm"].configs(spec)] == [
        "implicit_gemm_b128x32x16_t4x4",
        "implicit_gemm_b128x64x16_t8x4",
        "implicit_gemm_b128x16x16_t4x2",
        "implicit_gemm_b64x64x16_t4x4",
    ]


@pytest.mark.parametrize(
    ("variant", "words"),
    [
        ("implicit_gemm_b3x64x8_t4x4", "powers of 2"),
        ("im2col_gemm_b64x8192x8_t4x4", "powers of 2"),
        ("implicit_gemm_b2x64x8_t1x1", "whole number"),  # half an output per thread
        ("implicit_gemm_b64x512x8_t8x16", "whole number"),  # 128 accumulators per thread
        ("implicit_gemm_b64x64x8_t8x2", "4x4 thread tiles"),  # the thread tile 256 threads take
        ("implicit_gemm_b64x64x17_t4x4", "K step must be 1 to 16"),
    ],
)
def test_tiles_that_cannot_run_say_why(variant, words):
    assert words in families.unsupported_reason(LENET2, variant, None)


def test_no_fused_epilogue():
    for name in FAMILY_NAMES:
        assert "epilogue" in families.unsupported_reason(LENET1, name, None, Epilogue("Relu", (2, 2)))


@pytest.mark.parametrize(("bm", "bn", "tm", "tn"), [(64, 64, 4, 4), (128, 64, 8, 4), (4, 1024, 4, 4), (4, 512, 4, 2), (16, 512, 8, 4)])
def test_thread_tiles_give_256_threads(bm, bn, tm, tn):
    assert gemm.thread_tile(bm, bn) == (tm, tn)
    assert gemm.GemmConfig("implicit_gemm", (bm, bn, 8), (tm, tn)).threads == gemm.THREADS


@pytest.mark.parametrize(("k", "bm", "bn", "bk"), [(49, 64, 64, 13), (196, 16, 256, 14), (9, 64, 64, 9), (1, 64, 64, 1), (49, 4, 1024, 5)])
def test_k_step_avoids_a_padded_tail_within_shared_memory_and_registers(k, bm, bn, bk):
    assert gemm.k_step(k, bm, bn) == bk
    assert bk * (bm + bn) <= gemm.SHARED_FLOATS and bk * bn <= gemm.MAX_PREFETCH * gemm.THREADS


def test_compile_units_carry_the_tile_macros():
    unroll, multiply = families.compile_units(LENET1, "im2col_gemm")
    assert (unroll.source, unroll.function) == ("conv_im2col.cu", "conv_im2col")
    assert (multiply.source, multiply.function) == ("conv_gemm.cu", "conv_gemm")
    [implicit] = families.compile_units(LENET1, "implicit_gemm_b64x64x13_t4x4")
    assert implicit.function == "conv_implicit_gemm"
    assert {k: implicit.defines[k] for k in ("BM", "BN", "BK", "TM", "TN")} == {"BM": 64, "BN": 64, "BK": 13, "TM": 4, "TN": 4}
    assert implicit.defines["C"] == 1 and implicit.defines["KH"] == 7


def _im2col_kernel(spec, budget=gemm.WORKSPACE_BUDGET):
    config = families.configure(spec, "im2col_gemm")
    return gemm.Im2colGemmKernel(spec, config, None, None, workspace_budget=budget)


def test_workspace_is_whole_images_within_the_budget():
    kernel = _im2col_kernel(LENET1)
    image = 4 * 1 * 7 * 7 * 80 * 80  # C*KH*KW rows x OH*OW columns of float32
    assert kernel.image_workspace_bytes() == image
    assert kernel.workspace_bytes(0) == 0
    assert kernel.workspace_bytes(1) == image
    assert kernel.workspace_bytes(10000) == (gemm.WORKSPACE_BUDGET // image) * image <= gemm.WORKSPACE_BUDGET
    small = _im2col_kernel(LENET1, budget=3 * image + 1)
    assert small.chunk_images(10, small.workspace_budget) == 3
    assert small.workspace_bytes(10000) == 3 * image
    assert _im2col_kernel(LENET1, budget=1).workspace_bytes(5) == image  # a chunk is at least one image


def test_implicit_gemm_needs_no_workspace():
    config = families.FAMILIES["implicit_gemm"].config(LENET1, 4, 1024)
    assert gemm.ImplicitGemmKernel(LENET1, config, None).workspace_bytes(10000) == 0


# ---- GPU ----

MAX_RELATIVE_L2 = 1e-5

GPU_CASES = {
    # K = 27 and columns that fill no tile: the tails of both are loaded as zeros
    "stride2_asym_pads": conv(10, 3, 8, (17, 23), (3, 3), strides=(2, 2), pads=(1, 0, 2, 1)),
    "group2_dilation2_no_bias": conv(7, 6, 10, (15, 13), (3, 2), pads=(2, 1, 2, 1), dilations=(2, 2), group=2, bias=False),
    "depthwise": conv(5, 8, 8, (14, 15), (3, 3), pads=(1, 1, 1, 1), group=8),
    "wide_k": conv(3, 20, 24, (9, 11), (5, 5), pads=(2, 2, 2, 2)),  # K = 500: many K steps
}
TILES = [(4, 1024), (16, 256), (16, 128), (64, 32), (128, 64)]  # BN above, at and below the 256 threads


def _problem(spec, rng):
    x = rng.standard_normal(spec.input_shape(), dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    b = rng.standard_normal(spec.out_channels, dtype=np.float32) if spec.has_bias else None
    return x, w, b


def _run(kernel, spec, x, w, b):
    import cupy

    out = cupy.full(spec.output_shape(x.shape[0]), cupy.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(a) for a in (x, w, b) if a is not None], None, out=out)
    return cupy.asnumpy(y)


def _assert_matches_reference(got, spec, x, w, b, context):
    from opplugin.ops.conv import reference
    from opplugin.ops.conv.epilogue import NONE

    expected = reference.expected(spec, NONE, x, w, b)
    assert not np.isnan(got).any(), f"{context}: output elements never written"
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error <= MAX_RELATIVE_L2, f"{context}: relative L2 error {error:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_chunks_of_a_small_workspace_give_the_one_chunk_result(case):
    spec = GPU_CASES[case]
    seed = np.random.SeedSequence().entropy
    x, w, b = _problem(spec, np.random.default_rng(seed))
    kernel = families.build_kernel(spec, "im2col_gemm", None)
    whole = _run(kernel, spec, x, w, b)
    image = kernel.image_workspace_bytes()
    for budget in (3 * image, 1):  # chunks of 3 images (a short last one), then of one image
        kernel.workspace_budget = budget
        chunked = _run(kernel, spec, x, w, b)
        np.testing.assert_array_equal(chunked, whole, err_msg=f"{case}, budget {budget} (seed {seed})")
    _assert_matches_reference(whole, spec, x, w, b, f"{kernel.name} on {case} (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", TILES, ids=lambda tile: "{}x{}".format(*tile))
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_tile_shape_matches_the_reference(family, tile):
    for case, spec in GPU_CASES.items():
        seed = np.random.SeedSequence().entropy
        x, w, b = _problem(spec, np.random.default_rng(seed))
        kernel = families.build_kernel(spec, families.FAMILIES[family].config(spec, *tile), None)
        _assert_matches_reference(_run(kernel, spec, x, w, b), spec, x, w, b, f"{kernel.name} on {case} (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_new_weights_each_call(family):
    spec = GPU_CASES["stride2_asym_pads"]
    kernel = families.build_kernel(spec, family, None)
    rng = np.random.default_rng()
    for _ in range(2):
        x, w, b = _problem(spec, rng)
        _assert_matches_reference(_run(kernel, spec, x, w, b), spec, x, w, b, f"{kernel.name}, run-time weights")
