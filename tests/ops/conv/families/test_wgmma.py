"""The Hopper wgmma implicit GEMM (wg_3xtf32) on the CPU: its names and limits, its block's threads
and shared memory, the weights it rearranges, the architectures it compiles for, and where the
heuristic puts it, on Hopper and on other GPUs. The GPU tests that hold it to float64 are ops/conv/test_families_gpu.py's and the
prologue, residual, long-K and grouped ones; ops/test_kernel_compile.py compiles it for sm_90a."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_builders import conv_spec as conv
from opplugin.gpu import cuda
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config, nonfinite_exact_config, prefers_wgmma
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families.base import unit_arch
from opplugin.ops.conv.families.wgmma import split_weights

VGG_512 = conv(32, 512, 512, (14, 14), (3, 3), pads=(1, 1, 1, 1))
RESNET_64 = conv(32, 64, 64, (56, 56), (3, 3), pads=(1, 1, 1, 1))


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)


@pytest.fixture
def gpu_of(monkeypatch):
    """Makes the planning see a GPU whose code is compiled for `arch` ("sm_80", "sm_90")."""
    def set_arch(arch: str) -> None:
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_arch", lambda: arch)
    return set_arch


def test_names_parse_and_are_exact_by_measurement_as_tc_3xtf32():
    family = families.FAMILIES["wg_3xtf32"]
    assert families.family_of("wg_3xtf32_b128x128x32_s3_k2") is family
    assert family.exact and family.exact_by == "measurement" and family.split  # an infinity comes out NaN
    assert family.max_relative_error == families.FAMILIES["tc_3xtf32"].max_relative_error
    assert "tiles are" in families.unsupported_reason(VGG_512, "wg_3xtf32_b256x128x32_s3", None)
    assert "tiles are" in families.unsupported_reason(VGG_512, "wg_3xtf32_b128x128x16_s3", None)  # one 128-byte line a row
    assert "not a max pool" in families.unsupported_reason(VGG_512, "wg_3xtf32", None, Epilogue("Relu", (2, 2)))
    assert families.unsupported_reason(VGG_512, "wg_3xtf32", ones(VGG_512), Epilogue("Relu", residual=True)) is None


def test_it_takes_groups_of_32_channels_and_constant_weights():
    assert families.unsupported_reason(RESNET_64, "wg_3xtf32", ones(RESNET_64)) is None
    narrow = conv(2, 48, 64, (14, 14), (3, 3), group=2)  # 24 channels a group
    assert "32 at a time" in families.unsupported_reason(narrow, "wg_3xtf32", ones(narrow))
    grouped = conv(2, 128, 64, (14, 14), (3, 3), group=2)
    assert families.unsupported_reason(grouped, "wg_3xtf32", ones(grouped)) is None
    assert "not constant" in families.unsupported_reason(VGG_512, "wg_3xtf32", None)


def test_windows_of_up_to_nine_taps_keep_a_bit_a_tap_and_wider_ones_test_each_copys_tap():
    """A producer keeps a bit per tap of each pixel's window up to 3x3 (TAP_MASK, the code it always had); past
    that, each copy tests its own tap against the image (a 7x7 stem's 49-bit masks spilled), so any window runs."""
    for kernel, masks in (((1, 1), 1), ((3, 3), 1), ((1, 7), 1), ((3, 5), 0), ((7, 7), 0), ((8, 8), 0), ((11, 11), 0)):
        spec = conv(2, 32, 64, (23, 21), kernel)
        for name in ("wg_3xtf32", "wg_fp16"):
            assert families.unsupported_reason(spec, name, ones(spec)) is None, (kernel, name)
            assert {unit.defines["TAP_MASK"] for unit in families.compile_units(spec, name)} == {masks}, (kernel, name)
    # K past tc_3xtf32's 8192-row __constant__ tap table with a window too wide to read it by channel: conv_wgmma.cu
    # has no table
    wide = conv(2, 128, 64, (28, 28), (11, 11), pads=(5, 5, 5, 5))
    assert "tap table" in families.unsupported_reason(wide, "tc_3xtf32", ones(wide))
    assert families.unsupported_reason(wide, "wg_3xtf32", ones(wide)) is None


def test_weights_are_rearranged_tap_major_and_split_exactly():
    spec = conv(1, 64, 3, (5, 5), (3, 3), group=2)
    w = np.random.default_rng(0).standard_normal(spec.weight_shape, dtype=np.float32) * 1e3
    rows, small = split_weights(spec, w)
    assert rows.shape == small.shape == (3, 32 * 9) and rows.flags.c_contiguous
    m, c, kh, kw = 2, 17, 1, 2
    assert rows[m, (kh * 3 + kw) * 32 + c] == w[m, c, kh, kw]  # k = (kh*KW + kw)*C/G + c
    big = (rows.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)  # what a TF32 operand keeps
    assert np.array_equal(big + small, rows)  # exact in FP32
    assert np.all(np.abs(small) < np.abs(rows) * 2.0**-10)  # the 13 low bits a TF32 operand drops
    assert np.count_nonzero(small) > 0.9 * small.size


def test_a_block_is_producers_and_a_consumer_warpgroup_per_64_pixels():
    config = families.configure(VGG_512, "wg_3xtf32_b128x128x32_s3")
    assert config.threads == 512 and config.min_blocks == 1
    # three stages of 128 + 128 rows of 32 floats and their small parts, two mbarriers a stage, 1 KiB to align
    assert config.shared_bytes() == 3 * 2 * 256 * 32 * 4 + 3 * 16 + 1024 <= 227 * 1024
    assert families.configure(VGG_512, "wg_3xtf32_b64x64x32_s3").threads == 256


def test_it_compiles_for_sm_90a_alone():
    family = families.FAMILIES["wg_3xtf32"]
    assert family.archs == ("sm_90",)
    units = families.compile_units(VGG_512, "wg_3xtf32_b128x128x32_s3_k2")
    assert [u.function for u in units] == ["conv_wgmma", "conv_k_slices_reduce", "conv_split_channel_last"]
    assert {unit_arch(u, "sm_90") for u in units} == {"sm_90a"}


def test_hopper_takes_it_for_the_widest_layers_and_other_gpus_keep_tc_3xtf32(gpu_of):
    gpu_of("sm_90")
    assert prefers_wgmma(VGG_512) and prefers_wgmma(RESNET_64)
    assert heuristic_config(VGG_512, ones(VGG_512), NONE).name() == "wg_3xtf32_b128x128x32_s3_k2"  # a long K: balanced waves
    assert heuristic_config(RESNET_64, ones(RESNET_64), NONE).family == "wg_3xtf32"
    # a 1x1 stride-2 layer meets 128 multiply-adds an input value: too few to repay the channel-last copy
    strided = conv(32, 256, 512, (56, 56), (1, 1), strides=(2, 2))
    assert not prefers_wgmma(strided) and heuristic_config(strided, ones(strided), NONE).family == "tc_3xtf32"
    # one image: 196 output pixels, but a K of 4608 to split; a K of 288 stays on tc_3xtf32
    small_batch = dataclasses.replace(VGG_512, batch=1)
    assert prefers_wgmma(small_batch) and heuristic_config(small_batch, ones(small_batch), NONE).family == "wg_3xtf32"
    mnist = conv(1, 32, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))
    assert not prefers_wgmma(mnist) and heuristic_config(mnist, ones(mnist), NONE).family == "tc_3xtf32"
    # NaN and Inf: neither 3xTF32 GEMM, whose split makes a NaN of an infinity
    assert nonfinite_exact_config(VGG_512, ones(VGG_512)).family == "simt_gemm"


