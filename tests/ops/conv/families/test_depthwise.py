"""Grouped and depthwise Convs on the CPU: the depthwise and grouped families' names, limits,
tiles and macros; the pipelined GEMMs' groups; the heuristic's picks for the grouped and depthwise
layers of modern CNNs (never `baseline`); and the cap that keeps the constant-memory families
off layers whose compile explodes. The GPU tests are in ops/conv/families/test_depthwise_gpu.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx_builders import conv_spec as conv

from opplugin.lab import cnn_layers
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config, preference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import depthwise, pipelined, simt_gemm

DEPTHWISE = families.FAMILIES["depthwise"]


def same_pads(c, m, size, k, stride=1, group=None, batch=1):
    return conv(batch, c, m, (size, size), (k, k), strides=(stride, stride), pads=((k - 1) // 2,) * 4, group=group or c)


# The grouped and depthwise Convs of torchvision's models (channels, size, kernel, stride, group),
# written out from their architectures: every one must get a CUDA family by default, never baseline.
MODEL_CONVS = {
    "resnext50_32x4d": [(128, 56, 3, 1, 32), (256, 56, 3, 2, 32), (256, 28, 3, 1, 32), (512, 28, 3, 2, 32),
                        (512, 14, 3, 1, 32), (1024, 14, 3, 2, 32), (1024, 7, 3, 1, 32)],
    "regnet_y_800mf": [(64, 112, 3, 2, 4), (144, 56, 3, 2, 9), (144, 28, 3, 1, 9), (320, 28, 3, 2, 20),
                       (320, 14, 3, 1, 20), (784, 14, 3, 2, 49), (784, 7, 3, 1, 49)],
    "convnext_tiny": [(96, 56, 7, 1, 96), (192, 28, 7, 1, 192), (384, 14, 7, 1, 384), (768, 7, 7, 1, 768)],
    "efficientnet_b0": [(32, 112, 3, 1, 32), (96, 112, 3, 2, 96), (144, 56, 3, 1, 144), (144, 56, 5, 2, 144),
                        (240, 28, 5, 1, 240), (240, 28, 3, 2, 240), (480, 14, 3, 1, 480), (480, 14, 5, 1, 480),
                        (672, 14, 5, 1, 672), (672, 14, 5, 2, 672), (1152, 7, 5, 1, 1152), (1152, 7, 3, 1, 1152)],
    "mobilenet_v3_large": [(16, 112, 3, 1, 16), (64, 112, 3, 2, 64), (72, 56, 3, 1, 72), (72, 56, 5, 2, 72),
                           (120, 28, 5, 1, 120), (240, 28, 3, 2, 240), (200, 14, 3, 1, 200), (184, 14, 3, 1, 184),
                           (480, 14, 3, 1, 480), (672, 14, 3, 1, 672), (672, 14, 5, 2, 672), (960, 7, 5, 1, 960)],
}
MODEL_SPECS = {
    f"{model} {c}ch {size} {k}x{k} s{stride} g{group} b{batch}": same_pads(c, c, size, k, stride, group, batch)
    for model, convs in MODEL_CONVS.items()
    for c, size, k, stride, group in convs
    for batch in (1, 32)
}


# ... and their other kinds of Conv, for the same check: stems, the squeeze-excitation 1x1s on a 1x1
# map, ConvNeXt's 4x4 and 2x2 patch convs, the wide 1x1 heads
PLAIN_CONVS = {
    "convnext stem 4x4 s4": conv(1, 3, 96, (224, 224), (4, 4), strides=(4, 4)),
    "convnext downsample 2x2 s2": conv(1, 384, 768, (14, 14), (2, 2), strides=(2, 2)),
    "efficientnet se 1152->48": conv(1, 1152, 48, (1, 1), (1, 1)),
    "efficientnet se 48->1152": conv(1, 48, 1152, (1, 1), (1, 1)),
    "efficientnet head 320->1280": conv(32, 320, 1280, (7, 7), (1, 1)),
    "regnet se 784->196": conv(1, 784, 196, (1, 1), (1, 1)),
    "resnext 1x1 2048->1024 s1": conv(32, 2048, 1024, (7, 7), (1, 1)),
    "mobilenet_v3 stem 3->16 s2": conv(1, 3, 16, (224, 224), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
}
MODEL_SPECS |= PLAIN_CONVS


def weights(spec):
    rng = np.random.default_rng(0)
    return rng.standard_normal(spec.weight_shape, dtype=np.float32), rng.standard_normal(spec.out_channels, dtype=np.float32)


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_the_heuristic_runs_no_grouped_or_depthwise_layer_on_baseline(name):
    spec = MODEL_SPECS[name]
    for epilogue in (NONE, Epilogue("Relu")):
        config = heuristic_config(spec, weights(spec), epilogue)
        assert config.family != "baseline", f"{name}: {config}"
        assert families.unsupported_reason(spec, config, weights(spec)) is None


def test_the_new_suite_layers_get_the_new_families():
    names = {layer.name: layer for layer in cnn_layers.LAYERS}
    # the H100's fastest (pick_study, graphed): grouped, several maps a thread, for groups of 4 and 16
    expected = {
        "efficientnetb0 dw 5x5 1152ch 7": ("depthwise", "depthwise"),
        "convnext-t dw 7x7 768ch 7": ("depthwise", "depthwise"),
        "resnext50 g32 3x3 128ch 56": ("grouped", "grouped"),
        "resnext50 g32 3x3 512ch 14": ("grouped", "grouped"),
        "regnety800mf gw16 3x3 144ch 28": ("grouped", "grouped"),
        "regnety800mf gw16 3x3 320ch 14": ("grouped", "grouped"),
    }
    for name, picks in expected.items():
        for batch, family in zip((1, 32), picks):
            spec = names[name].spec(batch)
            assert heuristic_config(spec, weights(spec), NONE).family == family, (name, batch)


def test_depthwise_goes_before_the_constant_families_it_replaces():
    order = preference(same_pads(672, 672, 14, 5))
    assert order.index("depthwise") < order.index("const_tile") and order.index("depthwise") < order.index("baseline")
    grouped = preference(same_pads(128, 128, 56, 3, group=32))
    assert "depthwise" not in grouped and grouped.index("grouped") < grouped.index("simt_gemm") < grouped.index("baseline")
    wide = same_pads(2048, 2048, 7, 3, group=32)  # 64 channels a group: past `grouped`, the GEMMs take it
    assert "2 to 32 input channels" in families.unsupported_reason(wide, "grouped", None)
    assert heuristic_config(wide, weights(wide), NONE).family == "simt_gemm"


def test_constant_families_refuse_the_layer_whose_compile_exploded():
    """A drawn 61-map depthwise 5x7 layer: const_tile's 8x8 tiles compiled 86 s; the cap turns them down."""
    spec = conv(2, 61, 61, (20, 20), (5, 7), pads=(2, 3, 2, 3), group=61)
    reason = families.unsupported_reason(spec, "const_tile_t8x8_m1", weights(spec))
    assert "unroll" in reason and str(families.base.UNROLLED_BUDGET) in reason
    for config in families.tuning_configs(spec, weights(spec)):
        assert families.unsupported_reason(spec, config, weights(spec)) is None
    assert families.unsupported_reason(spec, "depthwise", None) is None
    small = conv(4, 8, 8, (19, 21), (3, 3), pads=(1, 1, 1, 1), group=8)  # 8 maps: well within the budget
    assert families.unsupported_reason(small, "const_tile_t8x8_m1", weights(small)) is None


