"""Load-time simplification: BatchNormalization folded into Conv in float64, constants
folded, identities dropped, graph outputs kept, and `check` against the original graph."""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx_builders import conv_bn_relu, finish, identities_and_constants, save

from opplugin.verify import check as check_module
from opplugin.verify.check import check
from opplugin.cli import main
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep, PluginStep, make_plan
from plan_text import describe
from opplugin.runtime import Runner
from opplugin.ort.sessions import Reference
from opplugin.graph.simplify import fold_batchnorm, simplify


@pytest.fixture
def references(monkeypatch):
    """The models check's onnxruntime reference sessions are built from, in order."""
    built = []

    class Recording(Reference):
        def __init__(self, model_proto, extra_outputs=(), **options):
            built.append(model_proto)
            super().__init__(model_proto, extra_outputs, **options)

    monkeypatch.setattr(check_module, "Reference", Recording)
    return built

CPU = Device("cpu", "cpu")

# A simplification that fails falls back to the graph as loaded with a warning: here that is an error,
# so a broken pass cannot hide behind the fallback.
pytestmark = pytest.mark.filterwarnings("error::opplugin.graph.model.SimplificationWarning")


def _feeds(shape, seed=3):
    return {"x": np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}


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
    assert done.batchnorms_folded == 1 and done.describe() == "1 BatchNormalization folded into Conv"
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


def test_original_model_is_kept_untouched(tmp_path):
    proto = conv_bn_relu()
    model = load_model(save(proto, tmp_path / "m.onnx"))
    assert [n.op_type for n in model.original.graph.node] == ["Conv", "BatchNormalization", "Relu", "MaxPool"]
    assert [n.op_type for n in model.proto.graph.node] == ["Conv", "Relu", "MaxPool"]
    onnx.checker.check_model(model.proto, full_check=True)


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
    assert data["schema"] == "opplugin-plan/4"
    assert data["simplified"] == {"constants_folded": {}, "batchnorms_folded": 1, "dropped": {}}


def test_folded_model_matches_float64_and_check_uses_the_original(tmp_path, references):
    proto = conv_bn_relu(seed=1, bias=True)
    model = load_model(save(proto, tmp_path / "conv_bn.onnx"))
    runner = Runner(model, 4, "cpu")
    feeds = _feeds((4, 3, 10, 10))
    ours = runner.run(feeds).outputs["y"]
    init = _initializers(proto)
    expected = _conv_bn_relu_pool_float64(feeds["x"], init["w"], init["b"], init["bn_scale"], init["bn_bias"],
                                          init["bn_mean"], init["bn_var"], np.float64(np.float32(1e-3)))
    assert np.abs(ours - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())

    result = check(runner.run, runner.describe(4), feeds)
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
    plan = runner.describe(2)
    conv = plan.plugin_steps[0]
    assert conv.ops == ("Conv",) and conv.outputs == ("n",)
    assert "n" in {o for node in model.original.graph.node for o in node.output if node.op_type == "BatchNormalization"}
    result = check(runner.run, plan, _feeds((2, 3, 10, 10)))
    assert result.passed and "n" in {r["tensor"] for r in result.records}


def test_batchnorm_is_not_folded_when_the_conv_output_has_another_reader(tmp_path):
    model = load_model(save(conv_bn_relu(extra_reader=True), tmp_path / "shared.onnx"))
    assert not model.simplification.changed
    assert "BatchNormalization" in [n.op_type for n in model.proto.graph.node]
    plan = make_plan(model, 2, CPU)
    assert "Simplified" not in describe(plan)
    assert any(isinstance(s, PluginStep) and s.ops == ["BatchNormalization", "Relu"] for s in plan.steps)  # a pointwise group
    runner = Runner(model, 2, "cpu")
    assert check(runner.run, runner.describe(2), _feeds((2, 3, 10, 10))).passed


def test_constants_fold_identities_drop_and_outputs_keep_their_names(tmp_path):
    model = load_model(save(identities_and_constants(), tmp_path / "ids.onnx"))
    done = model.simplification
    assert done.dropped == {"Identity": 2, "Dropout": 1}
    assert done.constants_folded["ConstantOfShape"] == 1 and done.constants_folded["Constant"] == 2
    assert done.constants_folded["Shape"] == 1 and done.constants_folded["Concat"] == 1
    assert [n.op_type for n in model.proto.graph.node] == ["Conv", "Relu", "Reshape"]
    assert model.outputs == ["y", "flat"]
    assert [o.name for o in model.proto.graph.output] == ["y", "flat"]

    plan = make_plan(model, 2, CPU)
    conv = plan.steps[0]
    assert isinstance(conv, PluginStep) and conv.ops == ["Conv", "Relu"] and conv.outputs == ["y"]
    assert np.all(conv.node.constants["w"] == np.float32(0.25))
    runner = Runner(model, 2, "cpu")
    feeds = _feeds((2, 2, 6, 6))
    result = check(runner.run, runner.describe(2), feeds)
    assert result.passed
    theirs = Reference(model.original)(feeds)
    ours = runner.run(feeds).outputs
    assert np.allclose(ours["flat"], theirs["flat"], atol=1e-5) and ours["flat"].shape == (2, 144)


