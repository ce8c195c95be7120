"""CUDA graphs (on by default on a GPU): runs of plugin steps captured at their second pass
and replayed after, with the same results as eager runs, on fresh inputs every time, and
each step timed by events recorded inside the graph."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from opplugin.report import timing as report
from opplugin.verify.check import compare
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin
from opplugin.registry import Kernel
from opplugin.runtime import Runner
from nonfinite_cases import poisoned

pytestmark = pytest.mark.gpu


def _reference(model, feeds):
    return ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_replayed_graphs_give_the_eager_runs_results_on_fresh_inputs_each_time(name):
    model = load_model(name)
    eager = Runner(model, 64, "cuda", chunk=64, streams=1, cuda_graphs=False)
    graphs = Runner(model, 64, "cuda", chunk=64, streams=1)  # graphs by default
    assert graphs.cuda_graphs and not eager.cuda_graphs
    # pass 1 eager, pass 2 captures the untimed graph, pass 3 the timed one (over the same buffers), then replays
    for seed in range(6):
        feeds = make_inputs(model, 64, "random", seed=seed).feeds
        out = graphs.run(feeds, step_times=seed % 2 == 0)
        np.testing.assert_array_equal(out.outputs[model.outputs[0]], eager.run(feeds).outputs[model.outputs[0]])
        assert compare(out.outputs[model.outputs[0]], _reference(model, feeds))["passed"]
        assert bool(out.graphs) == (seed > 0)
    assert not graphs.graph_failures()
    steps = [s.name for s in graphs.plan.plugin_steps]
    assert [n for members in out.graphs.values() for n in members] == steps  # every plugin step is in a graph
    [lane] = graphs.scheduler.lanes
    [key] = lane.graphs.captured()
    timed, untimed = lane.graphs.get(key, timed=True), lane.graphs.get(key, timed=False)
    assert timed.step_marks and not untimed.step_marks and timed.inputs is untimed.inputs and timed.pool is untimed.pool


def test_untimed_replays_time_the_run_and_timed_ones_its_steps():
    model = load_model("lenet86")
    runner = Runner(model, 16, "cuda", chunk=16, streams=1)
    feeds = make_inputs(model, 16, "random", seed=3).feeds
    profile = runner.profile(feeds, warmup=2, repeat=7)
    [(graph, members)] = profile.graphs.items()
    untimed, timed = runner.run(feeds), runner.run(feeds, step_times=True)
    np.testing.assert_array_equal(untimed.outputs["probabilities"], timed.outputs["probabilities"])
    assert not {t.name for t in untimed.times} & set(members) and set(members) <= {t.name for t in timed.times}
    assert set(untimed.graph_ms) == set(timed.graph_ms) == {graph}
    # the untimed run's copies go untimed too; the timed run's are its spans
    assert not [s for s in untimed.spans if s.kind == "copy" and s.clock == "device"]
    assert {s.name for s in timed.spans if s.kind == "copy"} >= {"copy H2D input", "copy D2H probabilities"}
    # the profile's wall clock is the untimed runs'; those replays carry no step events, so they are no slower
    # (quickest readings: a host held up before a launch lengthens that replay's span, as other test workers do)
    assert len(profile.total_ms) == 7
    for attempt in range(3):  # another profile where every reading of one met a GPU busy with other workers
        measured = profile if attempt == 0 else runner.profile(feeds, warmup=1, repeat=7)
        untimed_ms, timed_ms = min(measured.untimed_graph_ms[graph]), min(measured.graph_ms[graph])
        print(f"lenet86 at 16: replays {untimed_ms:.4f} ms without step events, {timed_ms:.4f} ms with them")
        if untimed_ms <= timed_ms + EVENT_SLACK_MS:
            break
    assert untimed_ms <= timed_ms + EVENT_SLACK_MS


def test_a_run_that_keeps_an_intermediate_after_replays_gets_it_from_a_graph_of_its_own():
    model = load_model("lenet86")
    runner = Runner(model, 32, "cuda", chunk=32, streams=1)
    eager = Runner(model, 32, "cuda", chunk=32, streams=1, cuda_graphs=False)
    inner = runner.plan.plugin_steps[0].outputs[0]  # read by the next step only: inside the replayed graph
    for seed in range(3):  # eager, then captured, then replayed
        runner.run(make_inputs(model, 32, "random", seed=seed).feeds)
    for seed in range(3, 6):  # the kept run is met anew: eager, captured, replayed
        feeds = make_inputs(model, 32, "random", seed=seed).feeds
        kept, expected = runner.run(feeds, keep=(inner,)), eager.run(feeds, keep=(inner,))
        np.testing.assert_array_equal(kept.kept[inner], expected.kept[inner])
        np.testing.assert_array_equal(kept.outputs["probabilities"], expected.outputs["probabilities"])
    [lane] = runner.scheduler.lanes
    kept = [key[2] for key in lane.graphs.captured()]  # each with the graph's outputs as well
    assert len(kept) == 2 and sorted(inner in names for names in kept) == [False, True]


def test_chunked_runs_on_several_lanes_replay_a_graph_per_lane_and_chunk_size():
    model = load_model("lenet86")
    runner = Runner(model, 1000, "cuda", chunk=300, streams=2)  # chunks of 300, 300, then a halving tail
    eager = Runner(model, 1000, "cuda", chunk=300, streams=2, cuda_graphs=False)
    for seed in range(3):
        feeds = make_inputs(model, 1000, "random", seed=seed).feeds
        np.testing.assert_array_equal(runner.run(feeds).outputs["probabilities"], eager.run(feeds).outputs["probabilities"])
    sizes = {rows for lane in runner.scheduler.lanes for (_first, rows, _kept) in lane.graphs.captured()}
    assert sizes == {300, 200, 100, 75, 25}


# A replay's time is its input copies, the graph's launch and its steps: the steps' events, inside the
# graph, must fall within the replay's span, and at a batch where the kernels dominate add up to most of it.
STEPS_SHARE_OF_REPLAY = 0.8
EVENT_SLACK_MS = 0.002  # two events' readings differ by up to about a microsecond
# An eager step's events bracket the host's Python for its call too (checks, allocations, the launch): on an
# H200's host 20 to 35 us. A kernel shorter than that is timed eagerly as the host, so its graphed time has
# no lower bound from the eager one (ece408_high's fc2 at batch 1024: eager 0.0335 ms, graphed 0.0092).
EAGER_HOST_MS = 0.035


@pytest.mark.parametrize("name", ["lenet86", "ece408_high"])
def test_each_step_keeps_its_row_timed_by_events_inside_the_replay(name):
    model = load_model(name)
    runner = Runner(model, 1024, "cuda", chunk=1024, streams=1)
    feeds = make_inputs(model, 1024, "random").feeds
    profile = runner.profile(feeds, warmup=2, repeat=5)
    built = report.build_report(profile, 2)
    graphs = built["cuda_graphs"]
    assert [m for members in graphs.values() for m in members] == [s.name for s in runner.plan.plugin_steps]
    assert set(built["op_times_ms"]) == {s.name for s in runner.plan.plugin_steps}
    rows = {r["step"]: r for r in built["steps"]}
    spans = profile.result.spans
    for graph, members in graphs.items():
        assert graph not in rows  # the replay as a whole is no row of the table
        assert all(rows[m]["time_ms"] > 0 and rows[m]["kind"] == "plugin" for m in members)
        # quickest readings: a replay's span opens when its start event is reached, which may be before the host
        # has launched the graph or before the GPU turns to this process (other test workers share both); that
        # lengthens the span, not the steps inside it. Where every reading of a profile met that, another is taken.
        shares = []
        for attempt in range(3):
            measured = profile if attempt == 0 else runner.profile(feeds, warmup=1, repeat=5)
            replay = min(measured.graph_ms[graph])
            steps = sum(min(measured.step_ms[m]) for m in members)
            print(f"{name} {graph}: steps {steps:.4f} ms of the replay's {replay:.4f} ms ({steps / replay:.1%})")
            assert steps <= replay + EVENT_SLACK_MS
            shares.append(steps / replay)
            if shares[-1] >= STEPS_SHARE_OF_REPLAY:
                break
        assert max(shares) >= STEPS_SHARE_OF_REPLAY, shares
        # in the last run, every step's span lies inside its replay's span, in plan order
        [whole] = [s for s in spans if s.kind == "graph" and s.name == graph]
        inside = [s for s in spans if s.name in members]
        assert [s.name for s in inside] == members
        assert all(whole.start_ms - EVENT_SLACK_MS <= s.start_ms <= s.end_ms <= whole.end_ms + EVENT_SLACK_MS for s in inside)
        assert all(a.end_ms <= b.start_ms + EVENT_SLACK_MS for a, b in zip(inside, inside[1:]))
    text = report.format_text(built)
    assert "step times from events inside the graphs" in text and all(f"({m})" in text for m in built["op_times_ms"])


@pytest.mark.parametrize("name", ["lenet86", "ece408_high"])
def test_graphed_step_times_are_close_to_eager_ones(name):
    """Printed for the record (-rP); a kernel step's graphed time is its kernel's, so near its eager time. A
    step with no device work (a view) is timed by the host clock eagerly and by two adjacent events in a graph.
    Each side is compared by its quickest reading, over three profiles of 9 runs: whatever else shares the
    device (other test workers) or holds up the host only ever adds to a reading, and under 16 workers all 9
    eager readings of one profile were once 3x the graphed one (ece408_high's Conv: 0.208 against 0.064 ms)."""
    model = load_model(name)
    feeds = make_inputs(model, 1024, "random").feeds
    quickest, medians, runners = {}, {}, {}
    for graphs in (False, True):
        runners[graphs] = Runner(model, 1024, "cuda", chunk=1024, streams=1, cuda_graphs=graphs)
        profiles = [runners[graphs].profile(feeds, warmup=2, repeat=9) for _ in range(3)]
        steps = profiles[0].plan.plugin_steps
        quickest[graphs] = {s.name: min(min(p.step_ms[s.name]) for p in profiles) for s in steps}
        medians[graphs] = {s.name: profiles[0].median(s.name) for s in steps}
    for step, eager in quickest[False].items():
        graphed = quickest[True][step]
        print(f"{name} {step}: eager {eager:.4f} ms, graphed {graphed:.4f} ms ({graphed / eager - 1:+.1%}); "
              f"medians {medians[False][step]:.4f} and {medians[True][step]:.4f} ms")
        kernel = runners[True].kernels[step]
        if kernel.device_work and len(getattr(kernel, "functions", ())) > 1:
            # several launches (a K split's GEMM and its reduce): eagerly, the host's time between them counts too
            assert graphed <= 1.5 * eager + EVENT_SLACK_MS
        elif kernel.device_work:
            assert graphed <= 1.5 * eager + EVENT_SLACK_MS
            if graphed >= EAGER_HOST_MS:
                assert 0.5 * eager - EVENT_SLACK_MS <= graphed
        else:
            assert graphed < eager


class _SynchronisingConv(ConvPlugin):
    """The built-in Conv plugin, whose kernels wait for the device on every call: not capturable."""

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, variant, fused, prologue, graphed)

        class Waiting(Kernel):  # the optional members left at their defaults: no out=, no replay
            name, variant, nonfinite_exact, device_work = kernel.name, kernel.variant, kernel.nonfinite_exact, kernel.device_work
            flops, bytes_moved, workspace_bytes = kernel.flops, kernel.bytes_moved, kernel.workspace_bytes

            def __call__(self, inputs, stream=None):
                [y] = kernel(inputs, stream)
                float(y.ravel()[0])  # a copy to the host, which a capturing stream refuses
                return [y]

        return Waiting()


