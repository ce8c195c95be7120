"""The one grammar of configuration names (ops/config_grammar.py) on the CPU: every Conv and
Gemm family's configurations make names that parse back to the same Config, a family's name
alone stands for its heuristic's pick, and a bad name says in one line what is wrong."""
from __future__ import annotations

import dataclasses

import pytest

from onnx_builders import conv_spec as conv
from opplugin.errors import PluginError
from opplugin.lab import cnn_layers
from opplugin.ops import config_grammar
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.gemm import families as gemm_families
from opplugin.ops.gemm.spec import GemmSpec

SPECS = {
    "lenet86.conv1": conv(10000, 1, 4, (86, 86), (7, 7)),
    "lenet86.conv2": conv(10000, 4, 16, (40, 40), (7, 7)),
    "ece408_high.conv": conv(10000, 1, 50, (28, 28), (5, 5)),
    "depthwise": conv(4, 8, 8, (19, 21), (3, 3), pads=(1, 1, 1, 1), group=8),
    **{f"se squeeze 480->20 @{batch}": conv(batch, 480, 20, (1, 1), (1, 1)) for batch in (1, 32)},  # dense: the Gemm kernels
    **{f"{layer.name} @{batch}": layer.spec(batch) for layer in cnn_layers.LAYERS for batch in (1, 32)},
}
EPILOGUES = [NONE, Epilogue("Relu", (2, 2)), Epilogue("Relu", residual=True)]
GEMM_SPECS = [GemmSpec(1, 4096, 25088), GemmSpec(16, 128, 7200), GemmSpec(10000, 128, 7200), GemmSpec(10000, 10, 32)]


@pytest.mark.parametrize("family", list(families.FAMILIES))
def test_every_conv_configuration_round_trips_through_its_name(family):
    offered = 0
    for spec in SPECS.values():
        for epilogue in EPILOGUES:
            for config in families.FAMILIES[family].configs(spec, epilogue):
                name = config.name()
                assert families.configure(spec, name, epilogue) == config, name
                assert str(config) == name and name.startswith(family)
                offered += 1
    assert offered


def test_every_gemm_configuration_round_trips_through_its_name():
    configs = [default(spec) for spec in GEMM_SPECS for default in gemm_families.DEFAULTS.values()] + list(gemm_families.TILES)
    for config in configs:
        assert gemm_families.configure(GEMM_SPECS[0], config.name()) == config


def test_names_say_every_field_in_one_grammar():
    spec = SPECS["resnet 256->256 3x3 14 @32"]
    picks = {name: families.configure(spec, name).name() for name in ("tc_3xtf32", "simt_gemm", "implicit_gemm", "const_tile")}
    assert picks == {
        "tc_3xtf32": "tc_3xtf32_b128x64x32_w64x32_s3_k4",  # block tile and K depth, warp tile, stages, K split
        "simt_gemm": "simt_gemm_b128x64x16_t8x8_s4_o3",  # thread tile, registers for 3 blocks an SM; k1 is left out
        "implicit_gemm": "implicit_gemm_b128x32x16_t4x4",  # the K step that suits K = 2304, the thread tile of 256 threads
        "const_tile": "const_tile_t2x2_m16",
    }
    lenet = SPECS["lenet86.conv1"]
    assert families.configure(lenet, "const_rb", Epilogue("Relu", (2, 2))).name() == "const_rb_t4x1_m4"
    assert families.configure(lenet, "tiled").name() == "tiled_b16x16"
    assert families.configure(SPECS["lenet86.conv2"], "reduce_tree").name() == "reduce_tree_c2"
    assert families.configure(lenet, "baseline").name() == "baseline"
    assert gemm_families.configure(GemmSpec(16, 128, 7200), "gemv").name() == "gemv_w4x2_k16"
    assert gemm_families.configure(GemmSpec(10000, 128, 7200), "tiled").name() == "tiled_b64x64x16_t4x4"


def test_the_same_tag_means_the_same_thing_in_every_family():
    tags = {}
    for family in families.FAMILIES.values():
        for field in family.config_type.fields():
            tags.setdefault(field.metadata["tag"], set()).add(family.name)
    for config_type in gemm_families.CONFIGS.values():
        for field in config_type.fields():
            tags.setdefault(field.metadata["tag"], set()).add(config_type.__name__)
    assert set(tags) <= set(config_grammar.TAGS)  # each with its one meaning
    assert {"tc_3xtf32", "simt_gemm", "implicit_gemm", "tiled", "TiledConfig"} <= tags["b"]
    assert {"simt_gemm", "const_tile", "const_rb", "TiledConfig"} <= tags["t"]
    with pytest.raises(ValueError, match="add it to TAGS"):
        config_grammar.tagged("q")


