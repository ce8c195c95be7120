"""dw_fp16 and dw_bf16: a depthwise Conv on operands in FP16 or BF16, what `--precision fp16|bf16` runs the depthwise
Convs in that wg_fp16 and wg_bf16 decline.

CPU: their names, limits and macros, the weights' layout and bits, which family a run in a half precision picks for
a Conv (and why none, where none can), and the CPU device's emulation of the step and of a MobileNet-V2 block. GPU
(`gpu` marker): each configuration against float64 on fresh random operands with its output poisoned first, element
by element within the bound of one rounding of each operand and FP32 sums (lab/format_bound.py), and against float64
on the operands rounded as the format rounds them within FP32 sums alone; a linked kernel writes, bit for bit, what
the unlinked one's output rounds to; the NaN/Inf flag it raises as it stores; a Runner in fp16 and bf16 on
MobileNet-V2's block within the format's rule of onnxruntime, eager and graphed, its NaN rerun on unlinked kernels.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import assert_within_the_formats_bounds, assert_within_the_formats_rule, draw
from onnx_builders import conv_spec as conv
from onnx_builders import save
from precision_cases import mobilenet_block_model

from opplugin.core.number_formats import UNIT_ROUNDOFF, half_bits, round_to
from opplugin.errors import PluginError
from opplugin.graph.model import load_model
from opplugin.lab.format_bound import FormatBound, bound_fraction
from opplugin.ops.activation import Activation
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import depthwise_half
from opplugin.ops.conv.families.depthwise_half import DepthwiseHalfConfig
from opplugin.ops.conv.families.channel_last import ALL_LINKS, INPUT, OUTPUT, RESIDUAL, channel_last_shape
from opplugin.ops.conv.plugin import ReferenceConvKernel, precision_fit
from opplugin.runtime import Runner

HALF = {"dw_fp16": "fp16", "dw_bf16": "bf16"}
ADD_CLIP = Epilogue(Activation("Clip", 0.0, 6.0), residual=True)  # MobileNetV2's project adds, its depthwise clips
SPECS = {
    "3x3_c32": conv(2, 32, 32, (13, 11), (3, 3), pads=(1, 1, 1, 1), group=32),  # tiles past the plane's edge
    "3x3_s2_c144": conv(3, 144, 144, (15, 17), (3, 3), pads=(1, 1, 1, 1), strides=(2, 2), group=144),  # 48 channels a block
    "5x5_c72_no_bias": conv(2, 72, 72, (14, 14), (5, 5), pads=(2, 2, 2, 2), group=72, bias=False),
    "5x5_s2_c40_asymmetric": conv(2, 40, 40, (16, 15), (5, 5), pads=(1, 2, 2, 1), strides=(2, 2), group=40),  # 40: 5 groups of 8
    "7x7_c96": conv(2, 96, 96, (9, 9), (7, 7), pads=(3, 3, 3, 3), group=96),
    "3x3_dilation2_c16": conv(2, 16, 16, (12, 12), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=16),
}


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


def linked(spec, name, links, epilogue=ADD_CLIP):
    return dataclasses.replace(families.configure(spec, name, epilogue), links=links)


# ---- CPU ----


def test_the_families_are_inexact_name_their_precision_and_their_names_round_trip():
    for name, precision in HALF.items():
        family = families.FAMILIES[name]
        assert (family.exact, family.precision, family.half_format, family.weights_at_build) == (False, precision, 1 if precision == "fp16" else 2, True)
        config = linked(SPECS["3x3_c32"], name, INPUT | OUTPUT)
        assert config.name() == f"{name}_t1x2_b7x12_p32_h3" and families.parse(config.name()) == (family, config)
        assert "_h" not in dataclasses.replace(config, links=0).name()
    spec = SPECS["3x3_c32"]
    assert not set(HALF) & set(families.usable_families(spec, ones(spec)))  # never the heuristic's: exact families alone
    assert set(HALF) <= set(families.usable_families(spec, ones(spec), exact_only=False))


def test_they_take_depthwise_convs_of_an_even_count_of_channels_and_say_why_not_others():
    def why(spec, variant="dw_fp16", weights=None, epilogue=NONE):
        return families.unsupported_reason(spec, variant, ones(spec) if weights is None else weights, epilogue)

    for spec in SPECS.values():
        assert why(spec) is None and why(spec, "dw_bf16", epilogue=ADD_CLIP) is None
    assert "each map reads one input channel (this Conv has 4 a group)" in why(conv(2, 128, 128, (8, 8), (3, 3), group=32))
    assert "a depth multiplier of 1 (one map a channel); this Conv has 2 a channel" in why(conv(2, 32, 64, (8, 8), (3, 3), group=32))
    assert why(conv(2, 12, 12, (8, 8), (3, 3), group=12)) is None  # 4 or 2 channels a thread
    assert "channels at least 2 at a time (4 bytes); this Conv has 13" in why(conv(2, 13, 13, (8, 8), (3, 3), group=13))
    assert "not a max pool" in why(SPECS["3x3_c32"], epilogue=Epilogue("Relu", (2, 2)))
    assert "the weights are not constant" in families.unsupported_reason(SPECS["3x3_c32"], "dw_fp16", None)  # converted at build
    spec = SPECS["3x3_c32"]
    assert "the kernel fuses no Add" in why(spec, linked(spec, "dw_fp16", RESIDUAL, NONE))
    assert "does not fit in registers" in why(spec, dataclasses.replace(linked(spec, "dw_fp16", 0), thread=(2, 4), block=(8, 16)))
    assert "whole runs of 8" in why(spec, dataclasses.replace(linked(spec, "dw_fp16", 0), planes=12))
    assert "8 channels a thread do not divide this Conv's 12" in why(conv(2, 12, 12, (8, 8), (3, 3), group=12),
                                                                     DepthwiseHalfConfig("dw_fp16", (1, 1), (8, 8), 24, 8))
    wide = conv(32, 144, 144, (56, 56), (5, 5), pads=(2, 2, 2, 2), strides=(2, 2), group=144)
    assert "window rows of 35 pixels are more than 32" in why(wide, DepthwiseHalfConfig("dw_fp16", (1, 16), (2, 32), 48, 2))
    with pytest.raises(PluginError, match="links 8"):
        families.compile_units(spec, dataclasses.replace(linked(spec, "dw_fp16", 0), links=8), ADD_CLIP)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_half_run_takes_the_gemm_else_the_depthwise_kernel_and_keeps_the_gemms_reasons_for_other_convs(precision):
    def fit(spec, epilogue=NONE):
        family, config, fused, reason = precision_fit(spec, ones(spec), epilogue, precision)
        return family, config and config.family, fused, reason

    dense = conv(2, 64, 64, (8, 8), (3, 3), pads=(1, 1, 1, 1))
    assert fit(dense) == (f"wg_{precision}", f"wg_{precision}", NONE, None)
    assert fit(SPECS["3x3_c32"], ADD_CLIP) == (f"dw_{precision}", f"dw_{precision}", ADD_CLIP, None)
    pooled = Epilogue("Relu", (2, 2))  # no max pool in the kernel: it runs the Conv, the pool follows
    assert fit(SPECS["3x3_c32"], pooled)[::2] == (f"dw_{precision}", NONE)
    grouped = conv(2, 128, 640, (8, 8), (3, 3), group=32)  # 4 channels, 20 maps a group: no narrow group, the GEMM's reason
    assert fit(grouped)[3] == f"wg_{precision} takes fewer than 32 maps a group only in whole 8-map blocks (a tile of exactly its maps); this Conv has 20 a group"
    stem = conv(2, 1, 4, (8, 8), (3, 3))  # one channel, one group: no depthwise Conv, the GEMM's reason
    assert fit(stem)[3].startswith(f"wg_{precision} takes fewer than 32 maps a group only in whole 8-map blocks")
    multiplied = conv(2, 32, 64, (8, 8), (3, 3), group=32)  # depthwise, 2 maps a channel: the depthwise kernel's reason
    assert fit(multiplied)[::3] == (f"dw_{precision}", f"dw_{precision} takes a depth multiplier of 1 (one map a channel); this Conv has 2 a channel")


def test_a_blocks_channels_divide_the_convs_and_in_a_small_launch_the_first_tile_keeps_within_the_register_budget():
    spec = SPECS["3x3_s2_c144"]
    assert depthwise_half.planes_for(spec) == 48 and depthwise_half.planes_for(SPECS["5x5_s2_c40_asymmetric"]) == 40
    assert depthwise_half.planes_for(spec, 2) == 48 and depthwise_half.planes_for(SPECS["5x5_s2_c40_asymmetric"], 2) == 40
    for spec in SPECS.values():
        configs = families.FAMILIES["dw_fp16"].configs(spec)
        first, *rest = configs
        assert first.vec == 8 and (depthwise_half.live_floats(spec, first.thread) <= depthwise_half.LIVE_FLOATS or first.thread == (1, 1))
        offered = {(vec, t) for vec, tiles in depthwise_half.THREAD_TILES.items() for t in tiles if spec.in_channels % vec == 0
                   and depthwise_half.row_values(spec, t) <= depthwise_half.MOST_ROW_VALUES}
        assert {(c.vec, c.thread) for c in configs} == offered
        for config in configs:
            assert spec.in_channels % config.planes == 0 and config.planes % config.vec == 0 and config.threads <= depthwise_half.MAX_THREADS
    assert families.configure(SPECS["3x3_c32"], "dw_fp16").thread == (1, 2)  # 3x3: 2 outputs, a row of 4 pixels
    assert families.configure(SPECS["7x7_c96"], "dw_fp16").thread == (1, 1)  # 7x7: a row of 7


def test_a_large_launch_takes_longer_rows_of_fewer_channels_a_thread_as_timed():
    def first(c, size, window, stride=1, batch=32):
        spec = conv(batch, c, c, (size, size), (window, window), pads=(window // 2,) * 4, strides=(stride, stride), group=c)
        config = families.configure(spec, "dw_fp16")
        return config.vec, config.thread

    assert first(384, 14, 7) == first(192, 28, 7) == first(672, 14, 5) == (2, (1, 16))  # short rows: 16 outputs of 2 channels
    assert first(120, 28, 5) == (4, (1, 4))  # a row of 28, channels in no whole 64-channel blocks
    assert first(96, 56, 7) == first(144, 56, 3) == (4, (1, 4))  # long rows
    assert first(144, 56, 5, stride=2) == (2, (1, 8))
    assert first(96, 112, 3, stride=2)[0] == 8 and first(384, 14, 7, batch=1)[0] == 8  # the small launch's rule


def test_the_macros_say_the_format_of_each_linked_tensor():
    spec = SPECS["3x3_c32"]
    [unit] = families.compile_units(spec, linked(spec, "dw_bf16", ALL_LINKS), ADD_CLIP)
    assert (unit.source, unit.function) == ("conv_depthwise_half.cu", "conv_depthwise_half")
    assert unit.defines["HALF_OPERANDS"] == unit.defines["X_CHANNEL_LAST"] == unit.defines["Y_CHANNEL_LAST"] == unit.defines["R_CHANNEL_LAST"] == 2
    [plain] = families.compile_units(spec, linked(spec, "dw_fp16", 0), ADD_CLIP)
    assert plain.defines["HALF_OPERANDS"] == 1 and not {"X_CHANNEL_LAST", "Y_CHANNEL_LAST", "R_CHANNEL_LAST"} & set(plain.defines)
    [output] = families.compile_units(spec, linked(spec, "dw_fp16", OUTPUT), ADD_CLIP)
    assert output.defines["Y_CHANNEL_LAST"] == 1 and "X_CHANNEL_LAST" not in output.defines
    assert families.FAMILIES["dw_fp16"].channel_last_links(spec, ADD_CLIP) == ALL_LINKS
    assert families.FAMILIES["dw_fp16"].channel_last_links(spec, NONE) == INPUT | OUTPUT  # no Add, no residual to take


def test_weights_go_in_tap_major_as_the_formats_bits():
    spec = SPECS["5x5_c72_no_bias"]
    w = np.random.default_rng(3).standard_normal(spec.weight_shape).astype(np.float32)
    taps = depthwise_half.tap_major_weights(w)
    assert taps.shape == (5, 5, 72) and taps.flags.c_contiguous and taps[1, 3, 40] == w[40, 0, 1, 3]
    bits = half_bits(taps, "bf16")
    assert np.array_equal((bits.astype(np.uint32) << 16).view(np.float32), round_to(taps, "bf16"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_the_cpu_the_reference_emulates_the_kernel_rounding_x_and_w_alone(precision):
    """The CPU device's `reference.fp16` of a depthwise step: X and W rounded to the format, the sums, bias, residual
    and activation in FP32, as dw_fp16 computes (the residual is not rounded: an unlinked kernel reads it in FP32)."""
    spec = SPECS["3x3_s2_c144"]
    _, x, w, b, r = draw(spec, residual=True)
    [got] = ReferenceConvKernel(spec, ADD_CLIP, precision)([x, w, b, r])
    assert got.dtype == np.float32
    rx, rw = round_to(x, precision), round_to(w, precision)
    as_rounded = reference.expected(spec, ADD_CLIP, rx, rw, b, r)
    assert bound_fraction(got, as_rounded, FormatBound(precision, operands_in_format=True).per_element(spec, ADD_CLIP, rx, rw, b, r)) <= 1
    unrounded = reference.expected(spec, ADD_CLIP, x, w, b, r)
    error = np.linalg.norm(got - unrounded) / np.linalg.norm(unrounded)
    assert UNIT_ROUNDOFF[precision] / 20 < error < 4 * UNIT_ROUNDOFF[precision], error  # it rounded, to this format


@pytest.fixture(scope="module")
def mobilenet_block(tmp_path_factory):
    return load_model(save(mobilenet_block_model(), tmp_path_factory.mktemp("dw_half") / "mobilenet_block.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_the_cpu_a_half_run_emulates_every_conv_of_a_mobilenet_block_the_depthwise_one_too(mobilenet_block, precision):
    steps = {s.name: s for s in Runner(mobilenet_block, 4, "cpu", precision=precision).plan_record().steps}
    assert steps["depthwise"].implementation == f"conv.reference.{precision}+clip0_6"  # FP32, "wg_fp16 takes fewer than 32 maps ..." before
    assert all(step.precision == precision for step in steps.values())
    x = np.random.default_rng(7).standard_normal((4, 3, 12, 12)).astype(np.float32)
    exact = Runner(mobilenet_block, 4, "cpu").run({"x": x}).outputs["y"]
    emulated = Runner(mobilenet_block, 4, "cpu", precision=precision).run({"x": x}).outputs["y"]
    error = np.linalg.norm(emulated - exact) / np.linalg.norm(exact)
    assert 0 < error < 8 * UNIT_ROUNDOFF[precision], error


# ---- GPU ----


def run_poisoned(spec, config, epilogue, x, w, b, r=None):
    import cupy

    kernel = families.build_kernel(spec, config, (w, b), epilogue)
    assert kernel.variant == config.name() and not kernel.nonfinite_exact and kernel.flags_nonfinite
    out = cupy.full(spec.output_shape(), cupy.nan, dtype=cupy.float32)
    inputs = [cupy.asarray(x), None, None] + ([] if r is None else [cupy.asarray(r)])
    [y] = kernel(inputs, None, out=out)
    assert y is out
    got = cupy.asnumpy(y)
    assert not np.isnan(got).any(), f"{config}: {int(np.isnan(got).sum())} outputs never written"
    return got


CASES = [(layer, epilogue, config) for layer, spec in SPECS.items() for name in HALF for epilogue in (NONE, ADD_CLIP)
         for config in families.FAMILIES[name].configs(spec, epilogue)]


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "epilogue", "config"), CASES, ids=[f"{layer}{e.suffix}-{c}" for layer, e, c in CASES])
def test_each_configuration_is_within_its_formats_bound_and_rounds_as_the_format_does(layer, epilogue, config):
    spec, precision = SPECS[layer], HALF[config.family]
    seed, x, w, b, r = draw(spec, residual=epilogue.residual)
    b = b if spec.has_bias else None
    got = run_poisoned(spec, config, epilogue, x, w, b, r)
    assert_within_the_formats_bounds(got, spec, epilogue, x, w, b, r, precision, f"{config}{epilogue.suffix} on {layer} (seed {seed})")


def as_channel_last_bits(values: np.ndarray, precision: str):
    import cupy

    return cupy.asarray(np.ascontiguousarray(half_bits(values, precision).transpose(0, 2, 3, 1)))


LINK_CASES = [(layer, name, links, vec) for layer in ("3x3_s2_c144", "7x7_c96") for name in HALF
              for links in (INPUT, OUTPUT, INPUT | OUTPUT, ALL_LINKS) for vec in (8, 2)]


def tile_of(spec, name, links, vec):
    """The first configuration of `vec` channels a thread the family offers, with these links."""
    config = next(c for c in families.FAMILIES[name].configs(spec, ADD_CLIP) if c.vec == vec)
    return dataclasses.replace(config, links=links)


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "name", "links", "vec"), LINK_CASES)
def test_a_linked_kernel_writes_the_bits_its_unlinked_self_rounds_to(layer, name, links, vec):
    """X and the residual as the format's bits channel-last where linked, as FP32 values of the same numbers where
    not: the same products in the same order, so a linked output is the unlinked one rounded, and an FP32 one equal."""
    import cupy

    spec, precision = SPECS[layer], HALF[name]
    seed, x, w, b, r = draw(spec, residual=True)
    x, r = round_to(x, precision), round_to(r, precision)  # values the format holds, so both kernels read the same
    expected = run_poisoned(spec, tile_of(spec, name, 0, vec), ADD_CLIP, x, w, b, r)
    kernel = families.build_kernel(spec, tile_of(spec, name, links, vec), (w, b), ADD_CLIP)
    x_in = as_channel_last_bits(x, precision) if links & INPUT else cupy.asarray(x)
    r_in = as_channel_last_bits(r, precision) if links & RESIDUAL else cupy.asarray(r)
    if links & OUTPUT:
        out = cupy.full(channel_last_shape(spec.output_shape()), 0xFFFF, cupy.uint16)  # NaN in both formats
        want = half_bits(expected, precision).transpose(0, 2, 3, 1)
    else:
        out, want = cupy.full(spec.output_shape(), cupy.nan, cupy.float32), expected
    [got] = kernel([x_in, None, None, r_in], None, out=out)
    assert got is out
    differ = int((cupy.asnumpy(got) != want).sum())
    assert differ == 0, f"{kernel.name} (seed {seed}): {differ} outputs differ from the unlinked kernel's"


@pytest.mark.gpu
@pytest.mark.parametrize("links", [0, OUTPUT])
def test_the_kernel_flags_nan_and_inf_as_it_stores_them_past_fp16s_range_too(links):
    import cupy

    spec = SPECS["3x3_c32"]
    _, x, w, b, _ = draw(spec)
    kernel = families.build_kernel(spec, linked(spec, "dw_fp16", links, NONE), (w, b), NONE)

    def flagged(x):
        flag = cupy.zeros(1, cupy.uint8)
        kernel([cupy.asarray(x), None, None], None, nonfinite=flag.data.ptr)
        return bool(flag.get()[0])

    assert not flagged(x)
    large = x.copy()
    large[1, 5, 6, 7] = 60000.0  # finite in FP16, its sums past 65504 at places: an infinity once stored in FP16
    w[5] = 4.0
    kernel = families.build_kernel(spec, linked(spec, "dw_fp16", links, NONE), (w, b), NONE)
    assert flagged(large) == bool(links & OUTPUT)  # an FP32 output holds the finite sum
    nan = x.copy()
    nan[0, 3, 2, 2] = np.nan
    assert flagged(nan)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_runner_in_a_half_precision_links_a_mobilenet_block_and_stays_within_the_formats_rule(mobilenet_block, precision):
    import onnxruntime

    if not families.FAMILIES[f"wg_{precision}"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    runner = Runner(mobilenet_block, 16, "cuda", precision=precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["depthwise"].implementation.startswith(f"conv.dw_{precision}_") and steps["depthwise"].implementation.endswith("_h3+clip0_6")
    assert steps["project"].implementation.endswith("_h5+add")
    x = np.random.default_rng().standard_normal((16, 3, 12, 12)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    session = onnxruntime.InferenceSession(mobilenet_block.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(mobilenet_block, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
    x[3, 1, 4, 5] = np.nan  # a chunk that meets NaN runs again on the exact path, where nothing is linked
    [with_nan] = session.run(None, {"x": x})
    for run in (runner, eager):
        again = run.run({"x": x}).outputs["y"]
        assert np.array_equal(np.isnan(again), np.isnan(with_nan)) and np.isnan(again).any()
        exact = run.exact.split_executor()
        assert not any("_h" in (kernel.variant or "") for kernel in exact.kernels.values())  # FP32 tensors, unlinked kernels
