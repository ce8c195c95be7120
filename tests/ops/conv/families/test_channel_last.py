"""wg_fp16 and wg_bf16 with links (families/channel_last.py): X, Y and the residual operand kept channel-last in
the format. CPU: the names, the reasons, the macros, and that every link compiles for Hopper without spills.
GPU: a linked kernel fed the format's bits writes, bit for bit, what the unlinked kernel's FP32 output rounds to."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import draw
from onnx_builders import conv_spec as conv

from opplugin.core.number_formats import half_bits, round_to
from opplugin.errors import PluginError
from opplugin.lab import nvrtc_check
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined
from opplugin.ops.channel_last import channel_last_shape
from opplugin.ops.conv.families.channel_last import ALL_LINKS, INPUT, OUTPUT, RESIDUAL, linked_names
from opplugin.ops.activation import Activation
from opplugin.ops.conv.prologue import AFFINE, SCALE, Prologue

HALF = {"wg_fp16": "fp16", "wg_bf16": "bf16"}
ADD_RELU = Epilogue("Relu", residual=True)
SPEC = conv(3, 64, 96, (13, 11), (3, 3), pads=(1, 1, 1, 1))  # a short last map tile, pixels past a whole tile
DEEP = conv(2, 512, 64, (7, 7), (3, 3), pads=(1, 1, 1, 1))  # its first configuration splits K
STEM = conv(2, 3, 64, (20, 20), (7, 7), pads=(3, 3, 3, 3), strides=(2, 2))  # 3 channels padded to 8
# narrow map tiles (wgmma.NARROW_MAPS): 24 maps (staged rows of 40 halves), groups of 8 (of 24), a deep 16-map one split
NARROW = conv(3, 64, 24, (13, 11), (3, 3), pads=(1, 1, 1, 1))
NARROW_G8 = conv(3, 64, 64, (13, 11), (3, 3), pads=(1, 1, 1, 1), group=8)
NARROW_DEEP = conv(2, 512, 16, (7, 7), (3, 3), pads=(1, 1, 1, 1))
LINKED_SPECS = {"SPEC": SPEC, "DEEP": DEEP, "NARROW": NARROW, "NARROW_G8": NARROW_G8, "NARROW_DEEP": NARROW_DEEP}
SPLIT = (DEEP, NARROW_DEEP)  # their first configurations split K


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)


def linked(spec, name, links, epilogue=ADD_RELU):
    """The family's pick with these links; on SPLIT's, split K, else unsplit."""
    config = families.configure(spec, name, epilogue)
    return dataclasses.replace(config if spec in SPLIT else pipelined.with_split(config, 1), links=links)


def test_a_configurations_links_are_its_names_h_field_left_out_when_none():
    config = linked(SPEC, "wg_fp16", INPUT | RESIDUAL)
    assert config.name().endswith("_h5") and families.parse(config.name())[1] == config
    assert "_h" not in dataclasses.replace(config, links=0).name()
    assert linked_names(ALL_LINKS) == ["X", "Y", "the residual"] and channel_last_shape((2, 64, 5, 7)) == (2, 5, 7, 64)


def test_links_a_kernel_cannot_honour_are_refused_with_the_reason():
    w = ones(SPEC)
    assert families.unsupported_reason(SPEC, linked(SPEC, "wg_fp16", ALL_LINKS), w, ADD_RELU) is None
    assert "the kernel fuses no Add" in families.unsupported_reason(SPEC, linked(SPEC, "wg_fp16", RESIDUAL, NONE), w, NONE)
    scaled = Epilogue(prologue=Prologue(SCALE))  # a linked X takes its prologue in a pass of its own
    assert families.unsupported_reason(SPEC, linked(SPEC, "wg_bf16", INPUT, scaled), w, scaled) is None
    assert "pads its 3 channels to 8" in families.unsupported_reason(STEM, linked(STEM, "wg_fp16", INPUT, NONE), ones(STEM), NONE)
    assert families.unsupported_reason(STEM, linked(STEM, "wg_fp16", OUTPUT, NONE), ones(STEM), NONE) is None
    odd = conv(2, 64, 36, (8, 8), (1, 1))  # 36 maps: a pixel's run of maps is no whole number of 16-byte pieces
    assert "this Conv has 36 a group" in families.unsupported_reason(odd, linked(odd, "wg_fp16", OUTPUT, NONE), ones(odd), NONE)
    assert families.unsupported_reason(odd, linked(odd, "wg_fp16", INPUT, NONE), ones(odd), NONE) is None
    with pytest.raises(PluginError, match="links 8"):
        families.compile_units(SPEC, dataclasses.replace(linked(SPEC, "wg_fp16", 0), links=8), ADD_RELU)


def test_the_macros_say_the_format_of_each_linked_tensor_and_a_linked_x_is_not_rewritten():
    [gemm, rewrite] = families.compile_units(SPEC, linked(SPEC, "wg_bf16", OUTPUT | RESIDUAL), ADD_RELU)
    assert rewrite.function == "conv_split_channel_last"
    assert gemm.defines["Y_CHANNEL_LAST"] == gemm.defines["R_CHANNEL_LAST"] == gemm.defines["HALF_OPERANDS"] == 2
    units = families.compile_units(SPEC, linked(SPEC, "wg_fp16", INPUT), ADD_RELU)
    assert [u.function for u in units] == ["conv_wgmma"] and "Y_CHANNEL_LAST" not in units[0].defines
    for prologue in PROLOGUES.values():  # a linked X's prologue: its own pass, channel-last to channel-last
        epilogue = dataclasses.replace(ADD_RELU, prologue=prologue)
        units = families.compile_units(SPEC, linked(SPEC, "wg_fp16", INPUT, epilogue), epilogue)
        assert [u.function for u in units] == ["conv_wgmma", "conv_prologue_channel_last"]
        assert units[1].defines["PROLOGUE"] == units[0].defines["PROLOGUE"]


LINK_CASES = [(spec_name, name, links) for spec_name in LINKED_SPECS for name in HALF for links in (OUTPUT, ALL_LINKS)]
# a squeeze-and-excitation block's scale, DenseNet's BatchNormalization > Relu
PROLOGUES = {"scale": Prologue(SCALE), "bn_relu": Prologue(AFFINE, tuple(np.linspace(0.5, 1.5, 64)), tuple(np.linspace(-0.3, 0.3, 64)),
                                                       Activation("Relu"))}


@pytest.mark.parametrize(("spec_name", "name", "links"), LINK_CASES)
def test_every_link_compiles_for_hopper_without_spills(spec_name, name, links):
    spec = LINKED_SPECS[spec_name]
    config = linked(spec, name, links)
    assert (config.splits > 1) == (spec in SPLIT)  # the split K's reduce writes the linked output too
    assert config.bm == (spec.out_channels // spec.group if spec_name.startswith("NARROW") else 64)
    for usage in nvrtc_check.check_variant(spec, config.name(), "sm_90", ADD_RELU):
        assert usage.arch == "sm_90a" and usage.spill_stores == usage.spill_loads == usage.stack_frame == 0, usage


# ---- GPU ----


def as_channel_last_bits(values: np.ndarray, precision: str):
    import cupy

    return cupy.asarray(np.ascontiguousarray(half_bits(values, precision).transpose(0, 2, 3, 1)))


@pytest.mark.gpu
@pytest.mark.parametrize(("spec_name", "name", "links"), LINK_CASES)
def test_a_linked_kernel_writes_the_bits_its_unlinked_self_rounds_to(spec_name, name, links):
    """X and the residual given as the format's bits (channel-last) where linked, as FP32 values of the same
    numbers where not: the same products in the same order, so the linked output is the unlinked one rounded."""
    import cupy

    if not families.FAMILIES[name].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    spec, precision = LINKED_SPECS[spec_name], HALF[name]
    seed, x, w, b, r = draw(spec, residual=True)
    x, r = round_to(x, precision), round_to(r, precision)  # values the format holds, so both kernels read the same
    plain = families.build_kernel(spec, linked(spec, name, 0), (w, b), ADD_RELU)
    [y] = plain([cupy.asarray(x), None, None, cupy.asarray(r)], None, out=cupy.full(spec.output_shape(), cupy.nan, cupy.float32))
    expected = cupy.asnumpy(y)
    kernel = families.build_kernel(spec, linked(spec, name, links), (w, b), ADD_RELU)
    x_in = as_channel_last_bits(x, precision) if links & INPUT else cupy.asarray(x)
    r_in = as_channel_last_bits(r, precision) if links & RESIDUAL else cupy.asarray(r)
    poisoned = cupy.full(channel_last_shape(spec.output_shape()), 0xFFFF, cupy.uint16)  # NaN in both formats
    [got] = kernel([x_in, None, None, r_in], None, out=poisoned)
    assert got is poisoned and got.dtype == cupy.uint16
    want = half_bits(expected, precision).transpose(0, 2, 3, 1)
    assert np.array_equal(cupy.asnumpy(got), want), f"{kernel.name} (seed {seed}): {int((cupy.asnumpy(got) != want).sum())} outputs differ"
    exact = reference.expected(spec, ADD_RELU, x, w, b, r)
    assert np.linalg.norm(expected - exact) / np.linalg.norm(exact) < 1e-2  # and the unlinked one is the Conv


@pytest.mark.gpu
def test_a_linked_kernel_refuses_an_fp32_tensor_where_it_expects_the_formats_bits():
    import cupy

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    _, x, w, b, r = draw(SPEC, residual=True)
    kernel = families.build_kernel(SPEC, linked(SPEC, "wg_fp16", INPUT), (w, b), ADD_RELU)
    with pytest.raises(PluginError, match=r"input X is linked channel-last in 16 bits: expected a uint16 array of shape \(3, 13, 11, 64\)"):
        kernel([cupy.asarray(x), None, None, cupy.asarray(r)], None)


PROLOGUE_CASES = [(name, prologue, links) for name in HALF for prologue in PROLOGUES for links in (INPUT, ALL_LINKS)]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "prologue", "links"), PROLOGUE_CASES)
def test_a_linked_x_takes_its_prologue_as_the_unlinked_kernel_does(name, prologue, links):
    """The prologue on the format's values widened to FP32, rounded once for the GEMM: the operands, sums and
    output of the unlinked kernel fed the same values as FP32, bit for bit."""
    import cupy

    if not families.FAMILIES[name].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    precision = HALF[name]
    epilogue = dataclasses.replace(ADD_RELU, prologue=PROLOGUES[prologue])
    seed, x, w, b, r = draw(SPEC, residual=True)
    x, r = round_to(x, precision), round_to(r, precision)
    scale = np.random.default_rng(seed).uniform(0.1, 2.0, (SPEC.batch, SPEC.in_channels, 1, 1)).astype(np.float32)
    operand = [cupy.asarray(scale)] if epilogue.prologue.takes_operand else []
    plain = families.build_kernel(SPEC, linked(SPEC, name, 0, epilogue), (w, b), epilogue)
    [y] = plain([cupy.asarray(x), None, None, cupy.asarray(r), *operand], None, out=cupy.full(SPEC.output_shape(), cupy.nan, cupy.float32))
    expected = cupy.asnumpy(y)
    kernel = families.build_kernel(SPEC, linked(SPEC, name, links, epilogue), (w, b), epilogue)
    r_in = as_channel_last_bits(r, precision) if links & RESIDUAL else cupy.asarray(r)
    out = cupy.full(channel_last_shape(SPEC.output_shape()), 0xFFFF, cupy.uint16) if links & OUTPUT else \
        cupy.full(SPEC.output_shape(), cupy.nan, cupy.float32)
    [got] = kernel([as_channel_last_bits(x, precision), None, None, r_in, *operand], None, out=out)
    want = half_bits(expected, precision).transpose(0, 2, 3, 1) if links & OUTPUT else expected
    assert got is out and np.array_equal(cupy.asnumpy(got), want), \
        f"{kernel.name} (seed {seed}): {int((cupy.asnumpy(got) != want).sum())} outputs differ from the unlinked kernel's"
    exact = reference.expected(SPEC, epilogue, x, w, b, r, scale=scale if operand else None)
    assert np.linalg.norm(expected - exact) / np.linalg.norm(exact) < 1e-2  # and the unlinked one is the Conv