def test_a_run_that_cannot_be_captured_stays_eager_and_says_why():
    model = load_model("lenet86")
    runner = Runner(model, 16, "cuda", chunk=16, streams=1, registry={"Conv": _SynchronisingConv()})
    feeds = make_inputs(model, 16, "random").feeds
    for _ in range(3):
        result = runner.run(feeds)
        assert compare(result.outputs["probabilities"], _reference(model, feeds))["passed"] and not result.graphs
    first = runner.plan.plugin_steps[0].name
    assert list(runner.graph_failures()) == [first]
    profile = runner.profile(feeds, warmup=0, repeat=2)
    built = report.build_report(profile, 0)
    assert list(built["cuda_graph_failures"]) == [first]
    assert all(r["time_ms"] > 0 for r in built["steps"] if r["kind"] == "plugin")  # eager: every step timed
    [line] = [line for line in report.format_text(built).splitlines() if "ran eagerly" in line]
    assert line.startswith(f"CUDA graph: the plugin steps from {first} ran eagerly: ")


def test_nan_in_a_replayed_graph_still_takes_the_exact_path():
    model = load_model("lenet86")
    runner = Runner(model, 64, "cuda", chunk=16, streams=1)
    clean = make_inputs(model, 64, "random", seed=5).feeds["input"]
    runner.run({"input": clean})
    runner.run({"input": clean})  # captured
    x = poisoned(clean)
    result = runner.run({"input": x})
    assert result.graphs and result.exact_reruns == 1
    reference = _reference(model, {"input": x})
    np.testing.assert_array_equal(np.isnan(result.outputs["probabilities"]), np.isnan(reference))
    assert compare(result.outputs["probabilities"], reference)["passed"]
    # the graph clears its own flags each replay: clean inputs after poisoned ones take no exact path
    assert runner.run({"input": clean}).exact_reruns == 0


@pytest.mark.parametrize("graphs", [True, False])
def test_a_result_read_after_later_runs_keeps_its_own_spans(graphs):
    """Runs leave their events unread (runtime/deferred_timings.py): a result read only after three more runs
    must still hold its own run's spans, all inside its own wall time, not the events of a later run."""
    model = load_model("lenet86")
    runner = Runner(model, 256, "cuda", chunk=256, streams=1, cuda_graphs=graphs)
    feeds = make_inputs(model, 256, "random").feeds
    for _ in range(3):
        runner.run(feeds)  # graphs captured
    results = [runner.run(feeds, step_times=seed % 2 == 0) for seed in range(5)]
    for result in results:
        assert result.spans and all(-0.01 <= s.start_ms <= s.end_ms <= result.total_ms + 0.01 for s in result.spans), \
            [(s.name, s.start_ms, s.end_ms, result.total_ms) for s in result.spans]
    timed = [result for result in results[::2]]
    names = {s.name for s in runner.plan.plugin_steps}
    assert all(names <= {t.name for t in result.times} for result in timed)
