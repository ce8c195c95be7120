"""opplugin check: the verdict, its tolerances, and the inputs it says it used."""
from opplugin.cli import main


def test_check_passes_on_the_cpu(capsys):
    assert main(["check", "ece408_high", "--batch", "50", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "Test Accuracy:" in out and "Top-1 agreement with onnxruntime: 1.0000" in out


def test_check_at_zero_tolerance_differs_from_onnxruntime_and_float64_arbitrates(tiny_model_path, capsys):
    # at zero tolerance the reference and onnxruntime's Conv round differently somewhere; re-run
    # alone, each such step is no further from float64 than onnxruntime over the whole tensor, so the check passes and says so
    # (a wrong kernel still exits 1: tests/verify/test_first_bad.py, user_kernels/test_plugin.py)
    assert main(["check", tiny_model_path, "--batch", "3", "--device", "cpu", "--atol", "0", "--rtol", "0"]) == 0
    out = capsys.readouterr().out
    assert "pass*" in out and "passed by float64 arbitration (*)" in out and "PASS at atol 0, rtol 0" in out


def test_check_on_any_model_uses_seeded_random_inputs(tmp_path, capsys):
    from onnx_builders import save, single_conv

    path = save(single_conv((1, 2, 7, 7), (3, 2, 3, 3), {"dilations": [2, 1]}, bias=False, weights_as_input=True),
                tmp_path / "conv.onnx")
    assert main(["check", path, "--batch", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "random uniform" in out and "PASS" in out


def test_any_integer_seed_is_accepted(tiny_model_path, capsys):
    assert main(["check", tiny_model_path, "--batch", "2", "--device", "cpu", "--seed", "-7"]) == 0
    assert "random uniform [0, 1), seed -7" in capsys.readouterr().out


def test_check_writes_its_html_report_with_a_row_per_comparison(tmp_path, capsys):
    import json

    from html_pages import ReadPage

    argv = ["check", "lenet86", "--batch", "4", "--device", "cpu", "--report", str(tmp_path / "c.html"), "--json", str(tmp_path / "c.json")]
    assert main(argv) == 0
    page, data = ReadPage((tmp_path / "c.html").read_text()), json.loads((tmp_path / "c.json").read_text())
    assert page.links == []
    results = [row for row in page.rows if row and row[-1] in ("pass", "pass*", "FAIL")]
    assert [row[0] for row in results] == [record["tensor"] for record in data["records"]]
    assert len(results) == 5 and page.count("td", "pass") == 5  # four steps' outputs and the model's (fc reads the Flatten as a view)