def test_a_default_field_is_left_out_of_the_name_and_may_be_left_out_or_given():
    config = families.configure(SPECS["lenet86.conv1"], "tc_3xtf32_b32x64x32_w32x16_s3")
    assert config.splits == 1 and config.name() == "tc_3xtf32_b32x64x32_w32x16_s3"
    assert families.parse("tc_3xtf32_b32x64x32_w32x16_s3_k1")[1] == config
    assert dataclasses.replace(config, splits=2).name() == "tc_3xtf32_b32x64x32_w32x16_s3_k2"
    # fields in another order spell the same Config; its name keeps the family's order
    assert families.parse("tc_3xtf32_k2_s3_w32x16_b32x64x32")[1].name() == "tc_3xtf32_b32x64x32_w32x16_s3_k2"


def test_a_family_name_alone_is_the_heuristic_pick_for_the_node():
    spec = SPECS["lenet86.conv2"]
    family, config = families.parse("const_tile")
    assert family is families.FAMILIES["const_tile"] and config is None
    assert families.configure(spec, "const_tile") == family.configs(spec)[0]
    assert families.configure(spec, families.configure(spec, "const_tile")) == family.configs(spec)[0]
    # the longest family a name starts with owns it
    assert families.parse("const_mo_m8") == (families.FAMILIES["const_mo"], families.parse("const_mo_m8")[1])
    assert families.parse("const")[0].name == "const"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("winograd", ["unknown Conv variant 'winograd'", "the families are baseline, const, const_mo", "simt_gemm"]),
        ("const_rb_r8m4", ["const_rb has no field 'r'", "its fields are t (thread tile", "m (output maps a thread computes)"]),
        ("const_mo8", ["const has no field 'mo'", "its name alone is its whole configuration"]),
        ("tc_3xtf32_128x64", ["tc_3xtf32 has no field '128x64'", "b (block tile", "w (warp tile", "s (stages", "k (K split"]),
        ("tc_3xtf32_b128x64_w64x32_s3", ["the field 'b128x64' must be b and 3 integer(s) joined by 'x' (e.g. b8x8x8)"]),
        ("simt_gemm_b128x64x16_t8x8_s4_o3_kx", ["the field 'kx' must be k and 1 integer(s)"]),
        ("tc_3xtf32_b128x64x32", ["needs its field(s) w, s", "tc_3xtf32_b<int>x<int>x<int>_w<int>x<int>_s<int>[_k<int>]"]),
        ("reduce_tree_c2_c4", ["the field c is given twice"]),
        ("const_tile_t2x4_m", ["the field 'm' must be m and 1 integer(s)"]),
    ],
)
def test_a_bad_name_says_what_is_wrong_in_one_line(name, words):
    with pytest.raises(PluginError) as caught:
        families.parse(name)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(("unknown", repr(name)))
    for word in words:
        assert word in message, message
    assert families.unsupported_reason(SPECS["lenet86.conv1"], name, None) == message


def test_a_bad_gemm_name_lists_the_gemm_families_and_tags():
    with pytest.raises(PluginError, match="unknown Gemm variant 'fastest'; the families are gemv, tiled, rowwarp"):
        gemm_families.configure(GemmSpec(1, 8, 8), "fastest")
    with pytest.raises(PluginError, match=r"gemv has no field 'b'; its fields are w \(warp tile.*k \(K split"):
        gemm_families.configure(GemmSpec(1, 8, 8), "gemv_b4o2w8")
    spec = GemmSpec(10000, 128, 7200)
    odd = gemm_families.configure(spec, "tiled_b128x64x8_t8x4")  # parses; not one of the family's tiles
    assert "the tiles are tiled_b128x128x8_t8x8, tiled_b128x64x16_t8x4" in gemm_families.unsupported_reason(spec, odd)


def test_a_configuration_the_family_does_not_build_says_so():
    spec = SPECS["lenet86.conv1"]
    ones = (None, None)
    assert "one column" in families.unsupported_reason(spec, "const_rb_t4x2_m4", ones)
    assert "the tiles are tc_3xtf32_b128x128x32_w64x32_s3" in families.unsupported_reason(spec, "tc_3xtf32_b128x128x32_w64x64_s3", None)
    assert "tile width" in families.unsupported_reason(spec, "tiled_b8x16", ones)  # 128 threads, not a block's 256
