"""The pool plugins on the CPU: the numpy reference against onnxruntime over many configurations,
the plans (claimed, refused with a reason, fusions of the shipped models intact, the fusion rule
for built-in and user plugins), NaN and Inf through the exact path, and `opplugin check`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnx_builders import save
from opplugin.cli import main
from opplugin.gpu.device import CPU, Device
from opplugin.errors import PluginError
from opplugin.graph.model import load_model
from opplugin.ops.pool import MaxPoolPlugin, PoolSpec, reference
from opplugin.plan.partition import OrtStep, make_plan
from plan_text import describe
from opplugin.registry import is_builtin, plugins
from opplugin.runtime import Runner
from opplugin.runtime.exact import split_fused
from pool_cases import node_info, pool_cnn, pool_model, window_pools

GLOBAL_OPS = ("GlobalMaxPool", "GlobalAveragePool")


def onnxruntime_pool(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]


@settings(max_examples=150, deadline=None)
@given(case=window_pools(), seed=st.integers(0, 2**31))
def test_the_window_reference_matches_onnxruntime(case, seed):
    op, shape, attributes = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    try:
        spec = PoolSpec.from_node(node_info(op, shape, attributes))
    except PluginError as err:  # refused, so never run: only SAME pads that would be negative
        assert "SAME padding of a kernel smaller than its stride" in str(err)
        assume(False)
    expected = onnxruntime_pool(pool_model(op, shape, attributes), x)
    assert spec.output_shape(shape[0]) == expected.shape  # ceil_mode's last window as onnxruntime drops it
    ours = reference.expected(spec, x)
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", GLOBAL_OPS)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 5), (3, 2, 33, 40)])
def test_the_global_reference_matches_onnxruntime(op, shape):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    spec = PoolSpec.from_node(node_info(op, shape, {}))
    assert spec.output_shape(shape[0]) == (shape[0], shape[1], 1, 1)
    np.testing.assert_allclose(reference.expected(spec, x), onnxruntime_pool(pool_model(op, shape, {}), x), rtol=1e-5, atol=1e-6)


def test_same_pads_put_the_odd_pad_at_the_end_for_upper_and_at_the_start_for_lower():
    upper = PoolSpec.from_node(node_info("MaxPool", (1, 1, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}))
    lower = PoolSpec.from_node(node_info("MaxPool", (1, 1, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}))
    assert upper.pads == (0, 0, 1, 1) and lower.pads == (1, 1, 0, 0)
    assert upper.output_size == lower.output_size == (4, 4)


def test_count_include_pad_changes_only_the_windows_over_pads():
    attributes = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    x = np.ones((1, 1, 4, 4), np.float32)
    counted = reference.expected(PoolSpec.from_node(node_info("AveragePool", x.shape, {**attributes, "count_include_pad": 1})), x)
    plain = reference.expected(PoolSpec.from_node(node_info("AveragePool", x.shape, attributes)), x)
    np.testing.assert_array_equal(plain, np.ones_like(plain))
    assert counted[0, 0, 0, 0] == pytest.approx(4 / 9) and counted[0, 0, 1, 1] == 1.0 and counted[0, 0, 0, 1] == pytest.approx(6 / 9)


# --- plans ------------------------------------------------------------------------------------

def _plan(model: onnx.ModelProto, tmp_path: Path, batch: int = 2, device=CPU):
    return make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, device)


@pytest.mark.parametrize("device", [CPU, Device("cuda", "test GPU")], ids=["cpu", "cuda"])
def test_a_max_pool_with_asymmetric_pads_is_claimed(tmp_path, device):
    attributes = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 2, 1]}
    plan = _plan(pool_model("MaxPool", ["N", 3, 11, 9], attributes), tmp_path, device=device)
    assert [(s.kind, s.ops) for s in plan.steps] == [("plugin", ["MaxPool"])] and plan.fallbacks == {}
    assert plan.shape_of("y") == (2, 3, 6, 9)


def test_the_indices_output_and_other_dtypes_are_refused_with_the_reason_in_the_plan(tmp_path):
    attributes = {"kernel_shape": [2, 2], "strides": [2, 2]}
    with_indices = _plan(pool_model("MaxPool", ["N", 3, 8, 8], attributes, indices=True), tmp_path)
    assert isinstance(with_indices.steps[0], OrtStep)
    assert with_indices.fallbacks == {"pool": "the Indices output is not implemented"}
    assert "pool: the Indices output is not implemented" in describe(with_indices)
    doubles = pool_model("AveragePool", ["N", 3, 8, 8], attributes)  # x -> Cast to double -> pool -> Cast back
    pool = doubles.graph.node[0]
    pool.input[0], pool.output[0] = "x64", "y64"
    doubles.graph.node.insert(0, onnx.helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE))
    doubles.graph.node.append(onnx.helper.make_node("Cast", ["y64"], ["y"], to=TensorProto.FLOAT))
    plan = _plan(doubles, tmp_path)
    assert plan.fallbacks == {"pool": "only float32 is implemented, the input is float64"}
    assert [s.ops for s in plan.plugin_steps] == [["Cast"], ["Cast"]]  # the casts around it are pointwise steps


def test_a_ceil_mode_shape_that_onnx_infers_differently_from_onnxruntime_is_left_to_it(tmp_path):
    # 7 rows, window 2, stride 2, a pad of 1 on each side: the last ceil_mode window would start in the end pad
    attributes = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    old = _plan(pool_model("MaxPool", ["N", 1, 7, 7], attributes, opset=19), tmp_path)
    assert "differs from the one onnxruntime computes, [2, 1, 4, 4]" in old.fallbacks["pool"]
    new = _plan(pool_model("MaxPool", ["N", 1, 7, 7], attributes, opset=22), tmp_path)
    assert new.steps[0].kind == "plugin" and new.shape_of("y") == (2, 1, 4, 4)


def test_a_three_d_pool_is_refused():
    with pytest.raises(PluginError, match="only 2-D pooling"):
        PoolSpec.from_node(node_info("MaxPool", (1, 2, 5, 5, 5), {"kernel_shape": [2, 2, 2]}))


def _ops(plan):
    return [(s.kind, s.ops) for s in plan.steps]


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_the_shipped_models_plans_are_unchanged_by_the_pool_plugins(name):
    with_pools = make_plan(load_model(name), 4, CPU)
    without = make_plan(load_model(name), 4, CPU, registry={k: v for k, v in plugins().items() if "Pool" not in k})
    assert _ops(with_pools) == _ops(without) and with_pools.fusions_given_up == {}
    if name == "lenet86":
        assert [s.ops for s in with_pools.steps[:2]] == [["Conv", "Relu", "MaxPool"]] * 2


def test_a_users_max_pool_plugin_still_takes_its_nodes_and_stops_the_fusion():
    class MyMaxPool(MaxPoolPlugin):
        pass

    assert is_builtin(plugins()["MaxPool"]) and not is_builtin(MyMaxPool())
    plan = make_plan(load_model("lenet86"), 1, CPU, registry={**plugins(), "MaxPool": MyMaxPool()})
    assert [s.ops for s in plan.steps[:3]] == [["Conv", "Relu"], ["MaxPool"], ["Conv", "Relu"]]
    assert plan.fusions_given_up["conv1"] == ("Conv > Relu > MaxPool not fused: a plugin is registered for MaxPool, "
                                               "so pool1 runs as a step of its own")


def test_a_pool_the_conv_cannot_fuse_runs_as_a_pool_step_after_the_fused_conv(tmp_path):
    plan = _plan(pool_cnn(), tmp_path)
    assert _ops(plan) == [("plugin", ["Conv", "Relu"]), ("plugin", ["MaxPool"]), ("plugin", ["AveragePool"]), ("plugin", ["Conv"]),
                          ("plugin", ["GlobalMaxPool"]), ("plugin", ["Relu"]), ("plugin", ["GlobalAveragePool"]),
                          ("plugin", ["Gemm"])]  # the Gemm reads the Flatten as a view
    assert plan.fusions_given_up == {}


LIGHT_RESNET50 = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


@pytest.mark.skipif(not LIGHT_RESNET50.exists(), reason="the onnx package has no light_resnet50.onnx")
def test_light_resnet50_keeps_no_pool_in_onnxruntime():
    plan = make_plan(load_model(str(LIGHT_RESNET50)), 1, CPU)
    left = [op for step in plan.steps if isinstance(step, OrtStep) for op in step.ops]
    assert not {"MaxPool", "AveragePool"} & set(left)
    assert {"MaxPool", "AveragePool"} <= {op for step in plan.plugin_steps for op in step.ops}


# --- NaN and Inf: max pools are watched, averages follow IEEE ---------------------------------

def test_max_pool_steps_are_watched_and_rerun_on_onnxruntime_and_averages_are_not(tmp_path):
    model = load_model(save(pool_cnn(), tmp_path / "pool_cnn.onnx"))
    runner = Runner(model, 6, "cpu", chunk=2)
    watched = {runner.plan.steps[i].name for i in runner.exact.watched}
    assert watched == {"maxpool", "globalmax"}  # the max pools; the fused Conv > Relu promises onnxruntime's NaN and Inf
    split = split_fused(runner.plan)
    assert [s.name for s in split.steps if s.kind == "onnxruntime" and s.ops in (["MaxPool"], ["GlobalMaxPool"])] == [
        "maxpool on onnxruntime", "globalmax on onnxruntime"]
    x = np.random.default_rng(5).uniform(-1, 1, (6, 3, 15, 15)).astype(np.float32)
    x[0, 0, 3, 4], x[3, 1, 7, 7], x[3, 2, 0, 0] = np.nan, np.inf, -np.inf  # chunks 0 and 1; chunk 2 clean
    result = runner.run({"x": x})
    assert result.exact_reruns == 2
    expected = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y", "g"], {"x": x})
    for ours, theirs in zip((result.outputs["y"], result.outputs["g"]), expected):
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
        np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_max_reference_keeps_a_nan_from_any_place_in_the_window_and_the_average_follows_ieee():
    spec = PoolSpec.from_node(node_info("MaxPool", (1, 1, 3, 3), {"kernel_shape": [3, 3]}))
    average = PoolSpec.from_node(node_info("AveragePool", (1, 1, 3, 3), {"kernel_shape": [3, 3]}))
    for place in range(9):
        x = np.zeros((1, 1, 3, 3), np.float32)
        x.reshape(-1)[place] = np.nan
        assert np.isnan(reference.expected(spec, x)).all() and np.isnan(reference.expected(average, x)).all()
    x = np.zeros((1, 1, 3, 3), np.float32)
    x[0, 0, 1, 1] = np.inf
    assert reference.expected(spec, x)[0, 0, 0, 0] == np.inf and reference.expected(average, x)[0, 0, 0, 0] == np.inf
    x[0, 0, 2, 2] = -np.inf
    assert np.isnan(reference.expected(average, x)).all()
    assert np.isnan(onnxruntime_pool(pool_model("AveragePool", x.shape, {"kernel_shape": [3, 3]}), x)).all()


# --- end to end ---------------------------------------------------------------------------------

def test_check_passes_on_a_small_pooling_cnn(tmp_path, capsys):
    path = save(pool_cnn(), tmp_path / "pool_cnn.onnx")
    assert main(["check", path, "--batch", "5", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "maxpool" in out and "globalavg" in out


# --- ReduceMean over H and W: PyTorch's exporter writes it for a global average pool ----------

def reduce_mean_model(axes, keepdims: int, opset: int) -> onnx.ModelProto:
    from onnx import helper, numpy_helper

    inputs, inits, attributes = ["x"], [], {"keepdims": keepdims}
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
        inputs.append("axes")
    else:
        attributes["axes"] = axes
    node = helper.make_node("ReduceMean", inputs, ["y"], name="mean", **attributes)
    graph = helper.make_graph([node], "mean", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 6, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"y{i}" for i in range(4 - (0 if keepdims else len(axes)))])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("axes, keepdims", [([2, 3], 1), ([-1, -2], 0), ([3, 2], 1)])
def test_reduce_mean_over_h_and_w_is_a_global_average_pool(tmp_path, opset, axes, keepdims):
    model = reduce_mean_model(axes, keepdims, opset)
    plan = _plan(model, tmp_path, batch=3)
    [step] = plan.steps
    assert step.kind == "plugin" and plan.shape_of("y") == ((3, 5, 1, 1) if keepdims else (3, 5))
    x = np.random.default_rng(opset).standard_normal((3, 5, 6, 7)).astype(np.float32)
    ours = step.build(CPU)([x, *(plan.model.initializers[n] for n in step.inputs[1:])])[0]
    np.testing.assert_allclose(ours, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0],
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("axes", [[1], [1, 2, 3], [2]])
def test_a_reduce_mean_over_other_axes_runs_the_reduction_kernel(tmp_path, axes):
    plan = _plan(reduce_mean_model(axes, 1, 17), tmp_path)
    [step] = plan.plugin_steps
    assert step.plugin.kernel_name(step.node, CPU) == "reducemean.reference" and plan.fallbacks == {}
