"""`run --trace`: the run's timeline as a Chrome / Perfetto trace that loads, whose
events are well formed, and whose spans add up to the report's figures."""
import dataclasses
import json
from collections import defaultdict

import numpy as np
import pytest

from opplugin.report import trace
from opplugin.cli import main
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.runtime.records import Profile, RunResult, RunTiming
from opplugin.runtime.timeline import Span

REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "M": {"name", "ph", "pid", "args"}}


def complete_events(data):
    return [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] != "run"]


def assert_well_formed(data):
    """Every event has its keys; durations are non-negative; each track is in time order,
    its spans do not overlap, and has a name."""
    events = data["traceEvents"]
    assert events and all(e["ph"] in REQUIRED and REQUIRED[e["ph"]] <= set(e) for e in events)
    named = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    by_track = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["ts"] >= 0
            by_track[event["tid"]].append(event)
    assert set(by_track) <= named
    for spans in by_track.values():
        starts = [e["ts"] for e in spans]
        assert starts == sorted(starts)
        for before, after in zip(spans, spans[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-3
    return by_track


def sums_by_step_us(data):
    sums = defaultdict(float)
    for event in complete_events(data):
        sums[event["name"]] += event["dur"]
    return sums


@pytest.mark.parametrize("chunk", [None, "5"])
def test_a_cpu_run_writes_a_trace_that_matches_its_report(tmp_path, chunk, capsys):
    argv = ["run", "lenet86", "--batch", "12", "--device", "cpu", "--repeat", "1", "--no-compare",
            "--trace", str(tmp_path / "t.json"), "--json", str(tmp_path / "r.json")]
    assert main(argv + (["--chunk", chunk] if chunk else [])) == 0
    data = json.loads((tmp_path / "t.json").read_text())  # valid JSON
    report = json.loads((tmp_path / "r.json").read_text())
    assert_well_formed(data)
    assert data["displayTimeUnit"] == "ms"
    assert data["otherData"]["schema"] == trace.SCHEMA and data["otherData"]["model"] == "lenet86"
    assert data["otherData"]["batch"] == 12 and data["otherData"]["device"]["kind"] == "cpu"
    chunks = report["chunks"]
    assert chunks == (3 if chunk else 1)
    events = complete_events(data)
    # every chunk's every step, on the one CPU lane's host track
    assert sorted(e["args"]["chunk"] for e in events) == sorted(list(range(chunks)) * len(report["steps"]))
    # on the CPU every span is host-timed, on its lane's host track
    assert all(e["args"]["clock"] == "host" and e["tid"] == 2 * e["args"]["lane"] + 3 for e in events)
    # one timed run: the trace's per-step sums are the report's figures
    sums = sums_by_step_us(data)
    assert set(sums) == {row["step"] for row in report["steps"]}
    for row in report["steps"]:
        assert sums[row["step"]] == pytest.approx(row["time_ms"] * 1e3, abs=1e-3 * chunks)
    run = next(e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "run")
    assert run["dur"] == pytest.approx(report["host_to_host_ms"] * 1e3, abs=1e-3)


def test_the_trace_is_of_the_last_timed_run():
    runner = Runner(load_model("lenet86"), 6, "cpu", chunk=2, streams=2)
    feeds = {"input": np.random.default_rng(0).uniform(0, 1, (6, 1, 86, 86)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=0, repeat=3)
    data = json.loads(trace.dumps(trace.build_trace(profile)))
    by_track = assert_well_formed(data)
    assert 3 in by_track and set(by_track) <= {1, 3, 5}  # the run, and the two CPU lanes' host tracks
    assert all(e["tid"] == 2 * e["args"]["lane"] + 3 for e in complete_events(data))
    assert {name: us / 1e3 for name, us in sums_by_step_us(data).items()} == pytest.approx(
        {name: times[-1] for name, times in profile.step_ms.items()}, abs=1e-5)
    assert data["otherData"]["run"] == "the last of 3 timed runs"


def gpu_like_profile():
    """A chunked run on two CUDA streams, as a GPU would record it (made up: there is no GPU here)."""
    plan = Runner(load_model("lenet86"), 4, "cpu").plan_record(4)
    plan = dataclasses.replace(plan, device=Device("cuda", "Test GPU", "9.0", 80 << 30))
    spans = []
    for chunk, lane in ((0, 0), (1, 1)):
        t = 0.5 * chunk
        spans += [
            Span("stage H2D input", "copy", chunk, 1, t, t + 0.1, lane, "host"),
            Span("copy H2D input", "copy", chunk, 2, t + 0.1, t + 0.3, lane, "device"),
            Span("conv1", "plugin", chunk, 3, t + 0.3, t + 0.6, lane, "device"),
            Span("conv2", "plugin", chunk, 4, t + 0.6, t + 0.8, lane, "device"),
            Span("copy D2H pool2_out", "copy", chunk, 5, t + 0.8, t + 0.9, lane, "device"),
            Span("onnxruntime1", "onnxruntime", chunk, 6, t + 0.9, t + 1.0, lane, "host"),
        ]
    result = RunResult({}, {}, 1.6, batch=4, chunks=2, chunk_size=2, streams=2, timing=RunTiming.of(spans))
    profile = Profile(plan, result)
    profile.add(result)
    return profile


def test_device_and_host_work_of_each_stream_go_on_its_two_tracks():
    data = json.loads(trace.dumps(trace.build_trace(gpu_like_profile())))
    by_track = assert_well_formed(data)
    names = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert names[1] == "run (host to host)"  # the process's main thread: no lane shares its tid
    assert names[2] == "lane 0: CUDA stream (device clock)" and names[3] == "lane 0: host (host clock)"
    assert names[4] == "lane 1: CUDA stream (device clock)" and names[5] == "lane 1: host (host clock)"
    assert [e["name"] for e in by_track[4]] == ["copy H2D input", "conv1", "conv2", "copy D2H pool2_out"]
    assert [e["name"] for e in by_track[5]] == ["stage H2D input", "onnxruntime1"]
    # lane 1's upload overlaps lane 0's kernels: what the trace is for
    conv2_lane0 = next(e for e in by_track[2] if e["name"] == "conv2")
    upload_lane1 = next(e for e in by_track[4] if e["name"] == "copy H2D input")
    assert conv2_lane0["ts"] <= upload_lane1["ts"] < conv2_lane0["ts"] + conv2_lane0["dur"]
    assert upload_lane1["ts"] == pytest.approx(600.0) and upload_lane1["dur"] == pytest.approx(200.0)
    assert data["otherData"]["device"] == {"kind": "cuda", "name": "Test GPU", "compute_capability": "9.0", "memory_bytes": 80 << 30}
    assert {e["cat"] for e in complete_events(data)} == {"copy", "plugin", "onnxruntime"}
