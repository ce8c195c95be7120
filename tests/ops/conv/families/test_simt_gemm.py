"""The pipelined SIMT implicit GEMM (simt_gemm) on the CPU: its names and limits, the order and
K splits of its configurations, and the macros it compiles with. The GPU tests that hold it to
float64 are in ops/conv/families/test_simt_gemm_gpu.py and ops/conv/test_families_gpu.py."""
from __future__ import annotations

import dataclasses

import pytest
from onnx_builders import conv_spec as conv

from opplugin.lab import cnn_layers
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import base, pipelined, simt_gemm

VGG_512 = conv(1, 512, 512, (14, 14), (3, 3), pads=(1, 1, 1, 1))
RESNET_64 = conv(32, 64, 64, (56, 56), (3, 3), pads=(1, 1, 1, 1))


def test_registered_exact_by_construction_and_fusing():
    family = families.FAMILIES["simt_gemm"]
    assert family.exact and family.exact_by == "construction" and family.fuses
    assert list(families.FAMILIES).index("simt_gemm") > list(families.FAMILIES).index("tc_3xtf32")
    assert "simt_gemm" in families.usable_families(RESNET_64, None)


@pytest.mark.parametrize("name", ["simt_gemm_b128x128x16_t8x8_s4_o1", "simt_gemm_b64x64x16_t8x4_s4_o4_k4", "simt_gemm_b32x64x16_t4x4_s4_o4_k2"])
def test_configured_names_belong_to_the_family(name):
    assert families.family_of(name).name == "simt_gemm"
    assert families.unsupported_reason(VGG_512, name, None) is None


def test_bad_names_and_limits_are_stated():
    assert "tiles are simt_gemm_b128x128x16_t8x8_s4_o1, simt_gemm_b128x64x16_t8x8_s4_o3" in families.unsupported_reason(
        VGG_512, "simt_gemm_b48x64x16_t8x8_s4_o3", None)
    assert "tiles are" in families.unsupported_reason(VGG_512, "simt_gemm_b64x64x16_t8x4_s4_o3", None)  # not its registers budget
    assert "split it 1 to 16 ways" in families.unsupported_reason(VGG_512, "simt_gemm_b64x64x16_t8x4_s4_o4_k32", None)
    assert "the field 'kx' must be k and 1 integer" in families.unsupported_reason(VGG_512, "simt_gemm_b64x64x16_t8x4_s4_o4_kx", None)
    grouped = conv(1, 8, 8, (9, 9), (3, 3), group=2)
    assert families.unsupported_reason(grouped, "simt_gemm", None) is None  # any group count
    assert "not a max pool" in families.unsupported_reason(RESNET_64, "simt_gemm_b64x64x16_t8x4_s4_o4", None, Epilogue("Relu", (2, 2)))
    assert families.unsupported_reason(RESNET_64, "simt_gemm", None, Epilogue("Relu", residual=True)) is None
    huge_k = conv(1, 1024, 16, (5, 5), (3, 3))  # K = 9216 > the 8192-row tap table: it holds one channel's taps
    assert families.unsupported_reason(huge_k, "simt_gemm_b64x64x16_t8x4_s4_o4", None) is None


def test_every_tile_is_offered_once_the_measured_fastest_first():
    for spec in (VGG_512, RESNET_64, conv(32, 96, 24, (56, 56), (1, 1))):
        configs = families.FAMILIES["simt_gemm"].configs(spec)
        assert sorted((c.bm, c.bn) for c in configs) == sorted(simt_gemm.THREAD_TILES)
    assert families.configure(dataclasses.replace(VGG_512, batch=32), "simt_gemm").name() == "simt_gemm_b128x64x16_t8x8_s4_o3"
    assert families.configure(RESNET_64, "simt_gemm").name() == "simt_gemm_b64x128x16_t8x8_s4_o3"
    assert families.configure(conv(32, 96, 24, (56, 56), (1, 1)), "simt_gemm").name() == "simt_gemm_b32x128x16_t4x8_s4_o4"


