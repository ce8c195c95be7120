"""wg_fp16 and wg_bf16: the Hopper implicit GEMM on operands in FP16 or BF16, what `--precision fp16|bf16` runs a Conv in.

CPU: their names, limits and shared memory, the weights' bits, and the plan's choice (the reference emulating the
precision on the CPU device). GPU (`gpu` marker; Hopper alone): each configuration against float64 on fresh random
operands with its output poisoned with NaN first, element by element within the bound of one rounding of each
operand and FP32 sums, and against float64 on the operands rounded as the format rounds them, within FP32 sums
alone: a kernel that rounded to the other format, or not at all, fails the second.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from family_gpu_checks import assert_within_the_formats_rule, draw, run_poisoned
from onnx_builders import conv_spec as conv
from onnx_builders import save
from precision_cases import conv_pair_model

from opplugin.core import paths
from opplugin.errors import InputError
from opplugin.core.number_formats import UNIT_ROUNDOFF, half_bits, round_to
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.conv import families, reference, tuning_cache
from opplugin.ops.conv.choice import tuning_key
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import channel_last, pipelined, wgmma
from opplugin.ops.conv.plugin import conv_spec as conv_spec_of
from opplugin.ops.conv.plugin import constant_weights, epilogue_of, fitted
from opplugin.ops.conv.prologue import SCALE, Prologue
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import step_precisions
from opplugin.runtime import Runner
from opplugin.runtime.plan_record import record_plan_alone

HALF = {"wg_fp16": "fp16", "wg_bf16": "bf16"}
FP32_SUMS = 2.0 ** -24  # a float32 sum of k terms is off by at most about k times this of the terms' magnitudes
SPECS = {
    "3x3_c64": conv(2, 64, 64, (20, 20), (3, 3), pads=(1, 1, 1, 1)),
    "3x3_c128_m70_stride2": conv(3, 128, 70, (15, 17), (3, 3), pads=(1, 1, 1, 1), strides=(2, 2)),  # a short last map tile
    "1x1_c256": conv(2, 256, 128, (7, 7), (1, 1), bias=False),
    "grouped_c128_g2": conv(2, 128, 96, (9, 9), (3, 3), pads=(1, 1, 1, 1), group=2),  # 64 channels a group
    "deep_k_c512": conv(1, 512, 64, (7, 7), (3, 3), pads=(1, 1, 1, 1)),  # a K split
    # fewer channels a group than a slice holds: a slice spans taps, the last one partly past K
    "stem_c3_7x7_stride2": conv(2, 3, 64, (40, 36), (7, 7), pads=(3, 3, 3, 3), strides=(2, 2)),  # padded to 8 channels
    "stem_c3_11x11_stride4": conv(2, 3, 64, (47, 51), (11, 11), pads=(2, 2, 2, 2), strides=(4, 4)),  # 8 taps a slice
    # windows past 3x3: each producer copy tests its own tap against the image (the stems too); odd pads, a K split
    "11x11_c64_odd_pads": conv(1, 64, 64, (15, 13), (11, 11), pads=(5, 4, 6, 5)),
    "3x3_c96": conv(2, 96, 40, (11, 13), (3, 3), pads=(1, 1, 1, 1)),  # a tap and a half a slice
    "1x1_c24": conv(3, 24, 144, (9, 9), (1, 1)),  # K = 24: one slice, 40 of its k past K
    "grouped_c32_g2": conv(2, 32, 96, (10, 10), (3, 3), pads=(1, 1, 1, 1), group=2),  # 16 channels, 48 maps a group
}


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


# ---- CPU ----


def test_the_half_families_are_inexact_and_name_their_precision():
    for name, precision in HALF.items():
        family = families.FAMILIES[name]
        assert (family.exact, family.precision, family.half_format) == (False, precision, 1 if precision == "fp16" else 2)
        assert families.family_of(f"{name}_b128x128x64_s4").name == name
    assert families.FAMILIES["wg_fp16"].max_relative_error < families.FAMILIES["wg_bf16"].max_relative_error


def test_a_slice_is_64_channels_of_one_tap_in_half_the_bytes_of_3xtf32s():
    spec = SPECS["3x3_c64"]
    half, exact = families.configure(spec, "wg_fp16"), families.configure(spec, "wg_3xtf32")
    assert half.bk == 64 and exact.bk == 32
    assert half.shared_bytes() - 1024 - 16 * half.stages == half.stages * (half.bm + half.bn) * 128  # values alone, 2 bytes each
    assert exact.shared_bytes() - 1024 - 16 * exact.stages == exact.stages * (exact.bm + exact.bn) * 256  # values and small parts
    [unit, *_] = families.compile_units(spec, half)
    assert unit.defines["HALF_OPERANDS"] == 1 and unit.defines["BK"] == 64
    assert "HALF_OPERANDS" not in families.compile_units(spec, exact)[0].defines


def test_groups_of_a_multiple_of_8_channels_or_one_group_of_any_and_the_heuristic_keeps_them_out():
    for layer in ("stem_c3_7x7_stride2", "3x3_c96", "1x1_c24", "grouped_c32_g2"):
        assert families.unsupported_reason(SPECS[layer], "wg_fp16", ones(SPECS[layer])) is None, layer
    assert "32 at a time" in families.unsupported_reason(SPECS["1x1_c24"], "wg_3xtf32", ones(SPECS["1x1_c24"]))
    grouped = conv(2, 24, 64, (8, 8), (3, 3), group=2)  # 12 channels a group: not whole quads, and no room to pad
    assert "this Conv has 2 groups of 12" in families.unsupported_reason(grouped, "wg_fp16", ones(grouped))
    few_maps = conv(2, 4, 12, (40, 40), (7, 7))  # 12 maps: no whole 8-map blocks (lenet86's 16 run: test_wgmma_narrow.py)
    assert "this Conv has 12 a group" in families.unsupported_reason(few_maps, "wg_fp16", ones(few_maps))
    spec = SPECS["3x3_c64"]
    assert not set(HALF) & set(families.usable_families(spec, ones(spec)))  # exact families alone, unless asked
    assert set(HALF) <= set(families.usable_families(spec, ones(spec), exact_only=False))


def test_a_stems_channels_are_padded_to_a_quad_in_the_image_and_in_the_weights_rows():
    spec = SPECS["stem_c3_7x7_stride2"]
    assert wgmma.image_channels(spec, pads=True) == 8 and wgmma.image_channels(spec, pads=False) == 3
    assert families.compile_units(spec, families.configure(spec, "wg_fp16"))[0].defines["CP"] == 8
    assert "CP" not in families.compile_units(SPECS["3x3_c96"], families.configure(SPECS["3x3_c96"], "wg_fp16"))[0].defines
    w = np.random.default_rng(0).standard_normal(spec.weight_shape).astype(np.float32)
    rows = wgmma.weight_rows(spec, w, 8, 64)
    assert rows.shape == (64, 448)  # 49 taps x 8 channels = 392, in 7 slices of 64
    m, c, kh, kw = 5, 2, 3, 6
    assert rows[m, (kh * 7 + kw) * 8 + c] == w[m, c, kh, kw]
    assert not rows.reshape(64, -1)[:, 392:].any() and not rows[:, :392].reshape(64, 49, 8)[:, :, 3:].any()  # zeros: pads


def test_weights_go_in_as_the_formats_bits_rounded_to_nearest_even():
    values = np.array([1.0, -2.5e-3, 3.14159, 70000.0, 1.0 + 2.0 ** -11], np.float32)  # the last a tie: to even
    fp16 = half_bits(values, "fp16")
    with np.errstate(over="ignore"):  # 70000 overflows FP16, as it should
        assert fp16.dtype == np.uint16 and list(fp16.view(np.float16)) == list(values.astype(np.float16))
    assert np.isinf(fp16.view(np.float16)[3]) and fp16.view(np.float16)[4] == 1.0
    bf16 = half_bits(values, "bf16")
    assert np.array_equal((bf16.astype(np.uint32) << 16).view(np.float32), round_to(values, "bf16"))


@pytest.fixture(scope="module")
def conv_pair(tmp_path_factory):
    return load_model(save(conv_pair_model(), tmp_path_factory.mktemp("half_conv") / "conv_pair.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_plan_in_a_half_precision_runs_each_conv_of_enough_maps_in_it_the_stem_too(conv_pair, precision):
    steps = {s.name: s for s in record_plan_alone(make_plan(conv_pair, 8, Device("cuda", "test GPU")), None, precision).steps}
    for name in ("stem", "conv3x3", "conv1x1"):
        assert steps[name].precision == precision and steps[name].implementation.startswith(f"conv.wg_{precision}_"), steps[name]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_plan_in_a_half_precision_runs_the_configuration_tune_cached_for_it(conv_pair, precision, tmp_path, monkeypatch):
    """`tune --precision` keys its choice by the precision and the part of the epilogue the family fuses; a
    plan in that precision on the same GPU runs it, one in FP32 or another precision does not."""
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    gpu, family = Device("cuda", "test GPU"), f"wg_{precision}"
    plan = make_plan(conv_pair, 8, gpu)
    step = next(s for s in plan.plugin_steps if s.name == "conv3x3")
    spec, weights = conv_spec_of(step.node), constant_weights(step.node)
    _, fused, reason = fitted(spec, families.FAMILIES[family], weights, epilogue_of(step.fused))
    assert reason is None and fused.suffix == "+relu"
    default = families.configure(spec, family, fused)
    other = next(c for c in families.family_configs(spec, family, weights, fused) if c != default)

    def implementations(precision):
        return {s.name: s.implementation for s in record_plan_alone(plan, None, precision).steps}

    def linked(config):  # conv3x3 reads the stem's output and writes conv1x1's input channel-last in the format
        return dataclasses.replace(config, links=channel_last.INPUT | channel_last.OUTPUT).name()

    untuned, exact = implementations(precision), implementations("fp32")
    assert untuned["conv3x3"] == f"conv.{linked(default)}+relu"
    wrong_family = families.configure(spec, "wg_bf16" if precision == "fp16" else "wg_fp16", fused)
    tuning_cache.store({tuning_key(spec, fused, gpu.name, precision=precision): tuning_cache.Choice(wrong_family.name(), 1.0, 8)})
    assert implementations(precision) == untuned  # a configuration of another family is no choice for this precision
    tuning_cache.store({tuning_key(spec, fused, gpu.name, precision=precision): tuning_cache.Choice(other.name(), 1.0, 8)})
    tuned = implementations(precision)
    assert tuned["conv3x3"] == f"conv.{linked(other)}+relu" and tuned["conv1x1"] == untuned["conv1x1"]
    assert step_precisions(plan, precision)["conv3x3"].variant == linked(other)  # what the runner's build is given
    assert step.plugin.precision_variant(step.node, gpu, precision, step.fused).variant == other.name()
    assert implementations("fp32") == exact  # FP32's choice reads FP32's entries alone


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_on_the_cpu_the_reference_emulates_the_precision_and_the_output_moves_by_its_roundoff(conv_pair, precision):
    x = np.random.default_rng(5).standard_normal((4, 3, 12, 12)).astype(np.float32)
    fp32, half = Runner(conv_pair, 4, "cpu"), Runner(conv_pair, 4, "cpu", precision=precision)
    steps = {s.name: s for s in half.plan_record().steps}
    assert steps["conv3x3"].implementation == f"conv.reference.{precision}+relu" and steps["conv3x3"].precision == precision
    exact, emulated = fp32.run({"x": x}).outputs["y"], half.run({"x": x}).outputs["y"]
    error = np.linalg.norm(emulated - exact) / np.linalg.norm(exact)
    assert 0 < error < 8 * UNIT_ROUNDOFF[precision], error  # rounded, and by about the format's roundoff


# ---- GPU ----


def bounds(spec, x, w, u: float) -> np.ndarray:
    """How far an output may be from float64 on these operands: each operand rounded once (2u + u^2 of |x||w|), then
    FP32 sums over K, with slack; and 1e-6 of each term for the bias and the epilogue's FP32 arithmetic."""
    k = spec.in_channels // spec.group * spec.kernel[0] * spec.kernel[1]
    magnitudes = reference.conv(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), None, spec.strides, spec.pads,
                                spec.dilations, spec.group)
    return (2.1 * u + 2 * k * FP32_SUMS) * magnitudes + 1e-6