def test_identity_from_a_graph_input_to_a_graph_output_stays():
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1, 4, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["copy"], name="copy"),
         helper.make_node("Dropout", ["x"], ["d", "mask"], name="dropout"),
         helper.make_node("Relu", ["d"], ["r"], name="relu")],
        "kept", [x],
        [helper.make_tensor_value_info("copy", onnx.TensorProto.FLOAT, ["N", 1, 4, 4]),
         helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, ["N", 1, 4, 4]),
         helper.make_tensor_value_info("mask", onnx.TensorProto.BOOL, ["N", 1, 4, 4])])
    simplified, done = simplify(finish(graph))
    assert not done.changed  # the Identity's output cannot be renamed; the Dropout's mask is read
    assert [n.op_type for n in simplified.graph.node] == ["Identity", "Dropout", "Relu"]


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_shipped_models_are_not_changed(name):
    model = load_model(name)
    assert not model.simplification.changed
    assert model.proto.SerializeToString() == model.original.SerializeToString()
    assert "Simplified" not in describe(make_plan(model, 2, CPU))


def _light_model(name):
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"the installed onnx package has no {path}")
    return path


def test_light_resnet50_plans_no_onnxruntime_step():
    model = load_model(_light_model("resnet50"))
    assert model.simplification.batchnorms_folded == 53
    assert model.simplification.constants_folded == {"ConstantOfShape": 239}
    plan = make_plan(model, 1, CPU)
    assert not [s for s in plan.steps if isinstance(s, OrtStep)]  # the pools have plugins of their own
    # 53 Convs (16 with their Sum > Relu fused), the two pools, the Reshape (a view) and Gemm > Softmax
    assert len(plan.plugin_steps) == 57
    fused = [step.ops for step in plan.plugin_steps if "Sum" in step.ops]
    assert len(fused) == 16 and all(ops == ["Conv", "Sum", "Relu"] for ops in fused)


def test_a_failing_simplification_warns_and_runs_the_graph_as_loaded(tmp_path, monkeypatch):
    import opplugin.graph.model as model_module

    def broken(proto):
        raise RuntimeError("boom")

    monkeypatch.setattr(model_module, "simplify_apart", broken)
    with pytest.warns(model_module.SimplificationWarning, match="graph simplification failed.*boom"):
        model = load_model(save(conv_bn_relu(), tmp_path / "m.onnx"))
    assert not model.simplification.changed
    assert "BatchNormalization" in [n.op_type for n in model.proto.graph.node]


def test_unnamed_nodes_keep_their_names_through_simplification(tmp_path):
    proto = conv_bn_relu()
    for node in proto.graph.node:
        node.name = ""
    model = load_model(save(proto, tmp_path / "unnamed.onnx"))
    assert [n.name for n in model.proto.graph.node] == ["Conv_0", "Relu_2", "MaxPool_3"]
    assert [n.name for n in model.original.graph.node] == ["Conv_0", "BatchNormalization_1", "Relu_2", "MaxPool_3"]


def test_runs_agreement_compares_with_the_original_graph(tmp_path, references):
    model = load_model(save(conv_bn_relu(seed=5), tmp_path / "conv_bn.onnx"))
    runner = Runner(model, 3, "cpu")
    feeds = _feeds((3, 3, 10, 10))
    figures = check_module.agreement(runner.describe(3), feeds, runner.run(feeds).outputs["y"])
    assert figures["passed"]
    assert "BatchNormalization" in [n.op_type for n in references[0].graph.node]


