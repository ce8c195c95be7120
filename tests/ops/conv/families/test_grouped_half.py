"""gw_fp16 and gw_bf16: a grouped Conv of narrow groups (ResNeXt's, RegNet's) on operands in FP16 or BF16, what
`--precision fp16|bf16` runs such Convs in, where wg_fp16 and wg_bf16 decline a group of 4 maps or run one of 8 or 16
on a GEMM tile of that many maps.

CPU: their names, limits and macros, the weights' layout and bits, which family a run in a half precision picks for
grouped, depthwise and dense Convs (and why none, where none can), and the CPU device's emulation of the step and of
a ResNeXt-like block. GPU (`gpu` marker): each configuration against float64 on fresh random operands with its output
poisoned first, within the format's bounds (family_gpu_checks); a linked kernel writes, bit for bit, what the unlinked
one's output rounds to; the NaN/Inf flag it raises as it stores; a Runner in fp16 and bf16 on the ResNeXt-like block
within the format's rule of onnxruntime, eager and graphed.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import assert_within_the_formats_bounds, assert_within_the_formats_rule, draw
from onnx_builders import conv_spec as conv
from onnx_builders import save
from precision_cases import resnext_block_model

from opplugin.core.number_formats import UNIT_ROUNDOFF, half_bits, round_to
from opplugin.errors import PluginError
from opplugin.graph.model import load_model
from opplugin.lab.format_bound import FormatBound, bound_fraction
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import grouped_half
from opplugin.ops.conv.families.channel_last import ALL_LINKS, INPUT, OUTPUT, RESIDUAL, channel_last_shape
from opplugin.ops.conv.families.grouped_half import GroupedHalfConfig
from opplugin.ops.conv.plugin import ReferenceConvKernel, precision_fit
from opplugin.runtime import Runner

HALF = {"gw_fp16": "fp16", "gw_bf16": "bf16"}
ADD_RELU = Epilogue("Relu", residual=True)
SPECS = {
    "g4_c32": conv(2, 32, 32, (13, 11), (3, 3), pads=(1, 1, 1, 1), group=8),  # ResNeXt's stage 1: 4 channels, 4 maps; tiles overhang
    "g8_c64_s2": conv(3, 64, 64, (15, 17), (3, 3), pads=(1, 1, 1, 1), strides=(2, 2), group=8),  # 8 and 8, stride 2
    "g16_m8_c48_no_bias": conv(2, 48, 24, (9, 9), (3, 3), pads=(1, 1, 1, 1), group=3, bias=False),  # 16 channels (two loads), 8 maps
    "g2_m6_c12": conv(2, 12, 36, (8, 8), (3, 3), pads=(1, 1, 1, 1), group=6),  # 2 channels, 6 maps a group
    "g8_5x5_dilation2": conv(2, 16, 16, (12, 12), (5, 5), pads=(2, 3, 3, 2), dilations=(2, 2), group=2),
}


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


def linked(spec, name, links, epilogue=ADD_RELU):
    return dataclasses.replace(families.configure(spec, name, epilogue), links=links)


# ---- CPU ----


def test_the_families_are_inexact_name_their_precision_and_their_names_round_trip():
    for name, precision in HALF.items():
        family = families.FAMILIES[name]
        assert (family.exact, family.precision, family.half_format, family.weights_at_build) == (False, precision, 1 if precision == "fp16" else 2, True)
        config = linked(SPECS["g8_c64_s2"], name, INPUT | OUTPUT)
        assert config.name().startswith(f"{name}_t") and config.name().endswith("_h3")
        assert families.parse(config.name()) == (family, config) and "_h" not in dataclasses.replace(config, links=0).name()
    spec = SPECS["g4_c32"]
    assert families.configure(spec, "gw_fp16").name() == "gw_fp16_t1x2_b5x12_p32_v4"
    assert not set(HALF) & set(families.usable_families(spec, ones(spec)))  # never the heuristic's: exact families alone
    assert set(HALF) <= set(families.usable_families(spec, ones(spec), exact_only=False))


def test_they_take_narrow_groups_and_say_why_not_other_convs():
    def why(spec, variant="gw_fp16", weights=None, epilogue=NONE):
        return families.unsupported_reason(spec, variant, ones(spec) if weights is None else weights, epilogue)

    for spec in SPECS.values():
        assert why(spec) is None and why(spec, "gw_bf16", epilogue=ADD_RELU) is None
    assert "runs grouped Convs; this one has one group" in why(conv(2, 8, 8, (8, 8), (3, 3)))
    assert "groups of 2, 4, 8 or 16 input channels (a pixel's in one or two loads); this Conv has 1 a group" in why(conv(2, 32, 32, (8, 8), (3, 3), group=32))
    assert "this Conv has 32 a group" in why(conv(2, 64, 64, (8, 8), (3, 3), group=2))
    assert "this Conv has 3 a group" in why(conv(2, 12, 12, (8, 8), (3, 3), group=4))
    assert "an even count of maps up to 8; this Conv has 5 a group" in why(conv(2, 8, 10, (8, 8), (3, 3), group=2))
    assert "an even count of maps up to 8; this Conv has 16 a group" in why(conv(2, 48, 48, (8, 8), (3, 3), group=3))  # RegNet's
    assert "not a max pool" in why(SPECS["g4_c32"], epilogue=Epilogue("Relu", (2, 2)))
    assert "rearranges them once, at build time" in families.unsupported_reason(SPECS["g4_c32"], "gw_fp16", None)
    spec = SPECS["g8_c64_s2"]
    plain = linked(spec, "gw_fp16", 0)
    assert "the kernel fuses no Add" in why(spec, linked(spec, "gw_fp16", RESIDUAL, NONE))
    assert "(at most 32 sums)" in why(spec, dataclasses.replace(plain, vec=8, thread=(2, 4), block=(8, 16)))
    assert "need 178 floats in registers, at most 136" in why(SPECS["g16_m8_c48_no_bias"], dataclasses.replace(plain, vec=2, thread=(1, 8), block=(2, 16), planes=8))
    assert "8 maps a thread do not divide a group's 6" in why(SPECS["g2_m6_c12"], GroupedHalfConfig("gw_fp16", (1, 1), (8, 8), 24, 8))
    assert "whole runs of 4" in why(spec, GroupedHalfConfig("gw_fp16", (1, 1), (8, 8), 6, 4))
    assert "2, 4 or 8 maps" in why(spec, GroupedHalfConfig("gw_fp16", (1, 1), (8, 8), 16, 16))
    with pytest.raises(PluginError, match="links 8"):
        families.compile_units(spec, dataclasses.replace(plain, links=8), ADD_RELU)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_half_run_takes_narrow_groups_here_wider_ones_on_the_gemm_and_depthwise_ones_on_the_depthwise_kernel(precision):
    def fit(spec, epilogue=NONE):
        family, config, fused, reason = precision_fit(spec, ones(spec), epilogue, precision)
        return family, config and config.family, fused, reason

    gw, wg, dw = f"gw_{precision}", f"wg_{precision}", f"dw_{precision}"
    for c, groups in ((128, 32), (256, 32)):  # ResNeXt-50's stages 1 and 2: 4 and 8 channels and maps a group
        assert fit(conv(2, c, c, (8, 8), (3, 3), pads=(1, 1, 1, 1), group=groups), ADD_RELU) == (gw, gw, ADD_RELU, None)
    for c, groups in ((512, 32), (144, 9), (320, 20), (1024, 32)):  # groups of 16 (ResNeXt's stage 3, RegNet's) and 32: the GEMM
        assert fit(conv(2, c, c, (7, 7), (3, 3), pads=(1, 1, 1, 1), group=groups)) == (wg, wg, NONE, None)
    assert fit(conv(2, 64, 64, (8, 8), (3, 3), pads=(1, 1, 1, 1))) == (wg, wg, NONE, None)  # dense
    assert fit(conv(2, 32, 32, (8, 8), (3, 3), group=32))[:2] == (dw, dw)  # depthwise
    pooled = Epilogue("Relu", (2, 2))  # no max pool in the kernel: it runs the Conv, the pool follows
    assert fit(SPECS["g4_c32"], pooled)[::2] == (gw, NONE)
    odd = conv(2, 48, 48, (8, 8), (3, 3), group=16)  # 3 channels a group: narrow, neither takes it, the grouped kernel's reason
    assert fit(odd)[::3] == (gw, f"{gw} takes groups of 2, 4, 8 or 16 input channels (a pixel's in one or two loads); this Conv has 3 a group")


def test_blocks_hold_whole_runs_and_the_first_pick_follows_the_rule_of_thumb():
    for spec in SPECS.values():
        configs = families.FAMILIES["gw_fp16"].configs(spec)
        assert configs and len(set(configs)) == len(configs)
        for config in configs:
            maps = spec.out_channels // spec.group
            assert maps % config.vec == 0 and spec.out_channels % config.planes == 0 and config.planes <= grouped_half.BLOCK_MAPS
            assert config.threads <= grouped_half.MAX_THREADS
        first = configs[0]
        assert (first.vec, first.thread) == grouped_half.first_tile(spec, [(c.vec, c.thread) for c in configs])

    def first(batch, c, size, groups):
        config = families.configure(conv(batch, c, c, (size, size), (3, 3), pads=(1, 1, 1, 1), group=groups), "gw_fp16")
        return config.vec, config.thread

    assert first(32, 256, 28, 32) == (8, (1, 4))  # 8 channels: 8 maps of 4 pixels within LIVE_FLOATS, a full launch
    assert first(32, 128, 56, 32) == (4, (1, 8))  # 4 maps a group: 4 maps of 8 pixels
    spec = conv(32, 512, 256, (14, 14), (3, 3), pads=(1, 1, 1, 1), group=32)  # 16 channels, 8 maps a group
    assert families.configure(spec, "gw_fp16").thread == (1, 2)  # 16 channels a pixel: a shorter row
    assert first(1, 256, 28, 32) == (4, (1, 2))  # a small launch: the fitting tile of the most threads


def test_the_macros_say_the_format_of_each_linked_tensor():
    spec = SPECS["g8_c64_s2"]
    [unit] = families.compile_units(spec, linked(spec, "gw_bf16", ALL_LINKS), ADD_RELU)
    assert (unit.source, unit.function) == ("conv_grouped_half.cu", "conv_grouped_half")
    assert unit.defines["HALF_OPERANDS"] == unit.defines["X_CHANNEL_LAST"] == unit.defines["Y_CHANNEL_LAST"] == unit.defines["R_CHANNEL_LAST"] == 2
    assert unit.defines["G"] == 8 and unit.defines["VEC"] == linked(spec, "gw_bf16", 0).vec
    [plain] = families.compile_units(spec, linked(spec, "gw_fp16", 0), ADD_RELU)
    assert plain.defines["HALF_OPERANDS"] == 1 and not {"X_CHANNEL_LAST", "Y_CHANNEL_LAST", "R_CHANNEL_LAST"} & set(plain.defines)
    assert families.FAMILIES["gw_fp16"].channel_last_links(spec, ADD_RELU) == ALL_LINKS
    assert families.FAMILIES["gw_fp16"].channel_last_links(spec, NONE) == INPUT | OUTPUT  # no Add, no residual to take


def test_weights_go_channel_major_a_taps_maps_side_by_side_as_the_formats_bits():
    spec = SPECS["g2_m6_c12"]
    w = np.random.default_rng(3).standard_normal(spec.weight_shape).astype(np.float32)
    arranged = grouped_half.channel_major_weights(w)
    assert arranged.shape == (3, 3, 2, 36) and arranged.flags.c_contiguous and arranged[1, 2, 1, 29] == w[29, 1, 1, 2]
    assert grouped_half.GroupedHalfKernel.arranged_weights(w).tobytes() == arranged.tobytes()
    bits = half_bits(arranged, "bf16")
    assert np.array_equal((bits.astype(np.uint32) << 16).view(np.float32), round_to(arranged, "bf16"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_the_cpu_the_reference_emulates_the_kernel_rounding_x_and_w_alone(precision):
    spec = SPECS["g8_c64_s2"]
    _, x, w, b, r = draw(spec, residual=True)
    [got] = ReferenceConvKernel(spec, ADD_RELU, precision)([x, w, b, r])
    rx, rw = round_to(x, precision), round_to(w, precision)
    as_rounded = reference.expected(spec, ADD_RELU, rx, rw, b, r)
    assert bound_fraction(got, as_rounded, FormatBound(precision, operands_in_format=True).per_element(spec, ADD_RELU, rx, rw, b, r)) <= 1
    unrounded = reference.expected(spec, ADD_RELU, x, w, b, r)
    error = np.linalg.norm(got - unrounded) / np.linalg.norm(unrounded)
    assert UNIT_ROUNDOFF[precision] / 20 < error < 4 * UNIT_ROUNDOFF[precision], error  # it rounded, to this format


@pytest.fixture(scope="module")
def resnext_block(tmp_path_factory):
    return load_model(save(resnext_block_model(), tmp_path_factory.mktemp("gw_half") / "resnext_block.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_the_cpu_a_half_run_emulates_every_conv_of_a_resnext_block_the_grouped_ones_too(resnext_block, precision):
    steps = {s.name: s for s in Runner(resnext_block, 4, "cpu", precision=precision).plan_record().steps}
    assert steps["grouped4"].implementation == f"conv.reference.{precision}+relu"  # FP32 before: wg_fp16 declined 4 maps a group
    assert all(step.precision == precision for step in steps.values())
    x = np.random.default_rng(7).standard_normal((4, 3, 10, 10)).astype(np.float32)
    exact = Runner(resnext_block, 4, "cpu").run({"x": x}).outputs["y"]
    emulated = Runner(resnext_block, 4, "cpu", precision=precision).run({"x": x}).outputs["y"]
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


CASES = [(layer, epilogue, config) for layer, spec in SPECS.items() for name in HALF for epilogue in (NONE, ADD_RELU)
         for config in families.FAMILIES[name].configs(spec, epilogue)]


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "epilogue", "config"), CASES, ids=[f"{layer}{e.suffix}-{c}" for layer, e, c in CASES])
def test_each_configuration_is_within_its_formats_bounds(layer, epilogue, config):
    spec, precision = SPECS[layer], HALF[config.family]
    seed, x, w, b, r = draw(spec, residual=epilogue.residual)
    b = b if spec.has_bias else None
    got = run_poisoned(spec, config, epilogue, x, w, b, r)
    assert_within_the_formats_bounds(got, spec, epilogue, x, w, b, r, precision, f"{config}{epilogue.suffix} on {layer} (seed {seed})")


def as_channel_last_bits(values: np.ndarray, precision: str):
    import cupy

    return cupy.asarray(np.ascontiguousarray(half_bits(values, precision).transpose(0, 2, 3, 1)))


LINK_CASES = [(layer, config, links) for layer in ("g4_c32", "g8_c64_s2", "g16_m8_c48_no_bias") for name in HALF
              for config in families.FAMILIES[name].configs(SPECS[layer], ADD_RELU) for links in (INPUT | OUTPUT, ALL_LINKS)]


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "config", "links"), LINK_CASES, ids=[f"{layer}-{c}-h{links}" for layer, c, links in LINK_CASES])
def test_a_linked_kernel_writes_the_bits_its_unlinked_self_rounds_to(layer, config, links):
    """X and the residual as the format's bits channel-last where linked, as FP32 values of the same numbers where
    not: the same products in the same order, so a linked output is the unlinked one rounded."""
    import cupy

    spec, precision = SPECS[layer], HALF[config.family]
    seed, x, w, b, r = draw(spec, residual=True)
    b = b if spec.has_bias else None
    x, r = round_to(x, precision), round_to(r, precision)  # values the format holds, so both kernels read the same
    expected = run_poisoned(spec, config, ADD_RELU, x, w, b, r)
    kernel = families.build_kernel(spec, dataclasses.replace(config, links=links), (w, b), ADD_RELU)
    r_in = as_channel_last_bits(r, precision) if links & RESIDUAL else cupy.asarray(r)
    out = cupy.full(channel_last_shape(spec.output_shape()), 0xFFFF, cupy.uint16)  # NaN in both formats
    [got] = kernel([as_channel_last_bits(x, precision), None, None, r_in], None, out=out)
    assert got is out
    differ = int((cupy.asnumpy(got) != half_bits(expected, precision).transpose(0, 2, 3, 1)).sum())
    assert differ == 0, f"{kernel.name} (seed {seed}): {differ} outputs differ from the unlinked kernel's"


@pytest.mark.gpu
@pytest.mark.parametrize("links", [0, OUTPUT])
def test_the_kernel_flags_nan_and_inf_as_it_stores_them_past_fp16s_range_too(links):
    import cupy

    spec = SPECS["g8_c64_s2"]
    _, x, w, b, _ = draw(spec)

    def flagged(x, w):
        kernel = families.build_kernel(spec, linked(spec, "gw_fp16", links, NONE), (w, b), NONE)
        flag = cupy.zeros(1, cupy.uint8)
        kernel([cupy.asarray(x), None, None], None, nonfinite=flag.data.ptr)
        return bool(flag.get()[0])

    assert not flagged(x, w)
    large, big_w = x.copy(), w.copy()
    large[1, 5, 6, 7] = 60000.0  # finite in FP16, its sums past 65504 at places: an infinity once stored in FP16
    big_w[:8] = 4.0  # the maps of channel 5's group
    assert flagged(large, big_w) == bool(links & OUTPUT)  # an FP32 output holds the finite sum
    nan = x.copy()
    nan[0, 3, 2, 2] = np.nan
    assert flagged(nan, w)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_runner_in_a_half_precision_links_a_resnext_block_and_stays_within_the_formats_rule(resnext_block, precision):
    import onnxruntime

    if not families.FAMILIES[f"wg_{precision}"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    runner = Runner(resnext_block, 16, "cuda", precision=precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["grouped4"].implementation.startswith(f"conv.gw_{precision}_") and steps["grouped4"].implementation.endswith("_h3+relu")
    assert steps["grouped8"].implementation.startswith(f"conv.gw_{precision}_") and "_h" in steps["grouped8"].implementation
    x = np.random.default_rng().standard_normal((16, 3, 10, 10)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    session = onnxruntime.InferenceSession(resnext_block.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(resnext_block, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