def half_cases():
    cases = []
    for layer, spec in SPECS.items():
        for name in HALF:
            first = families.configure(spec, name)
            for config in dict.fromkeys([first, pipelined.with_split(first, 1), wgmma.WgmmaHalfConfig(name, (64, 64, 64), wgmma.HALF_STAGES)]):
                cases.append((layer, config))
    return cases


CASES = half_cases()


@pytest.mark.gpu
@pytest.mark.parametrize(("layer", "config"), CASES, ids=[f"{layer}-{config}" for layer, config in CASES])
def test_each_configuration_is_within_its_formats_bound_and_rounds_as_the_format_does(layer, config):
    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    spec, precision = SPECS[layer], HALF[config.family]
    seed, x, w, b, _ = draw(spec)
    b = b if spec.has_bias else None
    assert families.unsupported_reason(spec, config, (w, b)) is None
    got = run_poisoned(spec, config, NONE, x, w, b)
    exact = reference.expected(spec, NONE, x, w, b)
    worst = np.max(np.abs(got - exact) / bounds(spec, x, w, UNIT_ROUNDOFF[precision]))
    assert worst <= 1.0, f"{config} on {layer} (seed {seed}): {worst:.3g} of the bound"
    rx, rw = round_to(x, precision), round_to(w, precision)
    as_rounded = reference.expected(spec, NONE, rx, rw, b)
    worst = np.max(np.abs(got - as_rounded) / bounds(spec, rx, rw, 0.0))
    assert worst <= 1.0, f"{config} on {layer} (seed {seed}): {worst:.3g} of FP32 sums' bound from the {precision}-rounded operands"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(HALF))