@pytest.mark.parametrize("name", ["depthwise_t2x4_b14x16_p2", "depthwise_t1x4_b7x8_p4", "depthwise_t1x1_b4x8_p4"])
def test_depthwise_names_round_trip(name):
    family, config = families.parse(name)
    assert family.name == "depthwise" and config.name() == name
    assert families.parse(config.name())[1] == config
    assert isinstance(config, depthwise.DepthwiseConfig)


def test_depthwise_limits_are_stated():
    dw = same_pads(672, 672, 14, 5)
    assert "one input channel" in families.unsupported_reason(conv(1, 8, 8, (9, 9), (3, 3), group=2), "depthwise", None)
    assert "not a max pool" in families.unsupported_reason(dw, "depthwise", None, Epilogue("Relu", (2, 2)))
    assert families.unsupported_reason(dw, "depthwise", None, Epilogue("Relu", residual=True)) is None
    assert "whole thread tiles" in families.unsupported_reason(dw, "depthwise_t2x4_b15x16_p1", None)
    assert "threads a block" in families.unsupported_reason(dw, "depthwise_t1x1_b32x32_p1", None)
    assert "shared memory" in families.unsupported_reason(dw, "depthwise_t8x4_b128x64_p2", None)
    assert "needs its field(s) p" in families.unsupported_reason(dw, "depthwise_t2x4_b8x8", None)
    assert not DEPTHWISE.constant_weights and DEPTHWISE.exact and DEPTHWISE.fuses
    grouped = same_pads(144, 144, 28, 3, group=9)  # 16 maps a group
    assert "one input channel" in families.unsupported_reason(grouped, "depthwise", None)
    assert "one group of 16" in families.unsupported_reason(grouped, "grouped_t2x2_b28x14_p32", None)
    assert "2 to 32 input channels" in families.unsupported_reason(same_pads(8, 8, 9, 3), "grouped", None)