def test_a_reshape_target_that_carries_a_free_batch_becomes_a_constant_for_every_batch():
    """Shape > Gather(0) reads the batch, which is only known at run time: the Reshape's
    target [N, -1] becomes [0, -1] (0: the input's batch), and the arithmetic goes."""
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
         helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
         helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="concat", axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")],
        "free_batch", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 6])],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                     numpy_helper.from_array(np.array([0], np.int64), "axes"),
                     numpy_helper.from_array(np.array([-1], np.int64), "minus_one")])
    original = finish(graph)
    simplified, done = simplify(original)
    assert done.constants_folded == {"Concat": 1, "Unsqueeze": 1, "Gather": 1, "Shape": 1}
    assert [n.op_type for n in simplified.graph.node] == ["Reshape"]
    target = next(t for t in simplified.graph.initializer if t.name == simplified.graph.node[0].input[1])
    assert numpy_helper.to_array(target).tolist() == [0, -1]
    for batch in (1, 4):
        x = np.random.default_rng(batch).standard_normal((batch, 2, 3)).astype(np.float32)
        ours, theirs = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                        for m in (simplified, original))
        np.testing.assert_array_equal(ours, theirs)


def test_a_reshape_target_over_patches_of_every_image_gets_minus_one_where_it_follows_the_batch():
    """A vision transformer's tokens (MobileViT): x is [N*4, 16, 6]; the target is Shape(x)[0:1] then
    constants, [4N, 4, 4, 6]: its first element follows the batch but is not the batch, so it becomes -1."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["images", "patches"], ["x"], name="patchify"),
         helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Slice", ["s", "zero", "one"], ["n"], name="slice"),
         helper.make_node("Concat", ["n", "rest"], ["target"], name="concat", axis=0),
         helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")],
        "patches", [helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT, ["N", 4, 16, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["M", 4, 4, 6])],
        initializer=[numpy_helper.from_array(np.array([-1, 16, 6], np.int64), "patches"),
                     numpy_helper.from_array(np.array([0], np.int64), "zero"),
                     numpy_helper.from_array(np.array([1], np.int64), "one"),
                     numpy_helper.from_array(np.array([4, 4, 6], np.int64), "rest")])
    original = finish(graph)
    simplified, done = simplify(original)
    assert [n.op_type for n in simplified.graph.node] == ["Reshape", "Reshape"]
    target = next(t for t in simplified.graph.initializer if t.name == simplified.graph.node[1].input[1])
    assert numpy_helper.to_array(target).tolist() == [-1, 4, 4, 6]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 16, 6)).astype(np.float32)
        ours, theirs = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
                        for m in (simplified, original))
        np.testing.assert_array_equal(ours, theirs)


def _batch_of(name: str) -> list[onnx.NodeProto]:
    """Shape(name)[0:1]: the batch, computed at run time."""
    return [helper.make_node("Shape", [name], [f"{name}_shape"], name=f"{name}_shape"),
            helper.make_node("Slice", [f"{name}_shape", "zero", "one"], [f"{name}_batch"], name=f"{name}_batch")]


def _same_as_onnxruntime(simplified, original, shape, batches=(1, 3)):
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, *shape[1:])).astype(np.float32)
        ours, theirs = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                        for m in (simplified, original))
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


SMALL_INTS = [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one")]


def test_a_positional_encoding_built_from_a_mask_of_the_batch_folds_into_a_constant_for_one_image(tmp_path):
    """EdgeNeXt's encoding: Expand(0, [N, H, W]) > Not-like arithmetic > CumSum > Sin, added to x: the same for
    every image, so it is made for one and folds; the Add broadcasts it along the batch."""
    nodes = [*_batch_of("x"),
             helper.make_node("Concat", ["x_batch", "hw"], ["mask_shape"], name="mask_shape", axis=0),
             helper.make_node("Expand", ["zero_f", "mask_shape"], ["zeros"], name="zeros"),
             helper.make_node("Add", ["zeros", "one_f"], ["ones"], name="ones"),
             helper.make_node("CumSum", ["ones", "axis2"], ["position"], name="cumsum"),
             helper.make_node("Sin", ["position"], ["encoding"], name="sin"),
             helper.make_node("Unsqueeze", ["encoding", "one"], ["encoding4"], name="unsqueeze"),
             helper.make_node("Add", ["x", "encoding4"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "encoding", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 4, 5])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, 4, 5])],
                              initializer=[*SMALL_INTS, numpy_helper.from_array(np.array([4, 5], np.int64), "hw"),
                                           numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
                                           numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
                                           numpy_helper.from_array(np.array(2, np.int64), "axis2")])
    original = finish(graph)
    simplified, _ = simplify(original)
    assert [n.op_type for n in simplified.graph.node] == ["Add"]
    encoding = next(t for t in simplified.graph.initializer if t.name == "encoding4")
    assert list(encoding.dims) == [1, 1, 4, 5]  # one image's: the Add broadcasts it
    _same_as_onnxruntime(simplified, original, (1, 3, 4, 5))
    runner = Runner(load_model(save(original, tmp_path / "encoding.onnx")), 3, "cpu")
    assert all(s.kind == "plugin" for s in runner.plan.steps)


def test_a_constant_of_the_batchs_shape_that_meets_data_along_another_axis_stays():
    """ConstantOfShape([N, 2]) concatenated with x along axis 1: made for one image, the Concat would not
    line up, so shape inference undoes it and the graph stays as it was."""
    nodes = [*_batch_of("x"),
             helper.make_node("Concat", ["x_batch", "two"], ["pad_shape"], name="pad_shape", axis=0),
             helper.make_node("ConstantOfShape", ["pad_shape"], ["pad"], name="pad",
                              value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("Concat", ["x", "pad"], ["y"], name="concat", axis=1)]
    graph = helper.make_graph(nodes, "padded", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5])],
                              initializer=[*SMALL_INTS, numpy_helper.from_array(np.array([2], np.int64), "two")])
    original = finish(graph)
    simplified, _ = simplify(original)
    assert "ConstantOfShape" in [n.op_type for n in simplified.graph.node]
    _same_as_onnxruntime(simplified, original, (1, 3))


def test_an_expand_target_that_carries_the_inputs_own_batch_becomes_a_constant(tmp_path):
    """XCA attention's norm.expand_as(q): Expand(ReduceL2(x) [N, C, 1], [N, C, W]): the batch's element is
    the input's own extent, so 1 keeps it at every batch, and the Expand runs in the pointwise group."""
    nodes = [*_batch_of("x"),
             helper.make_node("ReduceL2", ["x"], ["norm"], name="norm", keepdims=1, axes=[2]),
             helper.make_node("Concat", ["x_batch", "cw"], ["target"], name="target", axis=0),
             helper.make_node("Expand", ["norm", "target"], ["norm_full"], name="expand"),
             helper.make_node("Div", ["x", "norm_full"], ["y"], name="div")]
    graph = helper.make_graph(nodes, "normalised", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 6])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3, 6])],
                              initializer=[*SMALL_INTS, numpy_helper.from_array(np.array([3, 6], np.int64), "cw")])
    original = finish(graph)
    simplified, _ = simplify(original)
    assert [n.op_type for n in simplified.graph.node] == ["ReduceL2", "Expand", "Div"]
    target = next(t for t in simplified.graph.initializer if t.name == simplified.graph.node[1].input[1])
    assert numpy_helper.to_array(target).tolist() == [1, 3, 6]
    _same_as_onnxruntime(simplified, original, (1, 3, 6))
    runner = Runner(load_model(save(original, tmp_path / "normalised.onnx")), 3, "cpu")
    assert all(s.kind == "plugin" for s in runner.plan.steps), runner.plan.fallbacks
    x = np.random.default_rng(5).standard_normal((3, 3, 6)).astype(np.float32)
    theirs = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], theirs, rtol=1e-6, atol=1e-6)


