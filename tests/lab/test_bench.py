"""`opplugin bench` and tools/bench_report.py.

CPU tests: the roofline arithmetic, the cases taken from the shipped models, the
JSON records and their keys, the text table, the CLI's errors without a GPU, the
one-Conv ONNX model of the onnxruntime peer, and the report tool on a synthetic
bench JSON. The GPU test runs a small real bench and requires every row correct.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from opplugin.gpu import cuda
from opplugin.lab import bench, roofline, trial
from opplugin.lab import streams as bench_streams
from opplugin.lab.bench_text import format_text
from opplugin.cli import main
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.gpu.device import Device
from opplugin.report.jsonout import json_safe
from onnx_builders import conv_spec
from repository import ROOT




def load_report_tool():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "tools" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- roofline -------------------------------------------------------------------------


def test_floor_is_the_larger_of_memory_and_compute_time():
    # 4 GB at 4 TB/s = 1 ms; 1 TFLOP at 50 TFLOP/s = 20 ms
    assert roofline.floor_ms(10**12, 4 * 10**9, 4e12, 50e12) == pytest.approx(20.0)
    assert roofline.bound_by(10**12, 4 * 10**9, 4e12, 50e12) == "compute"
    assert roofline.floor_ms(10**9, 4 * 10**9, 4e12, 50e12) == pytest.approx(1.0)
    assert roofline.bound_by(10**9, 4 * 10**9, 4e12, 50e12) == "memory"


def test_roofline_rates_come_from_the_measurements():
    roof = roofline.Roofline(copy_bytes=2 << 30, copy_ms=0.5, matmul_n=8192, matmul_ms=22.0, matmul_rel_error=3e-7)
    assert roof.bytes_per_s == pytest.approx((2 << 30) / 0.5e-3)
    assert roof.flops_per_s == pytest.approx(2 * 8192**3 / 22e-3)
    # lenet86 conv1 at batch 10000 (25.3 GFLOP, 1320 MB): at ~50 TFLOP/s its arithmetic sets the floor
    flops, nbytes = 25_344_000_000, 1_319_840_800
    assert roof.floor_ms(flops, nbytes) == pytest.approx(1e3 * flops / roof.flops_per_s)
    assert roof.floor_ms(flops, nbytes) > 1e3 * nbytes / roof.bytes_per_s
    record = roof.record()
    assert record["copy_gb_per_s"] == pytest.approx(roof.bytes_per_s / 1e9)
    assert record["fp32_tflop_per_s"] == pytest.approx(roof.flops_per_s / 1e12)
    assert record["tf32_suspected"] is False
    assert dataclasses.replace(roof, matmul_rel_error=2e-3).record()["tf32_suspected"] is True


def test_fp32_matmul_mode_clears_cupy_tf32(monkeypatch):
    monkeypatch.setenv("CUPY_TF32", "1")
    roofline.fp32_matmul_mode()
    assert "CUPY_TF32" not in __import__("os").environ


# --- cases and records ----------------------------------------------------------------


def test_cases_are_the_shipped_convs_with_their_fused_epilogues():
    cases = bench.conv_cases(["lenet86", "ece408_high"])
    assert [c.label(True) for c in cases] == [
        "lenet86 conv1+relu+maxpool2",
        "lenet86 conv2+relu+maxpool4",
        "ece408_high conv1+tanh+maxpool2",
    ]
    assert [bench.describe_spec(c.spec) for c in cases] == [
        "1->4 maps, 7x7, 86x86 in",
        "4->16 maps, 7x7, 40x40 in",
        "1->50 maps, 5x5, 28x28 in",
    ]
    assert cases[0].w.shape == (4, 1, 7, 7) and cases[0].b.shape == (4,)


def test_step_cost_counts_the_pooled_output_and_the_conv_outputs_the_pool_reads():
    spec = conv_spec(10000, 1, 4, (86, 86), (7, 7))
    assert bench.step_cost(spec, NONE, 10000) == (spec.flops(10000), spec.bytes_moved(10000))
    flops, nbytes = bench.step_cost(spec, Epilogue("Relu", (2, 2)), 10000)
    assert flops == spec.flops(10000)  # a 2x2 pool reads all 80x80 outputs
    assert spec.bytes_moved(10000) - nbytes == 4 * 10000 * 4 * (80 * 80 - 40 * 40)
    # lenet86 conv2: a 4x4 pool over 34x34 outputs reads 32x32 of them
    conv2 = conv_spec(10000, 4, 16, (40, 40), (7, 7))
    flops, _ = bench.step_cost(conv2, Epilogue("Relu", (4, 4)), 10000)
    assert flops == 10000 * 16 * 32 * 32 * (2 * 4 * 49 + 1)


def test_check_indices_cover_both_ends_and_the_middle():
    assert trial.check_indices(10000) == [0, 1, 2, 3, 5000, 9996, 9997, 9998, 9999]
    assert trial.check_indices(3) == [0, 1, 2]
    assert trial.check_indices(1) == [0]


def test_chunk_bounds_cover_the_batch_once():
    for batch, chunks in [(10000, 8), (100, 12), (5, 16), (1, 4)]:
        bounds = bench_streams.chunk_bounds(batch, chunks)
        assert bounds[0][0] == 0 and bounds[-1][1] == batch
        assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        assert len(bounds) == min(chunks, batch)


ROOF = roofline.Roofline(copy_bytes=2 << 30, copy_ms=0.5, matmul_n=8192, matmul_ms=22.0, matmul_rel_error=3e-7)


def synthetic_step(label="lenet86 conv1", model="lenet86", fused=False, batch=10000):
    spec = conv_spec(batch, 1, 4, (86, 86), (7, 7))
    epilogue = Epilogue("Relu", (2, 2)) if fused else NONE
    step = dict.fromkeys(bench.STEP_KEYS)
    flops, nbytes = bench.step_cost(spec, epilogue, batch)
    step.update(
        step=label, model=model, conv="conv1", fused=fused, epilogue=epilogue.suffix.lstrip("+"), batch=batch,
        shape=bench.describe_spec(spec), flops=flops, bytes=nbytes, floor_ms=ROOF.floor_ms(flops, nbytes),
        bound=roofline.bound_by(flops, nbytes, ROOF.bytes_per_s, ROOF.flops_per_s),
    )
    return step


def synthetic_rows(step, times: dict[str, float]):
    """Rows for baseline, const_rb (+ one of its configurations), an fp16 family, a wrong one, and the peers."""
    suffix = "+" + step["epilogue"] if step["epilogue"] else ""
    rows = []
    if not step["fused"]:
        rows.append(bench.make_row(step, "baseline", "variant", family="baseline", heuristic=True, ms=times["baseline"], rel_error=1e-7, tolerance=1e-5))
        rows.append(bench.make_row(step, "half_mo", "variant", family="half_mo", exact=False, heuristic=True, ms=times["baseline"] / 3, rel_error=4e-4, tolerance=1e-2))
        rows.append(bench.make_row(step, "broken", "variant", family="broken", heuristic=True, status="incorrect", reason="relative error 0.5 > 1e-05", rel_error=0.5))
        rows.append(bench.make_row(step, "tiled", "variant", family="tiled", heuristic=True, status="unsupported", reason="needs C >= 2"))
    rows.append(bench.make_row(step, "const_rb_t8x1_m4" + suffix, "variant", family="const_rb", heuristic=True, ms=times["const_rb"], rel_error=2e-7, tolerance=1e-5))
    rows.append(bench.make_row(step, "const_rb_t4x1_m4" + suffix, "variant", family="const_rb", heuristic=False, ms=times["const_rb"] * 0.9, rel_error=2e-7, tolerance=1e-5))
    rows.append(bench.make_row(step, "cudnn_fp32", "peer", ms=times["cudnn"], rel_error=1e-6, timer="cuda-events"))
    if not step["fused"]:
        rows.append(bench.make_row(step, "cudnn_tf32", "peer", exact=False, ms=times["cudnn"] * 0.9, rel_error=5e-4))
    return rows


def synthetic_payload(monkeypatch=None):
    run = bench.Bench(bench.Options(batches=[10000], models=["lenet86"]))
    run.roof = ROOF
    run.peer_notes = {"onnxruntime_cuda": "onnxruntime 1.31 has no CUDAExecutionProvider"}
    plain = synthetic_step()
    fused1 = synthetic_step("lenet86 conv1+relu+maxpool2", fused=True)
    fused2 = synthetic_step("lenet86 conv2+relu+maxpool4", fused=True)
    for step, times in [
        (plain, {"baseline": 6.6, "const_rb": 0.6, "cudnn": 7.0}),
        (fused1, {"const_rb": 0.5, "cudnn": 9.0}),
        (fused2, {"const_rb": 1.2, "cudnn": 6.0}),
    ]:
        run.steps.append(step)
        run.rows += synthetic_rows(step, times)
        bench.reference_rows(run.rows, step)
        best = [r for r in run.rows if r["step"] == step["step"] and r["name"] == step["best"]]
        step["best_ms"] = best[0]["ms"]
    run._versions = lambda: {
        "python": "3.12", "numpy": "2", "cupy": "14.2", "cuda_runtime": 13000, "cuda_driver": 13000,
        "onnxruntime": "1.31", "onnxruntime_providers": ["CPUExecutionProvider"], "torch": "2.11", "cudnn": 91000,
    }
    streams = {
        "step": "lenet86 conv1", "batch": 10000, "variant": "const_rb_t4x1_m4", "status": "ok", "reason": None,
        "input_bytes": 1, "output_bytes": 1, "serial_ms": 60.0, "best_streams": 3, "best_ms": 45.0, "speedup": 60 / 45,
        "chunked": [{"streams": n, "chunks": 4 * n, "ms": ms, "speedup": 60 / ms, "correct": True} for n, ms in [(2, 50.0), (3, 45.0), (4, 46.0)]],
    }
    return json_safe(run.payload(Device("cuda", "NVIDIA H200", "9.0"), streams))


def test_payload_has_stable_keys_and_is_strict_json():
    payload = synthetic_payload()
    assert tuple(payload) == bench.PAYLOAD_KEYS
    assert payload["schema"] == bench.SCHEMA == "opplugin-bench/4" and payload["precision"] == "fp32"
    # the header every report shares; bench covers several models and batches: their lists
    assert payload["model"] == ["lenet86"] and payload["batch"] == [10000]
    assert payload["device"] == {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "memory_bytes": None}
    assert all(tuple(row) == bench.ROW_KEYS for row in payload["rows"])
    assert all(set(bench.STEP_KEYS) <= set(step) for step in payload["steps"])
    assert set(payload["roofline"]) >= {"copy_bytes", "copy_ms", "copy_gb_per_s", "matmul_n", "matmul_ms", "fp32_tflop_per_s", "tf32_suspected"}
    assert payload["peers"]["onnxruntime_cuda"].startswith("onnxruntime")
    json.loads(json.dumps(payload, allow_nan=False))


def test_rows_get_their_ratios_from_the_step():
    payload = synthetic_payload()
    rows = {r["name"]: r for r in payload["rows"] if r["step"] == "lenet86 conv1"}
    step = payload["steps"][0]
    assert step["baseline_ms"] == 6.6 and step["cudnn_fp32_ms"] == 7.0
    rb = rows["const_rb_t8x1_m4"]
    assert rb["vs_baseline"] == pytest.approx(6.6 / 0.6) and rb["vs_cudnn_fp32"] == pytest.approx(7.0 / 0.6)
    assert rb["x_floor"] == pytest.approx(0.6 / step["floor_ms"])
    assert rb["gflops_per_s"] == pytest.approx(step["flops"] / 0.6 / 1e6)
    assert rb["gb_per_s"] == pytest.approx(step["bytes"] / 0.6 / 1e6)
    # the fastest exact variant is the best, not the faster inexact one
    assert step["best"] == "const_rb_t4x1_m4"
    assert rows["broken"]["ms"] is None and rows["broken"]["vs_baseline"] is None
    assert rows["half_mo"]["exact"] is False


def test_fused_total_adds_the_best_of_each_stage_against_the_target():
    [total] = synthetic_payload()["fused_totals"]
    assert total["model"] == "lenet86" and total["batch"] == 10000
    assert total["steps"] == ["lenet86 conv1+relu+maxpool2", "lenet86 conv2+relu+maxpool4"]
    assert total["ms"] == pytest.approx(0.45 + 1.08)
    assert total["cudnn_fp32_ms"] == pytest.approx(15.0)
    assert total["target_ms"] == 2.0 and total["met"] is True


def test_text_table_shows_every_row_and_marks_failures():
    text = format_text(synthetic_payload())
    assert "NVIDIA H200" in text and "roofline: copy" in text and "TFLOP/s" in text
    assert "lenet86 conv1 (1->4 maps, 7x7, 86x86 in), batch 10,000" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("variant"))
    for column in ("exact", "ms", "GFLOP/s", "GB/s", "x floor", "vs base", "vs cuDNN", "rel err", "status"):
        assert column in header
    assert any(line.startswith("broken") and "INCORRECT: relative error 0.5" in line for line in lines)
    assert any(line.startswith("half_mo") and " NO " in line for line in lines)
    assert any(line.startswith("[cudnn_fp32]") for line in lines)
    assert any(line.startswith("tiled") and "n/a: needs C >= 2" in line for line in lines)
    assert "peer onnxruntime_cuda: not measured" in text
    assert "all fused stages, batch 10,000: 1.530 ms" in text and "target < 2 ms: met" in text
    assert "3 streams, 12 chunks: 45.00 ms (1.33x)" in text


# --- the command line -----------------------------------------------------------------


def test_bench_without_a_gpu_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    assert main(["bench", "--batches", "100", "--repeat", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opplugin: error: bench needs a CUDA device")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--batches", "1k"], ["--repeat", "0"], ["--warmup", "-1"], ["--models", "no_such_model"]])
def test_bench_rejects_bad_options(argv, monkeypatch, capsys):
    monkeypatch.setattr(cuda, "is_available", lambda: True)  # the option errors come before any device work
    monkeypatch.setattr(bench.Bench, "_find_peers", lambda self: pytest.fail("should not get this far"))
    monkeypatch.setattr(roofline, "measure", lambda: pytest.fail("should not get this far"))
    assert main(["bench", *argv]) == 2
    assert capsys.readouterr().err.startswith("opplugin: error: ")


@pytest.mark.parametrize("argv", [["--e2e", "m.onnx"], ["--suite", "gemm"], ["--scaling"]])
def test_cuda_graphs_flag_is_refused_where_it_changes_nothing(argv, capsys):
    assert main(["bench", "--no-cuda-graphs", *argv]) == 2
    assert "applies to the Conv suites" in capsys.readouterr().err


# --- timing replayed from a CUDA graph, or eagerly where the calls cannot be captured ---


def test_graph_timing_sizes_the_graph_to_a_sample_and_divides_by_its_calls(monkeypatch):
    captured, replays = [], []

    def capture(fn, calls):
        captured.append(calls)
        return lambda: replays.append(calls)

    # one call of the 1-call graph takes 0.004 ms; each sample of the sized graph 1.0 ms
    monkeypatch.setattr(cuda, "time_ms", lambda fn, warmup, repeat, stream=None, calls=1: [0.004 if not captured[1:] else 1.0] * repeat)
    timing = trial.time_call(lambda: None, warmup=2, repeat=5, capture=capture)
    assert captured == [1, 250]  # 1 ms / 0.004 ms
    assert timing == trial.Timing(1.0 / 250, 250, "cuda-graph")


def test_calls_that_cannot_be_captured_are_timed_eagerly_and_say_why(monkeypatch):
    def capture(fn, calls):
        raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda, "synchronize", lambda: None)
    monkeypatch.setattr(trial, "median_ms", lambda fn, warmup, repeat: (0.25, 4))
    timing = trial.time_call(lambda: None, warmup=1, repeat=3, capture=capture)
    assert (timing.ms, timing.calls, timing.timer) == (0.25, 4, "cuda-events")
    assert "cannot be captured" in timing.note and "operation not permitted" in timing.note
    assert trial.time_call(lambda: None, warmup=1, repeat=3) == trial.Timing(0.25, 4, "cuda-events")


# --- the onnxruntime peer's model -----------------------------------------------------


def test_one_conv_model_computes_the_conv():
    import onnxruntime

    from opplugin.lab.peers import one_conv_model
    from opplugin.ops.conv import reference

    spec = conv_spec(3, 2, 5, (11, 9), (3, 3), strides=(2, 1), pads=(1, 0, 0, 2))
    rng = np.random.default_rng(0)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    b = rng.standard_normal(spec.out_channels).astype(np.float32)
    x = rng.standard_normal(spec.input_shape()).astype(np.float32)
    session = onnxruntime.InferenceSession(one_conv_model(spec, w, b).SerializeToString(), providers=["CPUExecutionProvider"])
    [y] = session.run(None, {"x": x})
    expected = reference.expected(spec, NONE, x, w, b)
    assert y.shape == spec.output_shape()
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


# --- tools/bench_report.py ------------------------------------------------------------


def test_predictions_match_the_most_specific_family():
    tool = load_report_tool()
    assert "register" in tool.predicted_effect("const_rb")
    assert "maps per thread" in tool.predicted_effect("const_mo")
    assert "__constant__" in tool.predicted_effect("const")
    assert "reference" in tool.predicted_effect("baseline")
    assert "FP16" in tool.predicted_effect("fp16_mo")
    assert "FP32 accuracy" in tool.predicted_effect("tf32x3_3xtf32")
    assert "no prediction" in tool.predicted_effect("something_new")


def write_synthetic(tmp_path) -> Path:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(synthetic_payload()))
    return path


def test_report_writes_the_table_and_the_chart(tmp_path):
    pytest.importorskip("matplotlib")
    tool = load_report_tool()
    out = tmp_path / "docs"
    assert tool.main([str(write_synthetic(tmp_path)), "--out", str(out)]) == 0
    text = (out / "BENCHMARK.md").read_text()
    assert "| optimisation | lenet86 conv1 | predicted effect |" in text
    assert "| `baseline` | 6.600 ms, 1.00x |" in text
    assert "| `const_rb` | 0.600 ms, 11.00x |" in text
    assert "`const_rb`, best configuration | 0.540 ms, 12.22x (`const_rb_t4x1_m4`)" in text
    assert "| `half_mo` (inexact) |" in text and "| `broken` | **incorrect** |" in text and "| `tiled` | n/a |" in text
    assert "[cuDNN FP32 (PyTorch)] | 7.000 ms, 0.94x |" in text
    assert "| lenet86 conv1 | `const_rb_t4x1_m4` | 0.540 | 12.96x | >= 10x: met |" in text
    assert "lenet86 conv1+relu+maxpool2 | lenet86 conv2+relu+maxpool4 |" in text
    assert "All fused stages of lenet86 together: 1.530 ms (target < 2 ms: met)" in text
    assert "serial 60.00 ms; best 3 streams, 45.00 ms, 1.33x" in text
    assert "![time per variant](variants.png)" in text
    png = (out / "variants.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_report_without_matplotlib_still_writes_the_table(tmp_path, monkeypatch, capsys):
    tool = load_report_tool()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "docs"
    assert tool.main([str(write_synthetic(tmp_path)), "--out", str(out)]) == 1
    assert "matplotlib is not installed (pip install matplotlib)" in capsys.readouterr().err
    text = (out / "BENCHMARK.md").read_text()
    assert "| `const_rb` |" in text and "variants.png" not in text
    assert not (out / "variants.png").exists()


def test_report_draws_each_models_worst_ratio_over_its_runs(tmp_path):
    """The committed end-to-end runs (three parts of one session): a table each, and one chart whose
    bar for a model run in several parts is its highest ratio to the fastest peer of a run."""
    pytest.importorskip("matplotlib")
    tool = load_report_tool()
    runs = [ROOT / "tools" / "benchmark" / name for name in ("e2e.json", "e2e-2.json", "e2e-3.json")]
    payloads = [json.loads(path.read_text()) for path in runs]
    ratios = tool.e2e_ratios(payloads)
    for model, batch in ratios:
        found = [c["opplugin_graphs_over_fastest_peer"] for p in payloads for c in p["cases"] if (c["model"], c["batch"]) == (model, batch)]
        assert ratios[(model, batch)] == max(found)
    assert len({model for model, _ in ratios}) == 11 and {batch for _, batch in ratios} == {1, 32}
    out = tmp_path / "docs"
    assert tool.main([str(write_synthetic(tmp_path)), "--out", str(out), "--e2e", *map(str, runs)]) == 0
    text = (out / "BENCHMARK.md").read_text()
    assert text.count("### Run ") == 3 and "![opplugin over the fastest peer](e2e.png)" in text
    assert (out / "e2e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- on the GPU -----------------------------------------------------------------------


@pytest.mark.gpu
def test_small_bench_runs_and_every_row_is_correct(tmp_path):
    lines = []
    options = bench.Options(batches=[100], warmup=1, repeat=3, models=["lenet86"])
    payload = json_safe(bench.run_bench(options, progress=lines.append))
    json.loads(json.dumps(payload, allow_nan=False))
    assert lines and lines[0].startswith("bench: ")
    steps = {s["step"] for s in payload["steps"]}
    assert steps == {"lenet86 conv1", "lenet86 conv2", "lenet86 conv1+relu+maxpool2", "lenet86 conv2+relu+maxpool4"}
    rows = payload["rows"]
    bad = [(r["name"], r["step"], r["status"], r["reason"]) for r in rows if r["status"] not in ("ok", "unsupported")]
    assert not bad, bad
    variants = [r for r in rows if r["kind"] == "variant" and r["status"] == "ok"]
    assert {"baseline", "const_rb"} <= {r["family"] for r in variants}
    for row in variants:
        assert row["ms"] > 0 and row["rel_error"] <= row["tolerance"] and row["x_floor"] > 0
        assert (row["timer"], row["reason"]) == ("cuda-graph", None), row["name"]  # every family's calls can be captured
    cudnn = [r for r in rows if r["name"].startswith("cudnn") and r["status"] == "ok"]
    assert all(r["timer"] == "cuda-graph" for r in cudnn), [(r["name"], r["reason"]) for r in cudnn]
    for step in payload["steps"]:
        assert step["best"] is not None and step["floor_ms"] > 0
        if not step["fused"]:
            assert step["baseline_ms"] > 0
    if payload["versions"]["torch"]:
        assert all(s["cudnn_fp32_ms"] for s in payload["steps"])
    roof = payload["roofline"]
    assert roof["copy_gb_per_s"] > 100 and roof["fp32_tflop_per_s"] > 1 and not roof["tf32_suspected"]
    assert [t["model"] for t in payload["fused_totals"]] == ["lenet86"] and payload["fused_totals"][0]["ms"] > 0
    streams = payload["streams"]
    assert streams["status"] == "ok" and streams["serial_ms"] > 0 and all(e["correct"] for e in streams["chunked"])
    assert "lenet86 conv1" in format_text(payload)