def test_grouped_blocks_share_their_groups_patches():
    grouped = families.FAMILIES["grouped"]
    for layer in cnn_layers.LAYERS:
        spec = layer.spec(32)
        if spec.group == 1 or spec.in_channels == spec.group:
            continue
        config = grouped.configs(spec)[0]
        maps = spec.out_channels // spec.group
        assert maps % config.planes == 0 and config.planes >= min(maps, 4), (layer.name, config)
        # the patches are the group's channels, not one per map
        rows = depthwise.patch_size(spec, config.block)[0]
        channels = spec.in_channels // spec.group
        assert depthwise.shared_bytes(spec, config) == 4 * (channels * rows * depthwise.pitch_for(spec, config) + config.planes * channels * 9)


def test_grouped_threads_compute_several_maps_of_their_group():
    grouped = families.FAMILIES["grouped"]
    # a grid of two blocks an SM or more: 2 x 2 tiles of 4 maps a thread, all 8 of a group's maps a block
    long = grouped.configs(same_pads(256, 256, 28, 3, group=32, batch=32))[0]
    assert (long.thread, long.planes, long.maps, long.staged) == ((2, 2), 8, 4, 1)
    assert long.name() == "grouped_t2x2_b28x14_p8_m4" and long.threads == 2 * 14 * 7
    # its stride-2 patch outgrows shared memory: unstaged, each thread all of the block's maps
    strided = grouped.configs(conv(32, 256, 256, (56, 56), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=32))[0]
    assert (strided.thread, strided.planes, strided.maps, strided.staged) == ((2, 2), 8, 8, 0)
    # batch 1's short grid: one output of 4 maps a thread; groups of 2 maps: 2 a thread
    short = grouped.configs(same_pads(128, 128, 56, 3, group=32, batch=1))[0]
    assert (short.thread, short.planes, short.maps) == ((1, 1), 4, 4)
    assert grouped.configs(same_pads(64, 64, 56, 3, group=32, batch=1))[0].maps == 2
    # groups of 32 maps or more go to the SIMT GEMM first; 16 stay on grouped
    assert heuristic_config(same_pads(1024, 1024, 7, 3, group=32, batch=32), None, NONE).family == "simt_gemm"
    assert heuristic_config(same_pads(512, 512, 14, 3, group=32, batch=32), None, NONE).family == "grouped"
    # the compiled kernel gets MAPS; the limits are stated
    [unit] = families.compile_units(same_pads(256, 256, 28, 3, group=32), long.name(), NONE)
    assert unit.defines["MAPS"] == 4 and unit.defines["PLANES"] == 8
    spec = same_pads(256, 256, 28, 3, group=32)
    assert "must divide the block's 8" in families.unsupported_reason(spec, "grouped_t2x2_b28x14_p8_m3", None)
    assert "at most 32" in families.unsupported_reason(spec, "grouped_t4x4_b28x28_p8_m4", None)
    assert "one map a thread" in families.unsupported_reason(same_pads(672, 672, 14, 5), "depthwise_t2x2_b14x14_p4_m2", None)
    assert families.parse("grouped_t2x2_b28x14_p8")[1].maps == 1  # m1, the default, is left out of names