def test_it_fuses_a_prologue_scale_a_residual_and_an_activation(name):
    if not families.FAMILIES[name].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    spec = SPECS["3x3_c128_m70_stride2"]
    seed, x, w, b, r = draw(spec, residual=True)
    scale = np.random.default_rng(seed).uniform(-2.0, 2.0, (spec.batch, spec.in_channels, 1, 1)).astype(np.float32)
    epilogue = Epilogue("Relu", residual=True, prologue=Prologue(SCALE))
    config = families.configure(spec, name, epilogue)
    assert families.unsupported_reason(spec, config, (w, b), epilogue) is None
    got = run_poisoned(spec, config, epilogue, x, w, b, r, scale)
    scaled = (x * scale).astype(np.float32)
    exact = reference.expected(spec, epilogue, x, w, b, r, scale)
    worst = np.max(np.abs(got - exact) / (bounds(spec, scaled, w, UNIT_ROUNDOFF[HALF[name]]) + 1e-6 * np.abs(r)))
    assert worst <= 1.0, f"{config} + scale, add, relu (seed {seed}): {worst:.3g} of the bound"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_runner_in_a_half_precision_runs_the_wide_convs_on_its_wgmma_family_within_the_formats_rule(conv_pair, precision):
    import onnxruntime

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    runner = Runner(conv_pair, 16, "cuda", precision=precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["conv3x3"].implementation.startswith(f"conv.wg_{precision}_") and steps["conv3x3"].precision == precision
    x = np.random.default_rng().standard_normal((16, 3, 12, 12)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    session = onnxruntime.InferenceSession(conv_pair.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    # the tensors between the Convs stay channel-last in the format (plan/channel_last.py), launched eagerly too
    assert steps["conv3x3"].implementation.endswith("_h3+relu") and steps["conv1x1"].implementation.endswith("_h5+add")
    eager = Runner(conv_pair, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
    with pytest.raises(InputError, match=f"cannot keep r1: it goes between steps channel-last in {precision}"):
        runner.run({"x": x}, keep=("r1",))
    kept = Runner(conv_pair, 16, "cuda", precision=precision, keep=("r1",)).run({"x": x}, keep=("r1",))
    assert kept.kept["r1"].shape == (16, 64, 12, 12) and kept.kept["r1"].dtype == np.float32
    stored = runner.run({"x": x}, keep=("r1",), as_stored=True).kept["r1"]  # as `profile` feeds the kernel again
    assert np.array_equal(stored, half_bits(kept.kept["r1"], precision).transpose(0, 2, 3, 1))
    x[3, 1, 4, 5] = np.nan  # a chunk that meets NaN runs again on the exact path, where nothing is linked
    [with_nan] = session.run(None, {"x": x})
    for run in (runner, eager):
        again = run.run({"x": x}).outputs["y"]
        assert np.array_equal(np.isnan(again), np.isnan(with_nan)) and np.isnan(again).any()
