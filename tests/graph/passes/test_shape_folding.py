"""Shape arithmetic folded at load: Shape > Gather > ... > Reshape, as the TorchScript
exporter writes a channel shuffle, plans with concrete shapes at any batch; what
depends on data values never folds."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from onnx_builders import finish, save
from opplugin.verify.check import check
from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.graph.simplify import simplify
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from shape_models import channel_shuffle, reshape_to_data, view_by_gather

CPU = select_device("cpu")


def test_channel_shuffle_targets_fold_into_constants_that_hold_at_any_batch(tmp_path):
    model = load_model(save(channel_shuffle(), tmp_path / "shuffle.onnx"))
    ops = [n.op_type for n in model.nodes]
    assert "Shape" not in ops and "Gather" not in ops and "Concat" not in ops
    targets = [model.initializers[n.input[1]].tolist() for n in model.nodes if n.op_type == "Reshape"]
    assert targets == [[-1, 2, 2, 6, 6], [0, -1, 6, 6]]  # the batch's element: -1, or 0 beside a -1
    for batch in (1, 5):
        plan = make_plan(model, batch, CPU)
        pool = next(s for s in plan.plugin_steps if s.node.op_type == "GlobalAveragePool")
        assert pool.node.inputs[0].shape == (batch, 4, 6, 6)  # concrete H and W for the plugin after it
        # the whole shuffle on the device: one Transpose kernel, the Reshapes on either side read as views
        assert [s.node.op_type for s in plan.plugin_steps] == ["Conv", "Transpose", "GlobalAveragePool"]


def test_channel_shuffle_passes_check_in_chunks_of_another_batch(tmp_path):
    model = load_model(save(channel_shuffle(), tmp_path / "shuffle.onnx"))
    runner = Runner(model, 7, "cpu", chunk=3)  # chunks of 3, 3 and 1 images through one plan
    x = np.random.default_rng(4).uniform(-1, 1, (7, 4, 6, 6)).astype(np.float32)
    result = check(runner.run, runner.plan_record(7), {"x": x})
    assert result.passed, result.records
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], expected, rtol=1e-5, atol=1e-5)


def test_shapes_and_targets_read_from_data_do_not_fold(tmp_path):
    model = load_model(save(reshape_to_data(), tmp_path / "data.onnx"))
    assert model.simplification.constants_folded == {"Slice": 1, "Shape": 1}  # (C, H, W) of x
    ops = [n.op_type for n in model.nodes]
    assert ops == ["ReduceMax", "Mul", "Cast", "Add", "Unsqueeze", "Concat", "Reshape", "NonZero", "Shape", "Cast"]
    reshape = next(n for n in model.nodes if n.op_type == "Reshape")
    assert reshape.input[1] == "target" and "target" not in model.initializers
    x = np.random.default_rng(6).uniform(-1, 1, (2, 4, 6, 6)).astype(np.float32)
    runner = Runner(model, 2, "cpu")
    outputs = runner.run({"x": x}).outputs
    np.testing.assert_array_equal(outputs["r"], x)
    np.testing.assert_array_equal(outputs["y"], [4, x.size])


def test_a_gather_of_every_position_in_order_is_a_reshape_at_any_batch(tmp_path):
    """torch's as_strided of a contiguous tensor, exported as Gather at indices computed from the batch:
    a view, so the plan has no onnxruntime step and the Transpose after it gets concrete shapes."""
    model = load_model(save(view_by_gather(), tmp_path / "view.onnx"))
    ops = [n.op_type for n in model.nodes]
    assert ops == ["GlobalAveragePool", "Reshape", "Reshape", "Transpose", "Relu"]
    assert model.initializers[model.nodes[2].input[1]].tolist() == [-1, 6, 1, 1]
    x = np.random.default_rng(7).uniform(-1, 1, (7, 6, 5, 5)).astype(np.float32)
    runner = Runner(model, 7, "cpu", chunk=3)
    assert all(step.kind == "plugin" for step in runner.plan.steps)
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], expected, rtol=1e-6, atol=1e-6)


def test_a_gather_that_reorders_stays_a_gather(tmp_path):
    model = load_model(save(view_by_gather(in_order=False), tmp_path / "gather.onnx"))
    assert "Gather" in [n.op_type for n in model.nodes]
    x = np.random.default_rng(8).uniform(-1, 1, (3, 6, 5, 5)).astype(np.float32)
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Runner(model, 3, "cpu").run({"x": x}).outputs["y"], expected, rtol=1e-6, atol=1e-6)


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
