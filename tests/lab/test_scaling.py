"""`opplugin bench --scaling` (lab/scaling.py) on the CPU: the speed-up and efficiency arithmetic,
the rows compared with onnxruntime, a whole benchmark over "cpu" runners (the reference
backend standing for devices) with its JSON and table, and the one-line errors for device lists
that cannot be timed. The GPU run itself is `opplugin bench --scaling` on a GPU machine."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opplugin.gpu import cuda
from opplugin.cli import main
from opplugin.lab import scaling
from opplugin.lab.scaling_text import SHARED_NOTE, format_text, save_plot
from opplugin.graph.model import load_model
from opplugin.runtime import multi_device as device_module
from opplugin.runtime.feeding import MIN_PROBE_SHARE, fed_count
from opplugin.runtime.multi_device import DeviceSlot

CPU = DeviceSlot()


def _row(runners: int, rate: float | None) -> dict:
    return {"runners": runners, "images_per_s": rate}


def test_speedup_and_efficiency_are_taken_against_the_first_one_runner_row():
    rows = scaling.add_scaling([_row(2, 1900.0), _row(1, 1000.0), _row(1, 500.0), _row(4, 3000.0), _row(3, None)])
    assert [row["speedup"] for row in rows] == pytest.approx([1.9, 1.0, 0.5, 3.0, None])
    assert [row["efficiency"] for row in rows[:4]] == pytest.approx([0.95, 1.0, 0.5, 0.75])
    assert rows[4]["efficiency"] is None


def test_without_a_one_runner_rate_there_is_no_efficiency():
    rows = scaling.add_scaling([_row(2, 1900.0), _row(1, None)])
    assert rows[0]["speedup"] is None and rows[0]["efficiency"] is None


def test_sample_rows_are_the_ends_and_both_sides_of_every_share_boundary():
    shares = [slice(0, 7), slice(7, 14), slice(14, 20)]
    assert scaling.sample_rows(20, shares, edge=2).tolist() == [0, 1, 5, 6, 7, 8, 12, 13, 14, 15, 18, 19]
    assert scaling.sample_rows(3, [slice(0, 2), slice(2, 3), None], edge=4).tolist() == [0, 1, 2]  # each row once


def _cpu_lists(*texts: str) -> list[scaling.DeviceList]:
    return [scaling.DeviceList(text, (CPU,) * len(text.split(","))) for text in texts]


@pytest.fixture(scope="module")
def payload():
    """lenet86 at 23 images over one, two and three "cpu" runners (the baseline given second)."""
    lists = _cpu_lists("0,0", "0", "0,0,0")
    return scaling.run_scaling(load_model("lenet86"), [23], lists, warmup=0, repeat=2)


def test_a_cpu_benchmark_gives_a_row_per_list_in_the_order_given(payload):
    assert list(payload)[:5] == ["schema", "opplugin_version", "device", "model", "batch"]
    assert payload["schema"] == scaling.SCHEMA and payload["model"] == "lenet86" and payload["batch"] == [23]
    assert payload["device"]["kind"] == "cpu"
    assert payload["settings"]["warmup"] == 0 and payload["settings"]["repeat"] == 2
    rows = payload["rows"]
    assert [row["devices"] for row in rows] == ["0,0", "0", "0,0,0"]
    assert all(list(row) == list(scaling.ROW_KEYS) for row in rows)
    for row in rows:
        assert len(row["times_ms"]) == 2 and row["time_ms"] == pytest.approx(float(np.median(row["times_ms"])))
        assert row["images_per_s"] == pytest.approx(23 / (row["time_ms"] / 1e3))
        assert [runner["images"] for runner in row["per_runner"]] == [len(r) for r in np.array_split(range(23), row["runners"])]
    two, one, three = rows
    assert one["speedup"] == 1.0 and one["efficiency"] == 1.0 and one["max_abs_vs_one"] == 0.0
    assert two["efficiency"] == pytest.approx(two["images_per_s"] / (2 * one["images_per_s"]))
    assert three["speedup"] == pytest.approx(three["images_per_s"] / one["images_per_s"])
    assert (two["shared_gpu"], one["shared_gpu"]) == (True, False) and (two["gpus"], two["runners"]) == (1, 2)
    # 23 images: too few for run to probe, so run would use every runner of each list
    assert [(len(row["feeding"]["used"]), row["feeding"]["probed"]) for row in rows] == [(2, False), (1, False), (3, False)]
    assert two["feeding"]["why_not_probed"] == f"the batch gives each device under {MIN_PROBE_SHARE} images"


def test_every_list_is_checked_against_onnxruntime_and_the_one_device_outputs(payload):
    """On the CPU the split is exact: any row put back in the wrong place shows as a difference."""
    for row in payload["rows"]:
        assert row["agrees"] is True and row["max_abs_error"] < 1e-4
        assert row["max_abs_vs_one"] == 0.0
        assert row["input_pinned"] is False  # no GPU: plain host memory
    # two runners: rows 0-3, 8-15 around the boundary at 12, 19-22; one: the ends; three (8, 8, 7): every row
    assert [row["compared_rows"] for row in payload["rows"]] == [16, 8, 23]


def test_each_list_says_how_many_devices_run_would_use_from_its_feed_probe(tiny_model_path):
    """A batch large enough for run to probe: each list is still timed as given, and its row carries
    the probe run would make (the count chosen is this machine's: only its consistency is checked)."""
    batch = 2 * MIN_PROBE_SHARE + 1
    payload = scaling.run_scaling(load_model(tiny_model_path), [batch], _cpu_lists("0", "0,0"), warmup=0, repeat=1)
    one, two = payload["rows"]
    assert [runner["images"] for runner in two["per_runner"]] == [MIN_PROBE_SHARE + 1, MIN_PROBE_SHARE]  # timed as given
    assert one["feeding"]["probed"] is False and one["feeding"]["why_not_probed"] == "one device given"
    feeding = two["feeding"]
    assert feeding["probed"] is True and [(row["devices"], row["images"]) for row in feeding["probe"]] == [(1, MIN_PROBE_SHARE + 1),
                                                                                                         (2, batch)]
    used = fed_count([row["images_per_s"] for row in feeding["probe"]])
    assert feeding["used"] == ["cpu #1", "cpu #2"][:used]
    lines = format_text(payload).splitlines()
    row = next(line for line in lines if line.split()[:2] == [f"{batch:,}", "0,0"])
    assert row.rstrip().endswith("2" if used == 2 else "1 of 2")
    probe = next(line for line in lines if line.startswith(f"--devices 0,0 at {batch:,}: the host fed "))
    assert probe.endswith("cpu #2 left idle") == (used == 1)


def test_the_payload_is_strict_json(payload):
    from opplugin.report.jsonout import dumps

    assert json.loads(dumps(payload)) == payload


def test_the_table_marks_runners_that_share_a_device(payload):
    text = format_text(payload)
    lines = text.splitlines()
    assert lines[0].startswith("Scaling of lenet86 on the CPU (numpy reference backend): host to host")
    assert "median of 2 timed passes after 0 warm-up" in lines[0]
    row = next(line for line in lines if line.startswith("23") and " 0,0 *" in line)
    assert "pass (16 rows)" in row
    assert SHARED_NOTE in lines
    one = next(line for line in lines if line.split()[:2] == ["23", "0"])
    assert "1.00x" in one and "100.0%" in one


def test_a_failed_comparison_fails_the_benchmark(payload):
    broken = json.loads(json.dumps(payload))
    broken["rows"][2]["agrees"] = False
    assert scaling.failed(broken) and not scaling.failed(payload)
    assert "FAIL (23 rows)" in format_text(broken)


def test_the_picture_is_a_png(payload, tmp_path):
    pytest.importorskip("matplotlib")
    save_plot(payload, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the command line --------------------------------------------------------------------


@pytest.fixture
def two_gpus(monkeypatch):
    """CuPy seeing two CUDA devices, for the checks of the lists made before anything runs."""
    monkeypatch.setattr(cuda, "device_count", lambda: 2)


@pytest.fixture
def cpu_runners(two_gpus, monkeypatch):
    """Every id of a list checked as on two GPUs, then run as a "cpu" runner."""
    checked = device_module.cuda_slots
    monkeypatch.setattr(scaling, "cuda_slots", lambda text: [CPU for _ in checked(text)])


def test_bench_scaling_prints_the_table_and_writes_the_json(cpu_runners, tmp_path, capsys):
    path = tmp_path / "s.json"
    assert main(["bench", "--scaling", "--batches", "9", "--devices", "0", "0,0", "--warmup", "0", "--repeat", "1",
                 "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Scaling of lenet86 on the CPU")
    assert "lenet86: 9 images over --devices 0,0 (2 runners)" in captured.err
    data = json.loads(path.read_text())
    assert data["schema"] == "opplugin-bench-scaling/2" and data["batch"] == [9]
    assert [(row["devices"], row["runners"], row["agrees"]) for row in data["rows"]] == [("0", 1, True), ("0,0", 2, True)]


def test_the_default_lists_go_from_one_device_to_every_device(two_gpus):
    assert [(entry.text, entry.runners, entry.gpus) for entry in scaling.device_lists(None)] == [("0", 1, 1), ("0,1", 2, 2)]
    assert scaling.device_lists(["all", "1"])[0].slots == (DeviceSlot(0), DeviceSlot(1))


@pytest.mark.parametrize("argv, message", [
    (["--scaling", "--devices", "0,1"], "--devices 0,1: give a one-device list too (such as 0); "
                                        "efficiency is images/s on n devices over n times that of one"),
    (["--scaling", "--devices", "0", "0,1", "0"], "--devices 0: this list is given twice; give each list once"),
    (["--scaling", "--devices", "0", "0,x"], "--devices 0,x: give all, or device ids such as 0,1"),
    (["--scaling", "--devices", "0", "0,2"], "--devices 0,2: no CUDA device 2; this machine has 2 (ids 0 to 1)"),
    (["--scaling", "--batches", "0"], "--batches must be a positive integer, got 0"),
    (["--devices", "0"], "--devices applies to bench --scaling"),
    (["--plot", "s.png"], "--plot applies to bench --scaling"),
    (["--scaling", "--e2e", "m.onnx"], "--scaling and --e2e are two benchmarks; give one"),
])
def test_lists_that_cannot_be_timed_are_one_line_errors(two_gpus, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"opplugin: error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_without_a_cuda_device_it_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    assert main(["bench", "--scaling"]) == 2
    assert capsys.readouterr().err.strip() == "opplugin: error: bench --scaling needs a CUDA device, and CuPy sees none"


def test_a_plot_without_matplotlib_is_refused_before_any_work(two_gpus, monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "matplotlib" else real(name, *rest))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--scaling", "--plot", "s.png"]) == 2
    assert capsys.readouterr().err.strip() == ("opplugin: error: --plot draws with matplotlib, which is not installed here "
                                               "(pip install matplotlib)")
    assert list(tmp_path.iterdir()) == []
