"""`opplugin profile` on the GPU: the slowest steps of lenet86 with their Nsight Compute counters by
node name, and a user's starter kernel named down to its hottest source line."""
import json

import pytest

from opplugin.cli import main
from opplugin.lab.ncu import find_ncu
from user_kernel_fixtures import new_starter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(find_ncu() is None, reason="ncu (Nsight Compute) is not installed")]


def test_profile_gives_the_slowest_steps_counters(tmp_path, capsys):
    report = tmp_path / "profile.json"
    assert main(["profile", "lenet86", "--batch", "256", "--top", "2", "--json", str(report), "--report", str(tmp_path / "p.html")]) == 0
    page = (tmp_path / "p.html").read_text()
    assert page.count("<circle") == 2 and "Counters" in page
    out = capsys.readouterr().out
    assert "Roofline of this device (measured)" in out and "speed of light: compute" in out
    steps = json.loads(report.read_text())["steps"]
    assert len(steps) == 2 and all(step["kernels"] for step in steps)
    for step in steps:
        for kernel in step["kernels"]:
            assert kernel["ms"] > 0 and 0 < kernel["compute_pct"] + kernel["memory_pct"]
            assert kernel["registers_per_thread"] > 0 and kernel["stalls"] and kernel["theoretical_occupancy_pct"] > 0


def test_profile_names_the_hottest_line_of_a_users_kernel(tmp_path, capsys):
    starter = new_starter(tmp_path)
    report = tmp_path / "profile.json"
    assert main(["profile", "lenet86", "--batch", "256", "--kernel", f"Conv={starter}", "--step", "conv2",
                 "--json", str(report), "--ncu-report", str(tmp_path / "raw.ncu-rep")]) == 0
    [step] = json.loads(report.read_text())["steps"]
    assert step["step"] == "conv2" and step["implementation"].startswith("my_conv.cu")
    [hot, *_] = step["kernels"][0]["hot_lines"]
    assert hot["file"].endswith("my_conv.cu") and hot["share"] > 0
    lines = starter.read_text().splitlines()
    assert hot["text"] == lines[hot["line"] - 1].strip()
    assert f"my_conv.cu:{hot['line']}" in capsys.readouterr().out
    assert (tmp_path / "raw.ncu-rep").stat().st_size > 0
