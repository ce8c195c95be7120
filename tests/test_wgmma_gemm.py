"""The Hopper wgmma implicit GEMM (wg_3xtf32) on the CPU: its names and limits, its block's threads
and shared memory, the architectures it compiles for, and where the heuristic puts it, on Hopper
and on other GPUs. The GPU tests that hold it to float64 are test_conv_cuda_gpu.py's and the
prologue, residual, long-K and grouped ones; test_kernel_compile.py compiles it for sm_90a."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_builders import conv_spec as conv
from opplugin import cuda
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config, nonfinite_exact_config, prefers_wgmma
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families.common import unit_arch

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
    assert families.family_of("wg_3xtf32_b128x128x32_s4_k2") is family
    assert family.exact and family.exact_by == "measurement" and family.split  # an infinity comes out NaN
    assert family.max_relative_error == families.FAMILIES["tc_3xtf32"].max_relative_error
    assert "tiles are" in families.unsupported_reason(VGG_512, "wg_3xtf32_b256x128x32_s4", None)
    assert "tiles are" in families.unsupported_reason(VGG_512, "wg_3xtf32_b128x128x16_s4", None)  # one 128-byte line a row
    assert "not a max pool" in families.unsupported_reason(VGG_512, "wg_3xtf32", None, Epilogue("Relu", (2, 2)))
    assert families.unsupported_reason(VGG_512, "wg_3xtf32", None, Epilogue("Relu", residual=True)) is None


def test_a_block_is_producers_and_a_consumer_warpgroup_per_64_pixels():
    config = families.configure(VGG_512, "wg_3xtf32_b128x128x32_s4")
    assert config.threads == 512 and config.min_blocks == 1
    # four stages of 128 + 128 rows of 32 floats, two buffers of their small parts, two mbarriers a stage, 1 KiB to align
    assert config.shared_bytes() == 6 * 256 * 32 * 4 + 4 * 16 + 1024 <= 227 * 1024
    assert families.configure(VGG_512, "wg_3xtf32_b64x64x32_s4").threads == 256


def test_it_compiles_for_sm_90a_alone():
    family = families.FAMILIES["wg_3xtf32"]
    assert family.archs == ("sm_90",)
    units = families.compile_units(VGG_512, "wg_3xtf32_b128x128x32_s4_k2")
    assert [u.function for u in units] == ["conv_wgmma", "conv_k_slices_reduce"]
    assert {unit_arch(u, "sm_90") for u in units} == {"sm_90a"}
    assert all(u.defines["B_VEC"] == 1 for u in units)  # K-major image tile: pixels are not neighbours there


def test_hopper_takes_it_for_the_widest_layers_and_other_gpus_keep_tc_3xtf32(gpu_of):
    gpu_of("sm_90")
    assert prefers_wgmma(VGG_512) and not prefers_wgmma(RESNET_64)
    assert heuristic_config(VGG_512, ones(VGG_512), NONE).name() == "wg_3xtf32_b128x128x32_s4"
    assert heuristic_config(RESNET_64, ones(RESNET_64), NONE).family == "tc_3xtf32"
    small_batch = dataclasses.replace(VGG_512, batch=1)  # 196 output pixels: tc_3xtf32 keeps it
    assert not prefers_wgmma(small_batch) and heuristic_config(small_batch, ones(small_batch), NONE).family == "tc_3xtf32"
    # NaN and Inf: neither 3xTF32 GEMM, whose split makes a NaN of an infinity
    assert nonfinite_exact_config(VGG_512, ones(VGG_512)).family == "simt_gemm"

    gpu_of("sm_80")
    assert "compute capability 9.0 alone" in families.unsupported_reason(VGG_512, "wg_3xtf32", None)
    assert heuristic_config(VGG_512, ones(VGG_512), NONE).family == "tc_3xtf32"