def test_of_two_batch_shaped_constants_the_one_that_lines_up_folds_and_the_other_stays():
    """Tried together, shape inference refuses the pair (the ConstantOfShape meets x along axis 1); one at a
    time, the Expand's encoding folds and the ConstantOfShape stays as it was."""
    nodes = [*_batch_of("x"),
             helper.make_node("Concat", ["x_batch", "three"], ["ones_shape"], name="ones_shape", axis=0),
             helper.make_node("Expand", ["one_f", "ones_shape"], ["ones"], name="ones"),
             helper.make_node("CumSum", ["ones", "axis1"], ["position"], name="cumsum"),
             helper.make_node("Add", ["x", "position"], ["y"], name="add"),
             helper.make_node("Concat", ["x_batch", "two"], ["pad_shape"], name="pad_shape", axis=0),
             helper.make_node("ConstantOfShape", ["pad_shape"], ["pad"], name="pad",
                              value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("Concat", ["x", "pad"], ["z"], name="concat", axis=1)]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3]),
                               helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, ["N", 5])],
                              initializer=[*SMALL_INTS, numpy_helper.from_array(np.array([3], np.int64), "three"),
                                           numpy_helper.from_array(np.array([2], np.int64), "two"),
                                           numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
                                           numpy_helper.from_array(np.array(1, np.int64), "axis1")])
    original = finish(graph)
    simplified, _ = simplify(original)
    ops = [n.op_type for n in simplified.graph.node]
    assert "Expand" not in ops and "CumSum" not in ops and "ConstantOfShape" in ops
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3)).astype(np.float32)
        ours, theirs = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
                        for m in (simplified, original))
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
