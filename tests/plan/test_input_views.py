"""Input views (plan/input_views.py, the plugins' view_of): the layout nodes between a QKV projection and a
fused attention become views its step reads through, not steps; what something else reads stays a step;
the K transposed per head through merged axes stays a view; the runs match onnxruntime, chunked too, and
the NaN/Inf rerun runs the views' nodes first."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attention_cases import projected_attention_model, random_feeds
from onnx_builders import save
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from opplugin.runtime.exact import split_fused


def onnxruntime_outputs(proto, feeds):
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("split", [False, True], ids=["Slice", "Split"])
def test_the_layout_between_projection_and_attention_is_read_as_views(tmp_path, split):
    proto = projected_attention_model(split=split)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    plan = make_plan(model, 4, CPU)
    assert [s.ops for s in plan.plugin_steps] == [["MatMul"], ["MatMul", "Mul", "Softmax", "MatMul", "Transpose"], ["Reshape"]]
    attention = plan.plugin_steps[1]
    assert attention.inputs == ["qkv", "qkv", "qkv"]
    assert {n.name for n in attention.view_nodes} >= {"qkv_reshape", "qkv_permute", "k_merge", "k_transpose", "k_unmerge"}
    assert attention.kernel_nodes[:len(attention.view_nodes)] == attention.view_nodes
    assert attention.node_names == ["qk", "scale_scores", "softmax", "pv", "merge_heads"]


@pytest.mark.parametrize("tokens_first", [False, True], ids=["(N, T, C)", "(T, N, C)"])
@pytest.mark.parametrize("batch, chunk", [(3, None), (5, 2)])
def test_a_run_through_views_matches_onnxruntime(tmp_path, batch, chunk, tokens_first):
    proto = projected_attention_model(heads=2, t=30, d=16, tokens_first=tokens_first)
    runner = Runner(load_model(save(proto, tmp_path / "attention.onnx")), batch, "cpu", chunk=chunk)
    [attention] = [s for s in runner.plan.plugin_steps if s.views and "Softmax" in s.ops]
    assert attention.ops[-1] == "Transpose"  # the heads merged as the kernel writes, the batch moved or not
    feeds = random_feeds(proto, batch, 4)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_view_something_else_reads_stays_a_step(tmp_path):
    proto = projected_attention_model(k_also_out=True)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    plan = make_plan(model, 2, CPU)
    steps = {s.name: s for s in plan.plugin_steps}
    assert "k_squeeze" in steps  # K is a graph output: written by a step of its own
    attention = next(s for s in plan.plugin_steps if s.ops[-1] == "Transpose" and len(s.ops) > 1)
    assert "k_squeeze" not in {n.name for n in attention.view_nodes} and "k" in attention.inputs
    feeds = random_feeds(proto, 2, 1)
    ours = Runner(model, 2, "cpu").run(feeds).outputs
    for name, theirs in zip(("y", "k"), onnxruntime_outputs(proto, feeds)):
        np.testing.assert_allclose(ours[name], theirs, rtol=1e-5, atol=1e-5)


def test_a_per_head_transpose_through_merged_axes_is_one_view(tmp_path):
    model = load_model(save(projected_attention_model(heads=3, t=7, d=4), tmp_path / "attention.onnx"))
    attention = next(s for s in make_plan(model, 2, CPU).plugin_steps if len(s.ops) > 1)
    k_view = next(view for view in attention.views.values() if view.operand == "kt")
    qkv = np.arange(2 * 7 * 36, dtype=np.float32).reshape(2, 7, 36)
    kt = k_view.function()(qkv)
    assert np.shares_memory(kt, qkv), "the merged axes of a strided K would have been copied"
    expected = qkv.reshape(2, 7, 3, 3, 4).transpose(2, 0, 3, 1, 4)[1].transpose(0, 1, 3, 2)
    np.testing.assert_array_equal(kt, expected)


def test_the_plan_says_what_each_step_reads_as_a_view(tmp_path):
    from opplugin.report.plan import build_plan_report, format_plan
    from opplugin.runtime.plan_record import record_plan_alone

    model = load_model(save(projected_attention_model(), tmp_path / "attention.onnx"))
    record = record_plan_alone(make_plan(model, 2, CPU))
    text = format_plan(record, wide=True)
    assert "reads as a view: kt = Reshape > Transpose > Slice > Squeeze > Reshape > Transpose > Reshape of qkv" in text
    assert "in: qkv [2, 20, 144]\n" in text  # one source for three operands, listed once
    [entry] = [e for e in build_plan_report(record)["steps"] if e["views"]]
    assert entry["name"] == "qk" and len(entry["views"]) == 3


def test_only_layout_nodes_offer_views(tmp_path):
    from opplugin.registry import plugins

    model = load_model(save(projected_attention_model(), tmp_path / "attention.onnx"))
    nodes = {n.name: n for n in model.node_infos(2, model.infer(2))}
    registry = plugins()
    assert registry["Softmax"].view_of(nodes["softmax"], "p") is None
    x = np.zeros((2, 20, 3, 3, 16), np.float32)
    assert registry["Transpose"].view_of(nodes["qkv_permute"], "qkv_first")(x).shape == (3, 2, 3, 20, 16)
    assert registry["Squeeze"].view_of(nodes["q_squeeze"], "q")(np.zeros((1, 2, 3, 20, 16), np.float32)).shape == (2, 3, 20, 16)


def test_the_exact_path_runs_the_views_nodes_before_the_split_attention(tmp_path):
    proto = projected_attention_model()
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    split = split_fused(make_plan(model, 2, CPU))
    names = [s.name for s in split.steps]
    views_at = names.index("qk views")
    assert names[views_at + 1] == "qk" and split.steps[views_at].outputs == ["q", "kt", "v"]


def reshape_then_product_model(concat: bool = False):
    """x (N, 4, 6) > Reshape (N, 24) > MatMul by W (24, 5) [> Concat with itself]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((24, 5)).astype(np.float32), "w"),
               numpy_helper.from_array(np.array([-1, 24], np.int64), "flat_shape")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "flat_shape"], ["flat"], name="flatten")]
    if concat:
        nodes.append(helper.make_node("Concat", ["flat", "flat"], ["y"], name="join", axis=1))
        width = 48
    else:
        nodes.append(helper.make_node("MatMul", ["flat", "w"], ["y"], name="product"))
        width = 5
    graph = helper.make_graph(nodes, "reshaped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("concat", [False, True], ids=["MatMul", "Concat"])
def test_any_step_reads_a_reshape_as_a_view(tmp_path, concat):
    proto = reshape_then_product_model(concat)
    model = load_model(save(proto, tmp_path / "reshaped.onnx"))
    runner = Runner(model, 3, "cpu")
    ops = [s.ops for s in runner.plan.plugin_steps]
    assert ["Reshape"] not in ops and runner.plan.plugin_steps[-1].inputs[0] == "r"
    feeds = random_feeds(proto, 3, 0)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_reshape_that_is_no_view_reaches_a_plain_kernel_contiguous():
    from opplugin.plan.input_views import InputViewsKernel

    seen = []

    class Recorder:
        name, nonfinite_exact, device_work, out_view, flags_nonfinite = "recorder", True, True, "", False

        def __call__(self, inputs, stream=None):
            seen.append(inputs[0])
            return [inputs[0]]

    transposed = np.arange(12, dtype=np.float32).reshape(3, 4).T  # (4, 3), strided
    InputViewsKernel(Recorder(), [lambda x: x.reshape(2, 6)], contiguous=True)([transposed])
    InputViewsKernel(Recorder(), [lambda x: x[:, :2]], contiguous=True)([np.ones((3, 4), np.float32)])
    assert all(x.flags.c_contiguous for x in seen)
    np.testing.assert_array_equal(seen[0], transposed.reshape(2, 6))


def roll_model(step: int = 1):
    """x (N, 6, 8) rolled by 2 along axis 1 as exporters write torch.roll: two Slices and a Concat (with `step`
    2 the Slices take every other row, as Swin's patch merging does)."""
    from onnx import TensorProto, helper, numpy_helper

    starts = ([2], [6], [0], [2]) if step == 1 else ([1], [6], [0], [6])  # rolled by 2, or odd rows then even ones
    constants = dict(zip(("a_start", "a_end", "b_start", "b_end"), starts), axis=[1], step=[step])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Slice", ["r", "a_start", "a_end", "axis", "step"], ["tail"], name="tail"),
             helper.make_node("Slice", ["r", "b_start", "b_end", "axis", "step"], ["head"], name="head"),
             helper.make_node("Concat", ["tail", "head"], ["y"], name="roll", axis=1)]
    graph = helper.make_graph(nodes, "roll", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 8])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("step", [1, 2], ids=["roll", "every other row"])
