"""opplugin run: the report, its files, and exit status 1 for a failed comparison alone."""
import json
import os
import stat

from opplugin.cli import main
from opplugin.cli import run as run_command


def test_run_on_a_shipped_model_prints_the_report(tmp_path, capsys):
    code = main(["run", "lenet86", "--batch", "40", "--repeat", "2", "--warmup", "1", "--device", "cpu",
                 "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "numpy reference backend" in err
    assert out.count("Op Time:") == 4  # conv1, conv2, fc1 (reading the Flatten as a view), fc2
    assert "Test Accuracy:" in out
    assert "Against onnxruntime CPU: PASS" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["batch"] == 40 and data["model"] == "lenet86" and 0 <= data["accuracy"] <= 1
    assert data["agreement"]["passed"] and data["agreement"]["top1_agreement"] == 1.0
    assert (tmp_path / "r.csv").read_text().startswith("step,kind,ops")


def test_report_files_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o027)
    try:
        assert main(["run", "ece408_high", "--batch", "2", "--repeat", "1", "--device", "cpu",
                     "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "r.csv").stat().st_mode) == 0o640


def test_conv_weights_fed_as_graph_inputs_are_named_in_the_header(tmp_path, capsys):
    from onnx_builders import save, single_conv

    path = save(single_conv(("N", 2, 7, 7), (3, 2, 3, 3), {}, bias=True, weights_as_input=True), tmp_path / "conv.onnx")
    assert main(["check", path, "--batch", "2", "--device", "cpu"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("; Conv weights w, b are graph inputs, filled with random data too")
    assert main(["run", path, "--batch", "2", "--device", "cpu", "--repeat", "1"]) == 0
    assert "Conv weights w, b are graph inputs: this run fills them with random data" in capsys.readouterr().err


def test_run_exits_1_when_its_comparison_fails(monkeypatch, capsys):
    def failed(plan, feeds, ours, atol, rtol):
        return {"passed": False, "top1_agreement": 0.5, "max_abs_error": 1.0, "rel_l2": 1.0}

    monkeypatch.setattr(run_command, "agreement", failed)
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1"]) == 1
    assert "Against onnxruntime CPU: FAIL" in capsys.readouterr().out
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1", "--no-compare"]) == 0


def test_run_writes_its_html_report_with_a_bar_per_span_and_a_point_per_plugin_step(tmp_path, capsys):
    from html_pages import ReadPage

    argv = ["run", "lenet86", "--batch", "6", "--chunk", "3", "--device", "cpu", "--repeat", "1"]
    assert main(argv + ["--report", str(tmp_path / "r.html"), "--json", str(tmp_path / "r.json")]) == 0
    text = (tmp_path / "r.html").read_text()
    page, data = ReadPage(text), json.loads((tmp_path / "r.json").read_text())
    assert page.links == [] and not any(scheme in text for scheme in ("http://", "https://"))
    steps = [row["step"] for row in data["steps"]]
    assert [row[0] for row in page.rows[1:]] == steps  # the plan, step by step (the CPU has no copies)
    # the timeline's bar per step and chunk, then the op chains' (conv1 and conv2 are one chain)
    assert page.count("rect", "bar") == data["chunks"] * len(steps) + len(data["by_op_chain"]) == 2 * 4 + 3
    assert page.count("circle", "point") == 4  # every plugin step (fc1 reads the Flatten as a view)
    assert "PASS" in text and "lenet86" in text


def test_run_html_report_goes_to_standard_output_or_refuses_a_clash(tmp_path, capsys):
    argv = ["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1", "--no-compare"]
    assert main(argv + ["--report", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>") and "Op Time:" in err
    assert main(argv + ["--report", str(tmp_path / "same"), "--json", str(tmp_path / "same")]) == 2
    assert "is the same file as --json" in capsys.readouterr().err and not (tmp_path / "same").exists()
    assert main(argv + ["--report", "-", "--json", "-"]) == 2
    assert "--json and --report both name standard output" in capsys.readouterr().err


def test_runs_verdict_follows_atol_and_rtol(tmp_path, capsys):
    import pytest

    from opplugin.verify.check import DEFAULT_ATOL, DEFAULT_RTOL

    lenet = ["run", "lenet86", "--batch", "20", "--device", "cpu", "--repeat", "1"]
    assert main([*lenet, "--json", str(tmp_path / "default.json")]) == 0
    assert f"Against onnxruntime CPU: PASS at atol {DEFAULT_ATOL:g}, rtol {DEFAULT_RTOL:g}" in capsys.readouterr().out
    agreement = json.loads((tmp_path / "default.json").read_text())["agreement"]
    assert agreement["passed"] and (agreement["atol"], agreement["rtol"]) == (DEFAULT_ATOL, DEFAULT_RTOL)
    assert agreement["max_abs_error"] > 0  # the CPU's numpy reference and onnxruntime differ in rounding: 0 cannot pass
    assert main([*lenet, "--atol", "0", "--rtol", "0", "--json", str(tmp_path / "tight.json")]) == 1
    assert "Against onnxruntime CPU: FAIL at atol 0, rtol 0" in capsys.readouterr().out
    assert not json.loads((tmp_path / "tight.json").read_text())["agreement"]["passed"]
    assert main([*lenet, "--atol", "1e-3", "--no-compare"]) == 2
    assert capsys.readouterr().err.strip() == "opplugin: error: --atol and --rtol set the comparison with onnxruntime; leave out --no-compare"
    with pytest.raises(SystemExit):  # check's alone: run compares its output in pieces of its own
        main([*lenet, "--check-chunk", "4"])


def test_run_with_precision_fp16_records_it_and_runs_the_product_in_it(tmp_path, capsys):
    from onnx_builders import save
    from precision_cases import conv_mlp_model

    path = save(conv_mlp_model(), tmp_path / "conv_mlp.onnx")
    assert main(["run", path, "--batch", "4", "--device", "cpu", "--precision", "fp16", "--atol", "0.01", "--rtol", "0.01",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(", precision fp16 where a step has a kernel in it")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "opplugin-run/8" and data["precision"] == "fp16"
    assert [row["implementation"] for row in data["steps"]] == ["conv.reference+relu", "matmul.reference.fp16+relu", "gemm.reference+softmax"]
    # FP32 by default: the header says nothing, the JSON says fp32
    assert main(["run", path, "--batch", "4", "--device", "cpu", "--json", str(tmp_path / "fp32.json")]) == 0
    assert "precision" not in capsys.readouterr().out.splitlines()[0]
    assert json.loads((tmp_path / "fp32.json").read_text())["precision"] == "fp32"


def test_a_run_in_a_reduced_precision_is_held_to_its_formats_rule_unless_the_flags_set_one(tmp_path, capsys):
    from onnx_builders import save
    from precision_cases import conv_mlp_model

    path = save(conv_mlp_model(), tmp_path / "conv_mlp.onnx")
    # BF16's rule: 16 units of 2^-8 as atol and rtol, which the run's rounding stays within
    assert main(["run", path, "--batch", "4", "--device", "cpu", "--precision", "bf16", "--json", str(tmp_path / "bf16.json")]) == 0
    out = capsys.readouterr().out
    assert "Against onnxruntime CPU: PASS at atol 0.0625, rtol 0.0625" in out
    assert "(bf16's default rule against onnxruntime's FP32, as wide as the format's roundoff allows; --atol and --rtol set one)" in out
    agreement = json.loads((tmp_path / "bf16.json").read_text())["agreement"]
    assert (agreement["atol"], agreement["rtol"], agreement["widened_for"]) == (0.0625, 0.0625, "bf16")
    # FP32's rule, given, fails it: the rounding is real, and the flags win
    assert main(["run", path, "--batch", "4", "--device", "cpu", "--precision", "bf16", "--atol", "1e-4", "--rtol", "1e-3"]) == 1
    out = capsys.readouterr().out
    assert "Against onnxruntime CPU: FAIL at atol 0.0001, rtol 0.001" in out and "default rule" not in out
    # FP32 keeps its own rule and says nothing more
    assert main(["run", path, "--batch", "4", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "PASS at atol 0.0001, rtol 0.001" in out and "default rule" not in out


def test_run_refuses_a_precision_it_does_not_take_in_one_line(capsys):
    assert main(["run", "lenet86", "--device", "cpu", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err == "opplugin: error: --precision 'fp8': one of fp32, tf32, fp16, bf16, mixed (a step without a kernel in it stays fp32)\n"
