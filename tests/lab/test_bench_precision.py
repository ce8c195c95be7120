"""`opplugin bench --suite cnn|models --precision fp16|bf16` (lab/bench_precision.py and the Conv suites).

CPU: per layer the candidate is the family `run --precision` runs it in (wg_fp16, dw_fp16 for a depthwise layer), or the reason it has none (offline, as a
Hopper plan sees it), and the bench lists that reason rather than dropping the layer; the payload, its text and its
page (made-up figures). GPU (`gpu` marker): a real fp16 run on two layers, every candidate checked, then timed.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from bench_payloads import HALF_LAYERS, conv_payload, half_payload
from onnx_builders import conv_spec as conv
from onnx_builders import save

from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.lab import bench
from opplugin.lab.bench_page import bench_page
from opplugin.lab.bench_precision import candidate_bound, precision_pick
from opplugin.lab.bench_text import format_text
from opplugin.lab.format_bound import FormatBound
from opplugin.lab.peers import one_conv_model
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE
from opplugin.plan.partition import make_plan
from opplugin.report.jsonout import json_safe
from opplugin.runtime.plan_record import record_plan_alone

# the layers of the cnn suite wg_fp16 and wg_bf16 run: one group of any channels (padded to 8), 32 maps or more, or
# groups of 8, 16 or 24 maps on a narrow tile of their own
RUN_IN_WG = {
    "vgg 64->64 3x3 224", "resnet stem 3->64 7x7 s2 224", "mnist 32->64 3x3 14", "vgg 512->512 3x3 14", "resnet 64->64 3x3 56", "resnet 128->128 3x3 28", "resnet 256->256 3x3 14",
    "resnet 512->512 3x3 7", "resnet 1x1 256->64 56", "resnet 1x1 64->256 56", "resnet 1x1 s2 256->512 56",
}
RUN_NARROW = {"mobilenetv2 1x1 96->24 56": 24, "resnext50 g32 3x3 512ch 14": 16, "regnety800mf gw16 3x3 144ch 28": 16,
              "regnety800mf gw16 3x3 320ch 14": 16}
# ... gw_fp16 and gw_bf16 the narrow groups (ResNeXt's 4 channels and maps a group)
RUN_IN_GW = {"resnext50 g32 3x3 128ch 56"}
# ... and those dw_fp16 and dw_bf16 run: every depthwise layer (one map a channel, a multiple of 8 channels)
RUN_IN_DW = {
    "mobilenetv2 dw 3x3 32ch 112", "mobilenetv2 dw 3x3 s2 144ch 56", "efficientnetb0 dw 5x5 672ch 14", "efficientnetb0 dw 5x5 1152ch 7",
    "convnext-t dw 7x7 96ch 56", "convnext-t dw 7x7 768ch 7", "efficientnetb0 dw 5x5 s2 144ch 56", "efficientnetb0 dw 5x5 s2 672ch 14",
}


def cases_at(batch: int):
    import dataclasses

    return [(case, dataclasses.replace(case.spec, batch=batch)) for case in bench.suite_cases()]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_each_cnn_layer_names_the_precisions_family_or_the_reason_it_has_none(precision):
    picked = {}
    for case, spec in cases_at(32):
        config, reason = precision_pick(spec, (case.w, case.b), precision)
        assert config is not None and reason is None, (case.conv, reason)  # every layer of the suite has a family
        picked[case.conv] = config
        if case.conv in RUN_IN_GW:
            assert config.name().startswith(f"gw_{precision}_t"), config
        elif case.conv in RUN_IN_DW:
            assert config.name().startswith(f"dw_{precision}_t"), config
        elif case.conv in RUN_NARROW:
            assert config.name().startswith(f"wg_{precision}_b{RUN_NARROW[case.conv]}x"), config
        else:
            assert config.name().startswith(f"wg_{precision}_b"), config
    assert set(picked) == RUN_IN_WG | RUN_IN_DW | set(RUN_NARROW) | RUN_IN_GW


def test_the_bench_picks_what_a_plan_in_fp16_runs_each_layer_in(tmp_path):
    """The candidate of each layer is the configuration a Hopper plan of that one Conv runs in FP16, or it stays
    FP32 there for the reason the bench gives."""
    for index, (case, spec) in enumerate(cases_at(32)):
        model = load_model(save(one_conv_model(spec, case.w, case.b), tmp_path / f"conv{index}.onnx"))
        [step] = record_plan_alone(make_plan(model, 32, Device("cuda", "test GPU")), None, "fp16").steps
        config, reason = precision_pick(spec, (case.w, case.b), "fp16")
        if config is None:
            assert step.precision == "fp32" and step.precision_reason == reason, case.conv
        else:
            assert step.precision == "fp16" and step.implementation == f"conv.{config.name()}", (case.conv, step.implementation)


@pytest.mark.parametrize(("layer", "family"), [(HALF_LAYERS[0], "wg_fp16"), (HALF_LAYERS[1], "dw_fp16"), (HALF_LAYERS[2], "gw_fp16")])
def test_in_fp16_the_candidates_are_the_family_the_precision_runs_the_layer_in_alone(layer, family):
    [(case, spec)] = [(case, spec) for case, spec in cases_at(32) if case.conv == layer]
    weights = (case.w, case.b)
    half = bench.Bench(bench.Options(suite="cnn", precision="fp16"))
    [(config, heuristic)] = half._candidates(spec, NONE, None, weights)
    assert heuristic and config == families.configure(spec, family)
    every = bench.Bench(bench.Options(suite="cnn", precision="fp16", all_configs=True))._candidates(spec, NONE, None, weights)
    assert len(every) > 1 and {families.family_of(c).name for c, _ in every} == {family}
    fp32 = {families.family_of(c).name for c, _ in bench.Bench(bench.Options(suite="cnn"))._candidates(spec, NONE, None)}
    assert {"tc_3xtf32", "wg_fp16", "dw_fp16", "baseline"} <= fp32  # as before: every family


def test_a_layer_the_family_cannot_run_is_a_row_with_the_reason_not_timed_and_not_dropped():
    spec = conv(32, 48, 48, (28, 28), (3, 3), pads=(1, 1, 1, 1), group=16)  # groups of 3 channels: no half family's
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal(spec.weight_shape).astype(np.float32), rng.standard_normal(48).astype(np.float32))
    run = bench.Bench(bench.Options(suite="cnn", precision="fp16"))
    problem = SimpleNamespace(spec=spec, epilogue=NONE, weights=weights)  # the trial stops before any GPU work
    [(variant, heuristic)] = run._candidates(spec, NONE, None, weights)
    step = {"step": "cnn groups of 3", "batch": 32, "bytes": 1, "floor_ms": None}
    row = run._bench_variant(step, problem, variant, heuristic)
    reason = "gw_fp16 takes groups of 2, 4, 8 or 16 input channels (a pixel's in one or two loads); this Conv has 3 a group"
    assert (row["status"], row["reason"], row["ms"]) == ("unsupported", reason, None)
    assert row["family"] == "gw_fp16" and row["tolerance"] is None  # a 16-bit run is held to the element bound instead


def test_every_candidate_of_a_16_bit_run_meets_the_formats_bound_and_cudnns_allows_its_stored_rounding():
    assert candidate_bound("fp16") == FormatBound("fp16") and candidate_bound("bf16", "bf16") == FormatBound("bf16", rounded_output=True)
    assert candidate_bound("fp32") is None  # FP32 keeps its relative L2 tolerances


def test_the_fp16_payload_records_the_precision_the_bound_and_the_summary():
    payload = half_payload()
    json.loads(json.dumps(payload, allow_nan=False))
    assert tuple(payload) == bench.PAYLOAD_KEYS and payload["schema"] == "opplugin-bench/4" and payload["precision"] == "fp16"
    assert payload["settings"]["format_bound"].startswith("|error| <= (2.1u + 2k 2^-24) M")
    assert payload["suite_summary"] is None and payload["peers"] == {"cudnn_fp16": "available"}
    assert all(tuple(row) == bench.ROW_KEYS for row in payload["rows"])
    vgg, depthwise, grouped = payload["steps"]
    assert (vgg["cudnn_ms"], vgg["cudnn_fp32_ms"], vgg["best"], vgg["floor_ms"]) == (0.06, None, "wg_fp16_b128x128x64_s4", None)
    ours = payload["rows"][0]
    assert ours["vs_cudnn"] == pytest.approx(0.06 / 0.05) and ours["vs_cudnn_fp32"] is None and ours["bound_fraction"] == 0.12
    assert depthwise["best"] == "dw_fp16_t1x2_b6x14_p48" and grouped["best"] == "gw_fp16_t1x8_b4x56_p32_v4" and grouped["cudnn_ms"] == 0.03
    summary = payload["precision_summary"]
    assert (summary["families"], summary["peer"], summary["ran"]) == (["gw_fp16", "wg_fp16", "dw_fp16"], "cudnn_fp16", 3)
    assert summary["geomean_vs_cudnn"] == pytest.approx((1.2 * 0.8 * 1.5) ** (1 / 3))
    assert summary["layers"][1]["variant"] == "dw_fp16_t1x2_b6x14_p48" and summary["layers"][1]["vs_cudnn"] == pytest.approx(0.8)
    assert summary["layers"][2] == {"step": f"cnn {HALF_LAYERS[2]}", "batch": 32, "cudnn_ms": 0.03, "variant": "gw_fp16_t1x8_b4x56_p32_v4",
                                    "ms": 0.02, "vs_cudnn": pytest.approx(1.5), "why_not": None}
    fp32 = conv_payload("cnn")
    assert (fp32["precision"], fp32["settings"]["format_bound"], fp32["precision_summary"]) == ("fp32", None, None)


def test_the_fp16_text_says_what_is_converted_where_and_how_each_output_is_checked():
    text = format_text(half_payload())
    lines = text.splitlines()
    [precision] = [line for line in lines if line.startswith("precision fp16:")]
    assert "by the family run --precision fp16 runs it in (gw_fp16, wg_fp16 or dw_fp16; FP32 in and out, converting inside its timed call" in precision
    assert "cuDNN on FP16 tensors in channels_last, its input and weights converted before timing" in precision
    assert "checked against float64 first: |error| <= (2.1u + 2k 2^-24) M" in precision and "u = 0.000488" in precision
    assert "vs cuDNN is a speed-up over cuDNN FP16; no floor" in text
    [title] = [line for line in lines if line.startswith("cnn vgg 512->512 3x3 14 (512->512 maps, 3x3, 14x14 in, pads [1, 1, 1, 1]), batch 32: ")]
    assert "floor" not in title
    assert any(line.startswith("wg_fp16_b128x128x64_s4") and "1.20x" in line and "ok (fastest, default pick, 0.12 of bound)" in line
               for line in lines)
    assert any(line.startswith("gw_fp16_t1x8_b4x56_p32_v4 ") and "1.50x" in line for line in lines)
    assert any(line.startswith("[cudnn_fp16]") and "ok (0.30 of bound)" in line for line in lines)
    assert "fp16 summary (ms; vs cuDNN is a speed-up)" in text
    assert any(line.startswith("dw_fp16_t1x2_b6x14_p48") and "0.80x" in line for line in lines)
    assert "gw_fp16, wg_fp16 and dw_fp16 ran 3 of 3 layers and batches; over them, vs cuDNN FP16: geometric mean 1.13x" in text
    assert not any(line.startswith("precision") for line in format_text(conv_payload("cnn")).splitlines())  # FP32 as before


def test_the_fp16_page_has_the_summary_and_no_fp32_roofline():
    text = bench_page("cnn", half_payload())
    assert "FP16 summary" in text and "Layer set summary" not in text and "Roofline" not in text
    assert "fastest in fp16: wg_fp16_b128x128x64_s4" in text and "cuDNN on FP16 tensors in channels_last" in text


# ---- GPU ----


@pytest.mark.gpu
def test_a_small_fp16_cnn_run_checks_then_times_wg_fp16_dw_fp16_gw_fp16_and_cudnn_fp16(monkeypatch):
    pytest.importorskip("torch")
    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 needs an sm_90 GPU (wgmma)")
    monkeypatch.setattr(bench, "LAYERS", tuple(layer for layer in bench.LAYERS if layer.name in HALF_LAYERS))
    lines = []
    payload = json_safe(bench.run_bench(bench.Options(batches=[8], warmup=1, repeat=3, suite="cnn", precision="fp16"), progress=lines.append))
    json.loads(json.dumps(payload, allow_nan=False))
    rows = {(r["step"].removeprefix("cnn "), r["family"] or r["name"]): r for r in payload["rows"]}
    assert len(rows) == len(payload["rows"]) == 6, sorted(rows)
    for layer in HALF_LAYERS:
        cudnn = rows[(layer, "cudnn_fp16")]
        assert cudnn["status"] == "ok" and cudnn["ms"] > 0 and 0 < cudnn["bound_fraction"] <= 1, cudnn
        assert cudnn["implementation"].endswith("FP16 channels_last")
    for layer, family in zip(HALF_LAYERS, ("wg_fp16", "dw_fp16", "gw_fp16")):
        ours = rows[(layer, family)]
        assert ours["status"] == "ok" and ours["ms"] > 0 and 0 < ours["bound_fraction"] <= 1 and ours["vs_cudnn"] > 0, ours
        assert ours["name"].startswith(f"{family}_") and ours["implementation"].startswith(f"conv.{family}_")
    assert payload["precision_summary"]["ran"] == 3 and "precision fp16:" in format_text(payload)