def test_small_outputs_split_k_until_the_grid_fills_the_gpu():
    family = families.FAMILIES["simt_gemm"]
    assert family.configs(VGG_512)[0].name() == "simt_gemm_b128x64x16_t8x8_s4_o3_k8"  # 4 x 4 tiles of 196 pixels x 512 maps
    for spec in (VGG_512, conv(1, 512, 512, (7, 7), (3, 3), pads=(1, 1, 1, 1))):
        for config in family.configs(spec):
            splits = config.splits
            blocks = -(-pipelined.columns(spec) // config.bn) * -(-spec.out_channels // config.bm)
            full = blocks * splits >= pipelined.WAVE_SHARE * pipelined.DEFAULT_SMS
            assert full or splits == pipelined.MAX_K_SPLITS or pipelined.k_slices(spec) < 2 * splits * pipelined.MIN_SLICES_PER_BLOCK
            assert splits == 1 or blocks * splits // 2 < pipelined.WAVE_SHARE * pipelined.DEFAULT_SMS  # no split past the fill
    assert all("_k" not in c.name() for c in family.configs(RESNET_64))  # 3136 x 32 pixels fill the GPU unsplit


def test_compile_units_say_the_tile_the_vectors_and_the_split():
    [unit] = families.compile_units(RESNET_64, "simt_gemm_b128x64x16_t8x8_s4_o3")
    assert unit.source == "conv_simt_gemm.cu" and unit.function == "conv_simt_gemm"
    d = unit.defines
    assert (d["BM"], d["BN"], d["TM"], d["TN"], d["KSLICES"], d["MIN_BLOCKS"]) == (128, 64, 8, 8, 1, 3)
    assert (d["A_VEC"], d["B_VEC"], d["OUT_VEC"], d["TAP_MASK"]) == (4, 1, 1, 1)  # K = 576, 3x3 padded, 3136 pixels
    assert d["KPAD"] >= -(-d["C"] * 9 // d["BK"]) * d["BK"]
    gemm, reduce = families.compile_units(VGG_512, "simt_gemm_b64x64x16_t8x4_s4_o4_k4", Epilogue("Relu", residual=True))
    assert reduce.function == "conv_k_slices_reduce" and gemm.defines == reduce.defines
    assert gemm.defines["KSLICES"] == 4 and gemm.defines["RESIDUAL"] == 1
    odd = conv(2, 37, 70, (9, 11), (1, 1))  # K = 37, 99 pixels: 4-byte copies, scalar stores
    [unit] = families.compile_units(odd, "simt_gemm_b32x64x16_t4x4_s4_o4", NONE)
    assert (unit.defines["A_VEC"], unit.defines["B_VEC"], unit.defines["OUT_VEC"]) == (1, 1, 0)
    pointwise = cnn_layers.LAYERS[7].spec(32)  # 1x1 256->64 at 56x56: 16-byte pixel copies
    assert families.compile_units(pointwise, "simt_gemm_b64x64x16_t8x4_s4_o4")[0].defines["B_VEC"] == 4


def test_tiles_fit_the_kernel_static_checks():
    for tile in map(families.FAMILIES["simt_gemm"].tile_config, simt_gemm.THREAD_TILES):
        tn = tile.thread[1]
        threads_n = tile.bn // tn
        assert tn % 4 == 0 and threads_n >= 8 and tile.threads >= tile.bn
        assert (tile.bm * tile.bk) % tile.threads == 0 and tile.bk % (tile.threads // tile.bn) == 0
        # the blocks per SM the registers are budgeted for fit an H100's 228 KiB of shared memory (1 KiB each reserved)
        assert (tile.shared_bytes() + 1024) * tile.min_blocks <= 228 * 1024


def test_build_launches_like_the_tensor_core_kernel_with_float4_stores_aligned(monkeypatch):
    class Function:  # stands in for a loaded CUDA function: build only sets its shared-memory limit
        max_dynamic_shared_size_bytes = 0

    monkeypatch.setattr(base, "load_functions", lambda units, constants: [Function() for _ in units])
    kernel = families.build_kernel(VGG_512, "simt_gemm", None, Epilogue("Relu"))
    assert kernel.name == "conv.simt_gemm_b128x64x16_t8x8_s4_o3_k8+relu" and kernel.nonfinite_exact
    assert kernel.alignment == 16 and kernel.workspace_bytes(1) == 4 * 8 * 512 * 196  # 196 pixels: float4 stores
    assert kernel._gemm.max_dynamic_shared_size_bytes == kernel.config.shared_bytes() > 48 * 1024
    assert kernel.config == families.FAMILIES["simt_gemm"].tile_config((128, 64), 8)
    odd = families.build_kernel(conv(1, 512, 512, (7, 7), (3, 3), pads=(1, 1, 1, 1)), "simt_gemm_b64x64x16_t8x4_s4_o4_k4", None)
    assert odd.alignment == 4 and len(odd.functions) == 2  # 49 pixels: scalar stores; the split's reduce