def test_depthwise_tiles_cover_the_plane_with_little_waste():
    for layer in cnn_layers.LAYERS:
        spec = layer.spec(32)
        if spec.in_channels != spec.group:
            continue
        configs = DEPTHWISE.configs(spec)
        assert configs and all(DEPTHWISE.reason(spec, c, NONE) is None for c in configs)
        first = configs[0]
        # an unstaged 2 x 2 tile is taken even where it overhangs a 7x7 plane (8x8: 77% inside), measured quicker
        least = 0.75 if not first.staged else depthwise.LEAST_EFFICIENCY
        assert depthwise.efficiency(spec, first.block) >= least, (layer.name, first)
        assert 32 <= first.threads <= depthwise.MAX_THREADS, (layer.name, first)
    # 7x7 planes: several maps a block, a block no larger than the plane
    first = DEPTHWISE.configs(same_pads(768, 768, 7, 7))[0]
    assert first.planes > 1 and first.block[0] <= 8 and first.block[1] <= 8


def test_depthwise_layers_of_few_window_loads_or_a_mostly_halo_patch_go_unstaged():
    assert depthwise.loads_per_output(same_pads(144, 144, 56, 3), (2, 2)) == 16 / 4
    cases = {  # (maps, plane, filter, stride) -> unstaged first, at batch 1 and 32
        (144, 56, 3, 2): True,  # MobileNetV2's 3x3 s2: 6.25 window loads an output
        (672, 14, 5, 2): True,  # EfficientNet-B0's 5x5 s2: 12.25
        (768, 7, 7, 1): True,  # ConvNeXt-T's 7x7 at 7x7: 16 loads, but a patch 3.25x the tile
        (96, 56, 7, 1): False,  # ConvNeXt-T's 7x7 at 56x56: 16 loads and a patch 1.5x the tile: staged
    }
    for (maps, size, kernel, stride), unstaged in cases.items():
        for batch in (1, 32):
            pads = (kernel // 2,) * 4
            spec = conv(batch, maps, maps, (size, size), (kernel, kernel), strides=(stride, stride), pads=pads, group=maps)
            first = DEPTHWISE.configs(spec)[0]
            assert (not first.staged) == unstaged, (maps, size, kernel, stride, batch, first)
            assert first.staged or first.thread == (2, 2) and DEPTHWISE.reason(spec, first, NONE) is None


def test_an_unstaged_config_says_so_in_its_name_and_needs_no_shared_memory():
    spec = same_pads(144, 144, 56, 3)
    config = families.parse("depthwise_t2x2_b28x14_p1_l0")[1]
    assert config.staged == 0 and config.name() == "depthwise_t2x2_b28x14_p1_l0"
    assert families.parse("depthwise_t2x2_b28x14_p1")[1].staged == 1  # l1, the default, is left out of names
    assert depthwise.shared_bytes(spec, config) == 0
    [unit] = families.compile_units(spec, config.name(), NONE)
    assert unit.defines["STAGED"] == 0
    assert "l0 (from global memory)" in DEPTHWISE.reason(spec, dataclasses.replace(config, staged=2), NONE)


def test_depthwise_pitch_spreads_the_lanes_over_the_banks():
    spec = same_pads(96, 96, 56, 7)
    config = families.parse("depthwise_t2x4_b32x32_p1")[1]  # 8 lanes a row 4 columns apart, rows 2 apart
    width = depthwise.patch_size(spec, config.block)[1]
    pitch = depthwise.pitch_for(spec, config)
    assert width <= pitch < width + depthwise.BANKS
    # rows of lanes 2 x pitch apart: at the patch's width of 38 all four land on the same banks; an odd
    # pitch puts two of them on the odd banks' side, the best an even row step allows
    assert depthwise.bank_conflicts(spec, config, width) == 4
    assert depthwise.bank_conflicts(spec, config, pitch) == 2


def test_depthwise_compile_units_say_the_tiles():
    spec = conv(2, 6, 18, (13, 17), (5, 5), strides=(2, 2), pads=(2, 1, 1, 2), group=6)
    [unit] = families.compile_units(spec, "depthwise_t2x4_b8x8_p2", Epilogue("Relu", residual=True))
    d = unit.defines
    assert unit.source == "conv_depthwise.cu" and unit.function == "conv_depthwise"
    assert (d["TH"], d["TW"], d["BH"], d["BW"], d["PLANES"], d["RESIDUAL"]) == (2, 4, 8, 8, 2, 1)
    assert d["PITCH"] >= (8 - 1) * 2 + 5 and (d["M"], d["G"]) == (18, 6)


def test_grouped_gemms_run_any_group_count():
    for spec in (same_pads(128, 128, 56, 3, group=32, batch=32), same_pads(320, 320, 14, 3, group=20)):
        for name in ("simt_gemm", "tc_3xtf32"):
            assert families.unsupported_reason(spec, name, None) is None
    narrow = same_pads(128, 128, 56, 3, group=32)  # 4 maps a group: the 8-row tile first
    assert families.configure(narrow, "simt_gemm").bm == 8
    width16 = same_pads(320, 320, 14, 3, group=20, batch=32)
    assert families.configure(width16, "simt_gemm").bm == 16
    for spec in (narrow, width16):
        assert sorted(c.block[:2] for c in families.FAMILIES["simt_gemm"].configs(spec)) == sorted(simt_gemm.THREAD_TILES)


def test_grouped_gemm_grid_and_tap_table_are_per_group():
    spec = same_pads(320, 320, 14, 3, group=20)
    assert pipelined.map_tiles(spec, 16) == 20 and pipelined.map_tiles(spec, 32) == 20
    assert pipelined.map_tiles(same_pads(144, 144, 28, 3, group=9), 8) == 18
    table = pipelined.tap_table(spec)
    assert (table[:, 0] < 16 * 14 * 14).all()  # offsets inside one group's 16 channels
    assert len(table) == -(-16 * 9 // pipelined.TAP_SLICE) * pipelined.TAP_SLICE
    [unit] = families.compile_units(spec, "simt_gemm_b16x128x16_t2x8_s4_o4")
    assert (unit.defines["G"], unit.defines["C"], unit.defines["KPAD"]) == (20, 320, len(table))
    huge_grid = conv(1, 65536 * 2, 65536 * 2, (1, 1), (1, 1), group=65536)
    assert "grid's y" in families.unsupported_reason(huge_grid, "simt_gemm_b8x128x16_t1x8_s4_o4", None)


def test_split_k_counts_the_tiles_of_every_group():
    spec = same_pads(1024, 1024, 7, 3, group=8)  # 128 maps a group at 7x7: 8 groups x 4 tiles of 32
    config = families.FAMILIES["simt_gemm"].tile_config((32, 64))
    assert pipelined.grid_blocks(spec, config) == 32
    assert pipelined.split_for(spec, config, pipelined.DEFAULT_SMS) == 4  # 128 blocks: the GPU's 132 SMs nearly full
    assert pipelined.split_for(dataclasses.replace(spec, batch=32), config, pipelined.DEFAULT_SMS) == 1
