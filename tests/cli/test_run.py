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
    assert out.count("Op Time:") == 5  # conv1, conv2, the Flatten view, fc1, fc2
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
    def failed(plan, feeds, ours):
        return {"passed": False, "top1_agreement": 0.5, "max_abs_error": 1.0, "rel_l2": 1.0}

    monkeypatch.setattr(run_command, "agreement", failed)
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1"]) == 1
    assert "Against onnxruntime CPU: FAIL" in capsys.readouterr().out
    assert main(["run", "ece408_high", "--batch", "2", "--device", "cpu", "--repeat", "1", "--no-compare"]) == 0
