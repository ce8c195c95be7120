"""run's and check's report pages, from the records: a plan row per step, a timeline bar per
span of the last timed run (CUDA-graph replays on their own track), a roofline point per
plugin step with a FLOP and byte count, and check's row per compared tensor."""
import numpy as np
import pytest
from html_pages import ReadPage
from made_up_profiles import gpu_profile_with_a_graph

from opplugin.graph.model import load_model
from opplugin.report import html_sections, timing
from opplugin.report.charts import Roof
from opplugin.runtime import Runner


@pytest.fixture(scope="module")
def cpu_profile():
    runner = Runner(load_model("lenet86"), 6, "cpu", chunk=3)
    feeds = {"input": np.random.default_rng(0).uniform(0, 1, (6, 1, 86, 86)).astype(np.float32)}
    return runner.profile(feeds, warmup=0, repeat=2)


def test_a_cpu_run_page_has_the_plan_a_bar_per_span_and_a_point_per_plugin_step(cpu_profile):
    report = timing.build_report(cpu_profile, 0)
    page = ReadPage(html_sections.run_page(report, cpu_profile))
    plan = cpu_profile.plan
    assert [row[0] for row in page.rows[1:]] == [step.name for step in plan.steps]
    assert page.rows[0][-4:] == ["time ms", "GFLOP/s", "GB/s", "share"]
    spans = cpu_profile.result.spans
    assert len(spans) == 2 * len(plan.steps)  # two chunks
    # a bar per span on the timeline, one per op chain above it; the legend's key is a plugin rect too
    assert page.count("rect", "bar") == len(spans) + len(report["by_op_chain"]) and page.count("rect", "plugin") == len(spans) + 1
    html = html_sections.run_page(report, cpu_profile)
    assert html.index(">Plan<") < html.index(">Time by op chain<") < html.index(">Timeline<") < html.index(">Roofline<")
    assert page.count("rect", "key") == 1
    with_work = [row["step"] for row in report["steps"] if row["kind"] == "plugin" and row["gflops_per_s"] and row["gb_per_s"]]
    assert with_work == ["conv1", "conv2", "fc1", "fc2"]  # every step: fc1 reads the Flatten as a view
    assert page.count("circle", "point") == len(with_work)
    assert [t.split(":")[0] for t in page.titles if "FLOPs/byte" in t] == with_work
    text = html_sections.run_page(report, cpu_profile)
    assert "there is no roof" in text and "Not drawn" not in text
    assert "The last of 2 timed runs" in text and page.links == []


def test_graph_replays_get_a_track_of_their_own_above_their_lanes_steps():
    tracks = html_sections.timeline_tracks(gpu_profile_with_a_graph())
    assert [t.label for t in tracks] == ["lane 0: CUDA graph replays", "lane 0: CUDA stream (device clock)",
                                         "lane 1: CUDA graph replays", "lane 1: CUDA stream (device clock)"]
    assert [bar.name for bar in tracks[1].bars] == ["copy H2D input", "conv1", "conv2", "fc1", "fc2"]
    assert [bar.kind for bar in tracks[0].bars] == ["graph"]


def test_on_a_gpu_the_points_sit_under_the_measured_roof():
    profile = gpu_profile_with_a_graph()
    report = timing.build_report(profile, 2)
    roof = Roof(bytes_per_s=4e12, flops_per_s=50e12)
    text = html_sections.run_page(report, profile, roof)
    page = ReadPage(text)
    assert page.count("polyline", "roof") == 1 and page.count("circle", "point") == 4
    assert page.count("rect", "graph") == 2 + 1  # +1: the legend
    assert page.count("rect", "bar") == len(profile.result.spans) + len(report["by_op_chain"])  # the timeline's, the op chains'
    assert "measured as the run ended" in text
    bounds = {t.split(":")[0]: t.rsplit("; ", 1)[1] for t in page.titles if "FLOPs/byte" in t}
    # the ridge is at 12.5 FLOPs per byte: conv1 does 19 a byte, fc2 (a 32 x 10 Gemm) about 1
    assert bounds["conv1"] == "0.1% of the roof, compute-bound" and bounds["fc2"].endswith("memory-bound")


def test_the_check_section_shades_failures_and_names_the_first_bad_node():
    plan = Runner(load_model("lenet86"), 2, "cpu").plan_record(2)
    record = {"tensor": "pool1_out", "step": "conv1", "implementation": "conv.x", "error": None,
              "max_abs_error": 0.5, "max_rel_error": 0.1, "rel_l2": 0.01}
    report = {"schema": "opplugin-check/1", "opplugin_version": "0", "model": "lenet86", "batch": 2, "data": "random",
              "device": {"kind": "cpu", "name": "cpu", "compute_capability": None, "memory_bytes": None},
              "atol": 1e-4, "rtol": 1e-3, "passed": False, "onnxruntime_provider": "CPUExecutionProvider",
              "records": [record | {"passed": False},
                          record | {"tensor": "probabilities", "step": "fc2", "passed": True, "arbitration": "float64 says so"},
                          record | {"tensor": "x", "step": "fc1", "passed": False, "error": "shape (2, 3) against (2, 4)"}],
              "top1_agreement": 0.5, "accuracy": None, "steps_alone": {"first_bad_node": {"step": "conv1", "implementation": "conv.x"}}}
    text = html_sections.check_page(report, plan)
    page = ReadPage(text)
    check_rows = page.rows[len(plan.steps) + 2:]  # after the plan's header and rows, and the check's header
    assert [row[-1] for row in check_rows] == ["FAIL", "pass*", "FAIL: shape (2, 3) against (2, 4)"]
    assert check_rows[0][3:6] == ["5.00e-01", "1.00e-01", "1.00e-02"]
    assert page.count("tr", "fail") == 2 and page.count("td", "fail") == 2
    assert "FAIL at atol 0.0001, rtol 0.001" in text and "first bad node: conv1 (conv.x)" in text
    assert page.count("svg") == 0  # check times nothing: no charts
