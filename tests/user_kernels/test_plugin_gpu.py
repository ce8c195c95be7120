"""Bring your own kernel on a GPU: the starter passes check on both shipped models, a
wrong kernel fails and is named as the first bad node, --sanitize finds a planted
out-of-bounds write, --watch picks up an edit, and a hanging kernel is stopped."""
import subprocess
import sys

import pytest

from opplugin.cli import main
from user_kernel_fixtures import FUSED, edited, new_starter, watch_through_an_edit
from repository import ROOT

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("model", ["lenet86", "ece408_high"])
@pytest.mark.parametrize("kernel", ["starter", "fused"])
def test_user_kernels_pass_check_on_the_shipped_models(tmp_path, model, kernel, capsys):
    starter = new_starter(tmp_path)
    path = starter if kernel == "starter" else FUSED
    assert main(["check", model, "--batch", "1000", "--kernel", f"Conv={path}"]) == 0
    out = capsys.readouterr().out
    assert "PASS at atol" in out
    assert path.name in out  # the report names the kernel by its file
    if kernel == "starter":
        assert ", then cupy+" in out  # its epilogue ran as a separate step


def test_the_relu_starter_passes_check(tmp_path, capsys):
    path = tmp_path / "my_relu.cu"
    assert main(["new", "relu", str(path)]) == 0
    assert main(["check", "lenet86", "--batch", "500", "--kernel", f"Relu={path}"]) == 0
    out = capsys.readouterr().out
    assert "my_relu.cu" in out and "PASS at atol" in out


@pytest.mark.parametrize("old, new, named", [
    # forgetting the bias is wrong for every node; conv1 comes first
    ("acc += b[m];", "", "First bad node: conv1 (wrong.cu, then cupy+relu+maxpool2)"),
    # half the outputs never written: the NaN poison shows through
    ("    y[index] = acc;", "    if (index % 2) y[index] = acc;", "First bad node: conv1 (wrong.cu"),
])
def test_a_wrong_kernel_fails_check_and_is_named_the_first_bad_node(tmp_path, old, new, named, capsys):
    wrong = edited(new_starter(tmp_path), old, new, "wrong.cu")
    assert main(["check", "lenet86", "--batch", "300", "--kernel", f"Conv={wrong}"]) == 1
    out = capsys.readouterr().out
    assert named in out and "FAIL" in out


def test_sanitize_finds_a_planted_out_of_bounds_write(tmp_path, capsys):
    starter = new_starter(tmp_path)
    planted = edited(starter, "    y[index] = acc;", "    y[index + OH * OW] = acc;  // one map too far", "oob.cu")
    line = next(n for n, text in enumerate(planted.read_text().splitlines(), 1) if "one map too far" in text)
    assert main(["check", "lenet86", "--batch", "4", "--kernel", f"Conv={planted}", "--sanitize"]) == 2
    out, err = capsys.readouterr()
    assert "memcheck" in out and "Invalid __global__ write" in out and f"oob.cu:{line}" in out
    assert "y[index + OH * OW] = acc;" in out
    assert err.startswith(f"{planted}: compute-sanitizer found") and err.count("\n") == 1


def test_sanitize_passes_the_starter(tmp_path, capsys):
    starter = new_starter(tmp_path)
    assert main(["check", "lenet86", "--batch", "4", "--kernel", f"Conv={starter}", "--sanitize"]) == 0
    assert "--sanitize: memcheck, initcheck found nothing in my_conv.cu" in capsys.readouterr().out


def test_watch_picks_up_an_edit(tmp_path):
    starter = new_starter(tmp_path)
    code, text = watch_through_an_edit(["lenet86", "--batch", "200", "--kernel", f"Conv={starter}"], starter,
                                       "    y[index] = acc;", "    y[index] = acc + 1.0f;")
    assert code == 0
    assert "measured:" in text and "after the edit:" in text
    first, second = text.split("after the edit:")
    assert "conv1 (my_conv.cu, then cupy+relu+maxpool2): error" in first and "pass" in first and "x floor" in first
    assert "-> " in second and "FAIL" in second  # the edit made it wrong, and the diff shows it


def test_a_hanging_kernel_stops_with_a_clear_message(tmp_path):
    starter = new_starter(tmp_path)
    spin = "    float acc = 0.0f;\n    for (volatile const float* p = x; p[0] == p[0];) { }  // spins: the input is finite"
    hang = edited(starter, "    float acc = 0.0f;", spin, "hang.cu")
    done = subprocess.run([sys.executable, "-m", "opplugin", "check", "lenet86", "--batch", "8", "--kernel", f"Conv={hang}"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert "did not finish within 10 s on one image of conv1" in done.stderr and "Traceback" not in done.stderr


def test_the_api_runs_a_kernel_source_with_constant_weights():
    import numpy as np

    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner
    from opplugin.user_kernels import KernelSource

    source = KernelSource(str(FUSED), "Conv")
    runner = Runner(load_model("lenet86"), 64, "cuda", kernels={"Conv": source})
    assert [step.name for step in runner.plan.plugin_steps if step.node.op_type == "Conv"] == ["conv1", "conv2"]
    assert runner.kernels["conv1"].name == "conv_fused.cu"
    feeds = {"input": np.random.default_rng(1).standard_normal((64, 1, 86, 86), dtype=np.float32)}
    from opplugin.verify.check import check

    assert check(runner.run, runner.plan_record(64), feeds).passed