def test_a_concat_reads_the_slices_it_can_read_in_place_as_views(tmp_path, step):
    proto = roll_model(step)
    runner = Runner(load_model(save(proto, tmp_path / "roll.onnx")), 4, "cpu", chunk=3)
    ops = [s.ops for s in runner.plan.plugin_steps]
    if step == 1:  # rows of contiguous runs: the Concat reads both in place
        assert ops == [["Relu"], ["Concat"]] and runner.plan.plugin_steps[1].inputs == ["r", "r"]
    else:  # strided: each Slice stays a step, which may write into the Concat's buffer
        assert ops == [["Relu"], ["Slice"], ["Slice"], ["Concat"]]
    feeds = random_feeds(proto, 4, 0)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0], rtol=0, atol=0)


def test_a_view_that_would_copy_is_probed_without_reading_past_memory(tmp_path):
    """A Transpose then a Reshape merging strided axes is no view (NumPy copies it): the Concat's in-place
    probe must find that out on memory it owns, at a size where reading past it would crash the process."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["t"], name="swap", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "rows"], ["m"], name="merge"),
             helper.make_node("Neg", ["x"], ["n"], name="neg"),
             helper.make_node("Reshape", ["n", "rows"], ["nm"], name="merge_n"),
             helper.make_node("Concat", ["m", "nm"], ["y"], name="join", axis=1)]
    graph = helper.make_graph(nodes, "copying_view", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64, 64, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8192, 96])],
                              [numpy_helper.from_array(np.array([-1, 4096, 96], np.int64), "rows")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = load_model(save(proto, tmp_path / "copying_view.onnx"))
    plan = make_plan(model, 16, CPU)
    join = next(s for s in plan.plugin_steps if "Concat" in s.ops)
    # the Transpose, which would make the Reshape copy, stays a step; the Concat reads its output reshaped, in place
    assert "swap" in {s.name for s in plan.plugin_steps} and "t" in join.inputs
    assert {n.name for n in join.view_nodes} == {"merge", "merge_n"}
    feeds = random_feeds(proto, 2, 0)
    np.testing.assert_allclose(Runner(model, 2, "cpu").run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0], rtol=0, atol=0)


def test_an_elementwise_group_reads_a_reshape_as_a_view(tmp_path):
    """A residual Add after a Reshape (Swin's window reverse): the Add's generated kernel is handed the
    reshaped view, so the Reshape is no step of its own."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["back"], name="reverse"),
             helper.make_node("Add", ["skip", "back"], ["y"], name="residual")]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6]),
                                                  helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["N", 2, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 12])],
                              [numpy_helper.from_array(np.array([-1, 2, 12], np.int64), "shape")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    runner = Runner(load_model(save(proto, tmp_path / "residual.onnx")), 5, "cpu", chunk=2)
    [relu, residual] = runner.plan.plugin_steps
    assert residual.ops == ["Add"] and residual.inputs == ["skip", "r"] and [n.name for n in residual.view_nodes] == ["reverse"]
    feeds = random_feeds(proto, 5, 0)
    np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0])


def test_a_slice_that_keeps_everything_is_read_as_the_input_itself(tmp_path):
    """An export's crop back to the size the tensor has (Swin's un-pad, x[:, :H, :W]) is no step."""
    from onnx import TensorProto, helper, numpy_helper

    constants = dict(starts=[0, 0], ends=[6, 8], axes=[1, 2])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["cropped"], name="crop"),
             helper.make_node("Add", ["cropped", "x"], ["y"], name="residual")]
    graph = helper.make_graph(nodes, "crop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 8])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    runner = Runner(load_model(save(proto, tmp_path / "crop.onnx")), 3, "cpu")
    assert [s.ops for s in runner.plan.plugin_steps] == [["Relu"], ["Add"]]
    assert [n.name for n in runner.plan.plugin_steps[1].view_nodes] == ["crop"]
    feeds = random_feeds(proto, 3, 0)
    np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds)[0])
