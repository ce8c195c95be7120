"""The reductions and normalisations on the CPU device: the numpy reference against onnxruntime on
random inputs, the plan's steps, and the reasons a node is refused."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opplugin.gpu.device import CPU, Device
from opplugin.errors import PluginError
from reduction_cases import CASES, affine_constants, fresh, node_model, onnxruntime_output, planned, random_case, reduce_model

GPU = Device("cuda", "test GPU")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
def test_the_reference_matches_onnxruntime(case, batch):
    model, shape = CASES[case]
    plan = planned(model, batch)
    [step] = plan.steps
    assert step.kind == "plugin" and plan.fallbacks == {}
    x = fresh((batch, *shape[1:]), len(case) + batch)
    kernel = step.build(CPU)
    [ours] = kernel([x])
    theirs = onnxruntime_output(model, x)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert plan.shape_of("y") in (ours.shape, ())  # onnx infers no shape through GroupNormalization-18's function
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(theirs).max())))


@pytest.mark.parametrize("case", list(CASES))
def test_a_gpu_plan_takes_every_case(case):
    model, shape = CASES[case]
    plan = planned(model, shape[0], GPU)
    [step] = plan.steps
    assert step.kind == "plugin"
    assert ".cuda." in step.plugin.kernel_name(step.node, GPU)


def test_kernel_names_say_the_thread_layout():
    names = {case: planned(model, 2, GPU).steps[0] for case, (model, _) in CASES.items()}
    name = lambda case: names[case].plugin.kernel_name(names[case].node, GPU)  # noqa: E731
    assert name("Softmax over classes") == "softmax.cuda.t1x8"  # 8 threads a row (one sector a load), 4 rows a warp
    assert name("Softmax over C of NCHW") == "softmax.cuda.t8x2"  # 8 neighbouring pixels (a whole sector) a row: 13 groups an image
    assert name("ReduceMax over axes 1 and 3 (two stages)") == "reducemax.cuda.t1x8_t8x1"
    assert name("ReduceMean over H and W (the global pool kernel)") == "globalaveragepool.cuda.global_flat"
    assert name("LayerNormalization a long row, scale broadcast").startswith("layernorm.cuda.t1x")


@pytest.mark.parametrize(("model", "reason"), [
    (reduce_model("ReduceSum", (1, 4, 5), [0, 1]), "over axis 0 (the batch) is not implemented"),
    (reduce_model("ReduceMean", (1, 4, 5), None), "over axis 0 (the batch) is not implemented"),
    (reduce_model("ReduceMax", (1, 4, 5), [1, -2]), "name an axis twice"),
    (node_model("Softmax", (1, 4, 5), {"axis": 0}, opset=13), "a softmax over axis 0 (the batch)"),
    (node_model("LayerNormalization", (1, 4, 5), {"axis": -1}, {"scale": np.ones((4, 5), np.float32)}, opset=17),
     "does not broadcast to [5]"),
    (node_model("GroupNormalization", (1, 6, 3, 3), {"num_groups": 4}, affine_constants(np.random.default_rng(0), (4,)), opset=18),
     "num_groups 4 does not divide the 6 channels"),
    (node_model("InstanceNormalization", (1, 6), {}, affine_constants(np.random.default_rng(0), (6,))), "N x C x spatial"),
])
def test_what_is_not_taken_says_why(model, reason):
    plan = planned(model, 2)
    assert plan.plugin_steps == [] and reason in plan.fallbacks["node"]


def test_a_scale_computed_at_run_time_is_refused():
    from onnx import TensorProto, helper

    model = node_model("LayerNormalization", (1, 4, 5), {"axis": -1}, opset=17)
    node = model.graph.node[0]
    node.input.append("s")
    model.graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [5]))
    plan = planned(model, 2)
    assert "the scale is computed at run time" in plan.fallbacks["node"]


def test_a_softmax_without_an_opset_takes_only_the_last_axis():
    from opplugin.ops.reduction.spec import SoftmaxSpec
    from opplugin.registry import NodeInfo, TensorInfo
    from onnx import helper

    def info(axis):
        node = helper.make_node("Softmax", ["x"], ["y"], axis=axis)
        x = TensorInfo("x", (2, 3, 4), np.dtype(np.float32))
        return NodeInfo(node, [x], [TensorInfo("y", (2, 3, 4), np.dtype(np.float32))], {"axis": axis})

    assert (SoftmaxSpec.from_node(info(-1)).first, SoftmaxSpec.from_node(info(2)).end) == (2, 3)
    with pytest.raises(PluginError, match="ambiguous"):
        SoftmaxSpec.from_node(info(1))


def test_the_reference_keeps_nan_and_inf_as_onnxruntime_does():
    model, shape = CASES["Softmax over C of NCHW"]
    x = fresh(shape, 3)
    x[0, 2, 3, 4] = np.nan
    x[1, 0, 0, 0] = np.inf
    [ours] = planned(model, 2).steps[0].build(CPU)([x])
    theirs = onnxruntime_output(model, x)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_random_axes_and_shapes_match_onnxruntime(data, seed):
    model, shape = random_case(data.draw)
    plan = planned(model, shape[0])
    assert plan.fallbacks == {}
    x = fresh(shape, seed)
    [ours] = plan.steps[0].build(CPU)([x])
    theirs = onnxruntime_output(model, x)
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(theirs).max())))


def test_a_reduce_max_over_nan_gives_what_onnxruntime_gives(tmp_path):
    """onnxruntime's ReduceMax keeps or drops a NaN by where it sits in the row (as its MaxPool does):
    a chunk whose ReduceMax output holds NaN runs again on onnxruntime (runtime/exact.py)."""
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    from onnx import TensorProto, helper

    model = reduce_model("ReduceMax", (1, 6), [1], 0)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]))  # the checker wants a shape
    runner = Runner(load_model(save(model, tmp_path / "max.onnx")), 3, "cpu")
    x = np.array([[1, np.nan, 3, 2, 0.5, 1], [np.nan, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, np.nan]], np.float32)
    result = runner.run({"x": x})
    np.testing.assert_array_equal(result.outputs["y"], onnxruntime_output(model, x))
    assert result.exact_reruns == 1
