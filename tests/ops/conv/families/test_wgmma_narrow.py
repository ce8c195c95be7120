"""wg_fp16's and wg_bf16's narrow map tiles: BM (wgmma's N) of 8, 16, 24 or 32 maps, for groups of that few maps
(MobileNetV2's 16- and 24-map projections, lenet86's second Conv, RegNet's and ResNeXt's groups of 16).

CPU: the tile a group takes (the narrowest that holds its maps; wg_3xtf32's tiles as they were), which counts run and
link, the staged rows' banks and shared memory. The compile of every narrow configuration: ops/test_kernel_compile.py
(CNN_NARROW_WGMMA_CASES). GPU (`gpu` marker; Hopper alone): each configuration, its output poisoned first, against
float64 on fresh random operands within its format's bound (lab/format_bound.py), and within FP32 sums alone of float64
on the operands rounded to the format; a Runner in FP16 and BF16 on a MobileNetV2 block of 16 channels against
onnxruntime. Linked narrow tiles: test_channel_last.py; a few blocks taking the tiles in turn: test_wgmma_tiles.py.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import assert_within_the_formats_bounds, assert_within_the_formats_rule, draw, run_poisoned
from onnx_builders import conv_spec as conv
from onnx_builders import save
from precision_cases import mobilenet_block_model

from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined, wgmma
from opplugin.ops.conv.families.channel_last import ALL_LINKS, INPUT, OUTPUT, RESIDUAL
from opplugin.runtime import Runner

HALF = {"wg_fp16": "fp16", "wg_bf16": "bf16"}
ADD_RELU = Epilogue("Relu", residual=True)
SPECS = {
    "1x1_c96_m24": conv(3, 96, 24, (11, 13), (1, 1)),  # MobileNetV2's projection; pixels past a whole tile
    "3x3_c64_m8": conv(2, 64, 8, (12, 10), (3, 3), pads=(1, 1, 1, 1)),  # 8 weight rows: part of one copying turn
    "grouped_c128_g8_m16": conv(2, 128, 128, (9, 9), (3, 3), pads=(1, 1, 1, 1), group=8),  # RegNet's groups of 16
    "grouped_c96_g4_m24_stride2": conv(2, 96, 96, (15, 13), (3, 3), pads=(1, 1, 1, 1), strides=(2, 2), group=4),
    "3x3_c40_m32": conv(2, 40, 32, (10, 11), (3, 3), pads=(1, 1, 1, 1)),  # a slice spans taps
    "lenet86_conv2": conv(3, 4, 16, (40, 40), (7, 7)),  # 4 channels padded to 8, a 7x7 window
    "deep_c512_m16": conv(1, 512, 16, (7, 7), (3, 3), pads=(1, 1, 1, 1)),  # its first configuration splits K
}


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


def maps_of(spec) -> int:
    return spec.out_channels // spec.group


# ---- CPU ----


@pytest.mark.parametrize("name", list(HALF))
def test_a_group_of_8_to_32_maps_takes_the_narrowest_tile_that_holds_them_on_128_pixels_then_64(name):
    family = families.FAMILIES[name]
    for layer, spec in SPECS.items():
        assert family.offered_tiles(spec) == ((maps_of(spec), 128), (maps_of(spec), 64)), layer
        assert {c.bm for c in family.configs(spec)} == {maps_of(spec)}, layer
        assert families.configure(spec, name).bm == maps_of(spec)
        units = families.compile_units(spec, families.configure(spec, name))
        assert units[0].function == "conv_wgmma" and units[0].defines["BM"] == maps_of(spec)
    assert families.configure(SPECS["deep_c512_m16"], name).splits > 1
    # more maps a group: the tiles as they were (a 40-map group on a 64-map tile, 96 maps on two)
    assert families.configure(conv(2, 64, 40, (20, 20), (3, 3)), name).bm == 64
    assert families.configure(conv(2, 64, 96, (20, 20), (3, 3)), name).block[:2] == (64, 128)


def test_wg_3xtf32_keeps_its_tiles_and_takes_no_narrow_one():
    exact = families.FAMILIES["wg_3xtf32"]
    assert list(exact.tiles) == list(wgmma.TILES) and {bm for bm, _ in wgmma.TILES} == {64, 128}
    spec = conv(2, 64, 16, (20, 20), (3, 3), pads=(1, 1, 1, 1))
    assert {c.bm for c in exact.configs(spec)} == {64, 128}
    assert "the tiles are" in families.unsupported_reason(spec, "wg_3xtf32_b16x128x32_s3", ones(spec))
    assert set(families.FAMILIES["wg_fp16"].tiles) == set(wgmma.TILES) | {
        (maps, pixels) for maps in wgmma.NARROW_MAPS for pixels in wgmma.NARROW_PIXELS}


def test_fewer_than_32_maps_a_group_run_in_whole_8_map_blocks_alone_and_link_channel_last():
    for maps in (8, 16, 24, 32, 33):
        spec = conv(2, 64, maps, (12, 12), (3, 3), pads=(1, 1, 1, 1))
        assert families.unsupported_reason(spec, "wg_fp16", ones(spec), ADD_RELU) is None, maps
    for maps in (4, 12, 20, 31):  # lenet86's 4-map Conv, a 20-map squeeze: no whole 8-map blocks
        spec = conv(2, 64, maps, (12, 12), (3, 3), pads=(1, 1, 1, 1))
        assert families.unsupported_reason(spec, "wg_bf16", ones(spec)) == (
            f"wg_bf16 takes fewer than 32 maps a group only in whole 8-map blocks (a tile of exactly its maps); this Conv has {maps} a group")
    for layer, spec in SPECS.items():
        links = families.FAMILIES["wg_fp16"].channel_last_links(spec, ADD_RELU)
        assert links == (ALL_LINKS if layer != "lenet86_conv2" else OUTPUT | RESIDUAL), layer  # its 4 channels are padded
        for family in HALF:
            config = dataclasses.replace(families.configure(spec, family, ADD_RELU), links=links)
            assert families.unsupported_reason(spec, config, ones(spec), ADD_RELU) is None, layer


def test_a_staged_row_puts_a_warps_8_rows_in_distinct_banks_and_shared_memory_holds_them():
    def banks(row_halves: int) -> set[int]:  # the banks of an 8x8 matrix's rows g, words t (stmatrix, ldmatrix; STAGED_ROW)
        return {(g * row_halves // 2 + t) % 32 for g in range(8) for t in range(4)}

    for bm in (*wgmma.NARROW_MAPS, 64, 128):
        row = wgmma.staged_row(bm)
        assert len(banks(row)) == 32 and row % 8 == 0 and row >= bm + 8, bm  # whole 16-byte pieces
    assert [wgmma.staged_row(bm) for bm in wgmma.NARROW_MAPS] == [24, 24, 40, 40]
    assert len(banks(8 + 8)) == 16 and len(banks(24 + 8)) == 8  # BM + 8 alone: 2 and 4 lanes a bank
    config = wgmma.WgmmaHalfConfig("wg_fp16", (24, 128, 64), wgmma.HALF_STAGES)
    assert config.shared_bytes() == 4 * (24 + 128) * 128 + 4 * 16 + 1024  # 4 stages of 24 weight and 128 pixel 128-byte rows
    assert dataclasses.replace(config, links=OUTPUT).shared_bytes() - config.shared_bytes() == 8 * 16 * 40 * 2  # 8 warps' 16 rows


# ---- GPU ----


def cases():
    found = []
    for layer, spec in SPECS.items():
        for name in HALF:
            first = families.configure(spec, name)
            for config in dict.fromkeys([*families.FAMILIES[name].configs(spec), pipelined.with_split(first, 1)]):
                found.append((layer, NONE, config))
            found.append((layer, ADD_RELU, families.configure(spec, name, ADD_RELU)))
    return found


CASES = cases()


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "epilogue", "config"), CASES, ids=[f"{layer}{e.suffix}-{c}" for layer, e, c in CASES])
def test_each_narrow_configuration_is_within_its_formats_bound_and_rounds_as_the_format_does(layer, epilogue, config):
    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    spec, precision = SPECS[layer], HALF[config.family]
    seed, x, w, b, r = draw(spec, residual=epilogue.residual)
    assert families.unsupported_reason(spec, config, (w, b), epilogue) is None
    got = run_poisoned(spec, config, epilogue, x, w, b, r)
    assert_within_the_formats_bounds(got, spec, epilogue, x, w, b, r, precision, f"{config}{epilogue.suffix} on {layer} (seed {seed})")


@pytest.fixture(scope="module")
def narrow_block(tmp_path_factory):
    """MobileNetV2's inverted residual block on 16 channels: a 16-map stem and projection, a 48-map expand."""
    return load_model(save(mobilenet_block_model(channels=16), tmp_path_factory.mktemp("narrow") / "block16.onnx"))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_runner_in_a_half_precision_runs_a_16_channel_block_on_narrow_tiles_linked_within_the_formats_rule(narrow_block, precision):
    import onnxruntime

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    runner = Runner(narrow_block, 16, "cuda", precision=precision)
    steps = {s.name: s.implementation for s in runner.plan_record().steps}
    assert steps["stem"].startswith(f"conv.wg_{precision}_b16x") and steps["project"].startswith(f"conv.wg_{precision}_b16x")
    assert steps["stem"].split("+")[0].endswith(f"_h{OUTPUT}") and steps["project"].split("+")[0].endswith(f"_h{INPUT | RESIDUAL}")
    x = np.random.default_rng().standard_normal((16, 3, 12, 12)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    session = onnxruntime.InferenceSession(narrow_block.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(narrow_block, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
