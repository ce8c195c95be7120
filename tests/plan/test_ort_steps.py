"""onnxruntime steps extracted whole: each asks for every tensor a later step reads,
a plugin step's fused followers included (a residual Add reading an onnxruntime step's
output), and nodes nobody reads make no step."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish, save
from opplugin.verify.check import check
from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep, make_plan
from opplugin.registry import plugins
from opplugin.gpu.device import select_device
from opplugin.runtime import Runner


def _const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, initializers, name, channels=4, size=6):
    rng = np.random.default_rng(1)
    weights = numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.3, "w")
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, size, size])], initializer=[weights, *initializers])
    return finish(graph)


def ghost_model():
    """A ghost module's tail: half the channels sliced off, concatenated twice, scaled (Mul),
    and added to a Conv's output, an Add the Conv's kernel fuses."""
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["half"], name="slice"),
        helper.make_node("Concat", ["half", "half"], ["both"], name="concat", axis=1),
        helper.make_node("Mul", ["both", "scale"], ["scaled"], name="mul"),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "scaled"], ["y"], name="add"),
    ]
    constants = [_const("starts", [0]), _const("ends", [2]), _const("axes", [1]), _const("scale", 0.5, np.float32)]
    return _model(nodes, constants, "ghost")


def resize_model():
    """A Resize whose optional roi input is left empty (""), its output read by a fused Add."""
    nodes = [
        helper.make_node("MaxPool", ["x"], ["small"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Resize", ["small", "", "scales"], ["up"], name="resize", mode="nearest"),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "up"], ["y"], name="add"),
    ]
    return _model(nodes, [_const("scales", [1, 1, 2, 2], np.float32)], "resize_empty_roi")


# the layout plugins would run Slice, Concat and Resize: without them, those nodes make the onnxruntime steps
WITHOUT_LAYOUT = {op: plugin for op, plugin in plugins().items() if op not in ("Slice", "Concat", "Resize")}


@pytest.mark.parametrize("build", [ghost_model, resize_model])
def test_an_onnxruntime_step_read_by_a_fused_follower_passes_check(build, tmp_path):
    model = load_model(save(build(), tmp_path / "m.onnx"))
    runner = Runner(model, 3, "cpu", registry=WITHOUT_LAYOUT)
    ort_steps = [s for s in runner.plan.steps if isinstance(s, OrtStep)]
    fused = [s for s in runner.plan.plugin_steps if s.ops == ["Conv", "Add"]]
    assert ort_steps and fused, [s.ops for s in runner.plan.steps]
    written = {o for step in runner.plan.steps for o in step.outputs}
    assert fused[0].inputs[-1] in written  # the residual is written by a step before it
    assert all(step.outputs for step in ort_steps)
    feeds = {"x": np.random.default_rng(2).uniform(-1, 1, (3, 4, 6, 6)).astype(np.float32)}
    result = check(runner.run, runner.plan_record(3), feeds)
    assert result.passed, result.records


def test_nodes_nobody_reads_make_no_onnxruntime_step(tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sin", ["x"], ["unused"], name="dead"),
    ]
    model = load_model(save(_model(nodes, [], "dead_code"), tmp_path / "m.onnx"))
    plan = make_plan(model, 2, select_device("cpu"))
    assert [s.ops for s in plan.steps] == [["Conv"]]


@pytest.mark.parametrize("build", [ghost_model, resize_model])
def test_with_the_layout_plugins_the_same_models_run_without_onnxruntime_steps_and_pass_check(build, tmp_path):
    runner = Runner(load_model(save(build(), tmp_path / "m.onnx")), 3, "cpu")
    assert not [s for s in runner.plan.steps if isinstance(s, OrtStep)], [s.ops for s in runner.plan.steps]
    feeds = {"x": np.random.default_rng(2).uniform(-1, 1, (3, 4, 6, 6)).astype(np.float32)}
    result = check(runner.run, runner.plan_record(3), feeds)
    assert result.passed, result.records
