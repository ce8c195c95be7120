"""CUDA graphs (Runner(cuda_graphs=True)): runs of plugin steps captured at their second pass
and replayed after, with the same results as eager runs, on fresh inputs every time."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from opplugin import report
from opplugin.check import compare
from opplugin.data import make_inputs
from opplugin.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin
from opplugin.runtime import Runner
from test_exact import _poisoned

pytestmark = pytest.mark.gpu


def _reference(model, feeds):
    return ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_replayed_graphs_give_the_eager_runs_results_on_fresh_inputs_each_time(name):
    model = load_model(name)
    eager = Runner(model, 64, "cuda", chunk=64, streams=1)
    graphs = Runner(model, 64, "cuda", chunk=64, streams=1, cuda_graphs=True)
    for seed in range(4):  # pass 1 eager, pass 2 captures, passes 3 and 4 replay on new inputs
        feeds = make_inputs(model, 64, "random", seed=seed).feeds
        out = graphs.run(feeds)
        np.testing.assert_array_equal(out.outputs[model.outputs[0]], eager.run(feeds).outputs[model.outputs[0]])
        assert compare(out.outputs[model.outputs[0]], _reference(model, feeds))["passed"]
        assert bool(out.graphs) == (seed > 0)
    assert not graphs.graph_failures()
    steps = [s.name for s in graphs.plan.plugin_steps]
    assert [n for members in out.graphs.values() for n in members] == steps  # every plugin step is in a graph


def test_chunked_runs_on_several_lanes_replay_a_graph_per_lane_and_chunk_size():
    model = load_model("lenet86")
    runner = Runner(model, 1000, "cuda", chunk=300, streams=2, cuda_graphs=True)  # chunks of 300 and a last one of 100
    eager = Runner(model, 1000, "cuda", chunk=300, streams=2)
    for seed in range(3):
        feeds = make_inputs(model, 1000, "random", seed=seed).feeds
        np.testing.assert_array_equal(runner.run(feeds).outputs["probabilities"], eager.run(feeds).outputs["probabilities"])
    sizes = {rows for lane in runner.scheduler.lanes for (_first, rows) in lane.graphs.captured()}
    assert sizes == {300, 100}


def test_the_report_shows_each_graph_as_one_row_with_its_steps():
    model = load_model("lenet86")
    runner = Runner(model, 32, "cuda", chunk=32, streams=1, cuda_graphs=True)
    profile = runner.profile(make_inputs(model, 32, "random").feeds, warmup=2, repeat=3)
    built = report.build_report(profile, 2)
    [(name, members)] = built["cuda_graphs"].items()
    row = next(r for r in built["steps"] if r["step"] == name)
    assert row["implementation"] == f"CUDA graph of {len(members)} plugin steps" and row["time_ms"] > 0
    assert "CUDA graphs: 1 graph(s) replayed" in report.format_text(built)


class _SynchronisingConv(ConvPlugin):
    """The built-in Conv plugin, whose kernels wait for the device on every call: not capturable."""

    def build(self, node, device, variant=None, fused=()):
        kernel = super().build(node, device, variant, fused)

        class Waiting:
            name, variant, nonfinite_exact, device_work = kernel.name, kernel.variant, kernel.nonfinite_exact, kernel.device_work
            flops, bytes_moved, workspace_bytes = kernel.flops, kernel.bytes_moved, kernel.workspace_bytes

            def __call__(self, inputs, stream=None):
                [y] = kernel(inputs, stream)
                float(y.ravel()[0])  # a copy to the host, which a capturing stream refuses
                return [y]

        return Waiting()


def test_a_run_that_cannot_be_captured_stays_eager_and_says_why():
    model = load_model("lenet86")
    runner = Runner(model, 16, "cuda", chunk=16, streams=1, registry={"Conv": _SynchronisingConv()}, cuda_graphs=True)
    feeds = make_inputs(model, 16, "random").feeds
    for _ in range(3):
        result = runner.run(feeds)
        assert compare(result.outputs["probabilities"], _reference(model, feeds))["passed"] and not result.graphs
    assert list(runner.graph_failures()) == [runner.plan.plugin_steps[0].name]


def test_nan_in_a_replayed_graph_still_takes_the_exact_path():
    model = load_model("lenet86")
    runner = Runner(model, 64, "cuda", chunk=16, streams=1, cuda_graphs=True)
    clean = make_inputs(model, 64, "random", seed=5).feeds["input"]
    runner.run({"input": clean})
    runner.run({"input": clean})  # captured
    x = _poisoned(clean)
    result = runner.run({"input": x})
    assert result.graphs and result.exact_reruns == 1
    reference = _reference(model, {"input": x})
    np.testing.assert_array_equal(np.isnan(result.outputs["probabilities"]), np.isnan(reference))
    assert compare(result.outputs["probabilities"], reference)["passed"]
    # the graph clears its own flags each replay: clean inputs after poisoned ones take no exact path
    assert runner.run({"input": clean}).exact_reruns == 0
