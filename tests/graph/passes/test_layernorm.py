"""A LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div(/Mul/Add) becomes one
LayerNormalization at load time: the plan shows one step, and `check` passes against the original graph."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import save
from opplugin.verify.check import check
from opplugin.graph.model import load_model
from opplugin.graph.functions import OPPLUGIN_DOMAIN
from opplugin.plan.partition import make_plan
from opplugin.gpu.device import CPU
from opplugin.runtime import Runner
from reduction_cases import fresh, onnxruntime_output
from layernorm_models import decomposed_layernorm


PATTERNS = {
    "trailing axis, opset 17: ONNX's LayerNormalization": ((2, 7, 7, 96), [-1], 17, "Pow", (96,), True, ""),
    "NCHW channels, opset 13: the opplugin function": ((2, 96, 5, 5), [1], 13, "Pow", (96, 1, 1), True, OPPLUGIN_DOMAIN),
    "NCHW channels, opset 18 (axes an input), Mul(d, d), no affine": ((2, 16, 6, 3), [1], 18, "Mul", None, True, OPPLUGIN_DOMAIN),
    "last two axes as positive numbers, scale only": ((3, 4, 9, 5), [2, 3], 17, "Pow", (9, 5), False, OPPLUGIN_DOMAIN),
}


@pytest.mark.parametrize("case", list(PATTERNS))
def test_the_pattern_is_one_layernorm_step_and_check_passes(tmp_path, case):
    shape, axes, opset, square, affine_shape, bias, domain = PATTERNS[case]
    path = save(decomposed_layernorm(shape, axes, opset, square, affine_shape, bias), tmp_path / "ln.onnx")
    model = load_model(path)
    [layernorm] = [n for n in model.proto.graph.node if n.op_type == "LayerNormalization"]
    assert layernorm.domain == domain and [n.op_type for n in model.proto.graph.node] == ["LayerNormalization", "Relu"]
    assert "1 decomposed LayerNormalization folded" in model.simplification.summary()
    plan = make_plan(model, shape[0], CPU)
    assert [s.ops for s in plan.plugin_steps][0] == ["LayerNormalization"] and plan.fallbacks == {}
    runner = Runner(model, shape[0], "cpu")
    x = fresh(shape, 5)
    result = check(runner.run, runner.plan_record(), {"x": x})
    assert result.passed
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], onnxruntime_output(model.original, x), rtol=1e-5, atol=1e-5)


def test_the_rewritten_model_still_runs_in_onnxruntime_and_infers_shapes(tmp_path):
    """The function form is a model-local function: onnx infers through it and onnxruntime runs it."""
    shape, axes, opset, square, affine_shape, bias, _ = PATTERNS["NCHW channels, opset 13: the opplugin function"]
    model = load_model(save(decomposed_layernorm(shape, axes, opset, square, affine_shape, bias), tmp_path / "ln.onnx"))
    assert model.infer(4)["shifted"].shape == (4, 96, 5, 5)
    x = fresh((4, *shape[1:]), 6)
    np.testing.assert_allclose(onnxruntime_output(model.proto, x), onnxruntime_output(model.original, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("break_it", ["other reader", "graph output", "different axes", "cube"])
def test_a_near_miss_is_left_as_written(tmp_path, break_it):
    model = decomposed_layernorm((2, 8, 4), [-1], 17, "Pow", (4,), True)
    graph = model.graph
    if break_it == "other reader":  # the centred values are read outside the pattern
        graph.node.append(helper.make_node("Relu", ["d"], ["d_relu"], name="extra"))
        graph.output.append(helper.make_tensor_value_info("d_relu", TensorProto.FLOAT, ["N", 8, 4]))
    elif break_it == "graph output":
        graph.output.append(helper.make_tensor_value_info("var", TensorProto.FLOAT, ["N", 8, 1]))
    elif break_it == "different axes":
        next(n for n in graph.node if n.name == "ln_var").attribute[0].ints[:] = [-2]
    else:
        next(t for t in graph.initializer if t.name == "two").CopyFrom(numpy_helper.from_array(np.array(3.0, np.float32), "two"))
    loaded = load_model(save(model, tmp_path / "ln.onnx"))
    assert "LayerNormalization" not in [n.op_type for n in loaded.proto.graph.node]
    assert "Sqrt" in [n.op_type for n in loaded.proto.graph.node]