def test_at_batch_1_graphed_runs_take_it_for_short_grids_of_enough_work(gpu_of):
    """ConvNeXt-T's MLP and ResNet's 128->128 at batch 1: 2**25 multiply-adds or more with a K of
    384 or more go to its 64-map tiles split over K, launched from a graph; eagerly, where its
    extra launch and scratch cost the host more than it saves, and for the MNIST layer, tc_3xtf32."""
    gpu_of("sm_90")
    mlp = [conv(1, 384, 1536, (14, 14), (1, 1)), conv(1, 1536, 384, (14, 14), (1, 1)), conv(1, 768, 3072, (7, 7), (1, 1))]
    resnet = conv(1, 128, 128, (28, 28), (3, 3), pads=(1, 1, 1, 1))
    mnist = conv(1, 32, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))
    short_k = conv(1, 256, 1024, (14, 14), (1, 1))  # 51 M multiply-adds, but a K of 256
    graphed = [prefers_wgmma(spec, graphed=True) for spec in [*mlp, resnet, mnist, short_k]]
    assert graphed == [True] * 4 + [False, False]
    assert heuristic_config(resnet, ones(resnet), NONE, graphed=True).name() == "wg_3xtf32_b64x128x32_s3_k9"
    assert heuristic_config(mlp[1], ones(mlp[1]), NONE, graphed=True).name() == "wg_3xtf32_b64x128x32_s3_k10"
    assert not any(prefers_wgmma(spec, graphed=False) for spec in [*mlp, resnet])
    assert heuristic_config(resnet, ones(resnet), NONE, graphed=False).family == "tc_3xtf32"

    gpu_of("sm_80")
    assert "compute capability 9.0 alone" in families.unsupported_reason(VGG_512, "wg_3xtf32", None)
    assert heuristic_config(VGG_512, ones(VGG_512), NONE).family == "tc_3xtf32"
