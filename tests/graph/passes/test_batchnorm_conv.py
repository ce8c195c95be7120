"""BatchNormalization folded into the Conv before it (graph/passes/batchnorm_conv.py): weights and
bias computed in float64, the folded Conv writing the BatchNormalization's tensor, and `check`
against the original graph."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx_builders import conv_bn_relu, finish, save, x_feeds

from opplugin.cli import main
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.graph.passes.batchnorm_conv import fold_batchnorm
from opplugin.graph.simplify import simplify
from opplugin.plan.partition import PluginStep, make_plan
from opplugin.runtime import Runner
from opplugin.verify.check import check
from plan_text import describe

CPU = Device("cpu", "cpu")

# A simplification that fails falls back to the graph as loaded with a warning: here that is an error,
# so a broken pass cannot hide behind the fallback.
pytestmark = pytest.mark.filterwarnings("error::opplugin.graph.model.SimplificationWarning")


def _conv_bn_relu_pool_float64(x, w, b, scale, offset, mean, var, epsilon):
    """Conv (3x3, pads 1) > BatchNormalization > Relu > MaxPool 2x2 in float64, unfused."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, _, h, width = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n, c, h, w, 3, 3
    conv = np.einsum("nchwij,mcij->nmhw", windows, w) + b.astype(np.float64)[None, :, None, None]
    per_map = lambda v: v.astype(np.float64)[None, :, None, None]  # noqa: E731
    normal = (conv - per_map(mean)) / np.sqrt(per_map(var) + epsilon) * per_map(scale) + per_map(offset)
    relu = np.maximum(normal, 0)
    return relu.reshape(n, -1, h // 2, 2, width // 2, 2).max(axis=(3, 5))


def _initializers(proto):
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def test_folded_weights_and_bias_are_computed_in_float64():
    proto = conv_bn_relu(seed=4)
    source = _initializers(proto)
    simplified, done = simplify(proto)
    assert done.batchnorms_folded == 1 and done.summary() == "1 BatchNormalization folded into Conv"
    conv = next(n for n in simplified.graph.node if n.op_type == "Conv")
    folded = _initializers(simplified)
    weights, bias = folded[conv.input[1]], folded[conv.input[2]]
    assert weights.dtype == bias.dtype == np.float32

    epsilon = np.float64(np.float32(1e-3))  # the attribute is a float32
    factor = source["bn_scale"].astype(np.float64) / np.sqrt(source["bn_var"].astype(np.float64) + epsilon)
    expected_w = (source["w"].astype(np.float64) * factor[:, None, None, None]).astype(np.float32)
    expected_b = ((source["b"].astype(np.float64) - source["bn_mean"]) * factor + source["bn_bias"]).astype(np.float32)
    assert np.array_equal(weights, expected_w) and np.array_equal(bias, expected_b)
    # the same arithmetic in float32 rounds differently somewhere: the test can tell them apart
    factor32 = source["bn_scale"] / np.sqrt(source["bn_var"] + np.float32(1e-3))
    bias32 = (source["b"] - source["bn_mean"]) * factor32 + source["bn_bias"]
    assert not (np.array_equal(source["w"] * factor32[:, None, None, None], expected_w) and np.array_equal(bias32, expected_b))


def test_fold_batchnorm_without_a_conv_bias():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2, 1, 1)).astype(np.float32)
    scale, offset, mean, var = (rng.uniform(0.5, 2, 3).astype(np.float32) for _ in range(4))
    weights, bias = fold_batchnorm(w, None, scale, offset, mean, var, 1e-5)
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-5)
    assert np.array_equal(bias, (offset - mean.astype(np.float64) * factor).astype(np.float32))
    assert np.array_equal(weights, (w * factor[:, None, None, None]).astype(np.float32))


def test_plan_shows_the_fold_and_fuses_conv_relu_maxpool(tmp_path):
    model = load_model(save(conv_bn_relu(), tmp_path / "conv_bn.onnx"))
    plan = make_plan(model, 2, CPU)
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], PluginStep)
    assert plan.steps[0].ops == ["Conv", "Relu", "MaxPool"]
    text = describe(plan).splitlines()
    assert text[1] == "Simplified at load: 1 BatchNormalization folded into Conv"

    path = tmp_path / "plan.json"
    assert main(["plan", str(tmp_path / "conv_bn.onnx"), "--device", "cpu", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["schema"] == "opplugin-plan/7"
    assert data["simplified"] == {"constants_folded": {}, "batchnorms_folded": 1, "dropped": {}}


def test_folded_model_matches_float64_and_check_uses_the_original(tmp_path, references):
    proto = conv_bn_relu(seed=1, bias=True)
    model = load_model(save(proto, tmp_path / "conv_bn.onnx"))
    runner = Runner(model, 4, "cpu")
    feeds = x_feeds((4, 3, 10, 10))
    ours = runner.run(feeds).outputs["y"]
    init = _initializers(proto)
    expected = _conv_bn_relu_pool_float64(feeds["x"], init["w"], init["b"], init["bn_scale"], init["bn_bias"],
                                          init["bn_mean"], init["bn_var"], np.float64(np.float32(1e-3)))
    assert np.abs(ours - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())

    result = check(runner.run, runner.plan_record(4), feeds)
    assert result.passed
    assert [n.op_type for n in references[0].graph.node] == ["Conv", "BatchNormalization", "Relu", "MaxPool"]
    assert {r["tensor"] for r in result.records} == {"y"}


def test_a_step_after_a_fold_is_compared_with_the_batchnorms_output(tmp_path):
    """Without the pool the folded step ends at Relu; with the pool cut off by a second reader
    of the BatchNormalization's output, the folded Conv's own output is compared: it must be
    the BatchNormalization's tensor in the original graph."""
    proto = conv_bn_relu(seed=2)
    graph = proto.graph
    graph.node.append(helper.make_node("Neg", ["n"], ["negated"], name="neg"))
    graph.output.append(helper.make_tensor_value_info("negated", onnx.TensorProto.FLOAT, ["N", 6, 10, 10]))
    model = load_model(save(finish(graph), tmp_path / "two_readers.onnx"))
    runner = Runner(model, 2, "cpu")
    plan = runner.plan_record(2)
    conv = plan.plugin_steps[0]
    assert conv.ops == ("Conv",) and conv.outputs == ("n",)
    assert "n" in {o for node in model.original.graph.node for o in node.output if node.op_type == "BatchNormalization"}
    result = check(runner.run, plan, x_feeds((2, 3, 10, 10)))
    assert result.passed and "n" in {r["tensor"] for r in result.records}


def test_batchnorm_is_not_folded_when_the_conv_output_has_another_reader(tmp_path):
    model = load_model(save(conv_bn_relu(extra_reader=True), tmp_path / "shared.onnx"))
    assert not model.simplification.changed
    assert "BatchNormalization" in [n.op_type for n in model.proto.graph.node]
    plan = make_plan(model, 2, CPU)
    assert "Simplified" not in describe(plan)
    assert any(isinstance(s, PluginStep) and s.ops == ["BatchNormalization", "Relu"] for s in plan.steps)  # a pointwise group
    runner = Runner(model, 2, "cpu")
    assert check(runner.run, runner.plan_record(2), x_feeds((2, 3, 10, 10))).passed
