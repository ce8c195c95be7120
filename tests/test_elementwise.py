"""The elementwise plugin on the CPU: the numpy reference against onnxruntime for every activation
of the shared table and every binary op and operand form (NaN and Inf included), the plans
(fused Add > Relu, refusals with their reasons, a ResNet block with no onnxruntime step), and check."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from elementwise_cases import ACTIVATIONS, OPERANDS, binary_model, feeds, unary_model
from onnx_builders import save
from opplugin import registry
from opplugin.cli import main
from opplugin.device import CPU
from opplugin.model import load_model
from opplugin.ops.activation import SILU, KINDS
from opplugin.ops.elementwise import OPS
from opplugin.plan import make_plan
from resnet_block import resnet_block


def onnxruntime_y(model, inputs):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], inputs)[0]


def plugin_y(model, inputs, tmp_path, batch=3):
    plan = make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, CPU)
    [step] = plan.steps
    assert step.kind == "plugin", plan.fallbacks
    kernel = step.build(CPU)
    return step, kernel([inputs[n] if n in inputs else plan.model.initializers[n] for n in step.inputs])[0]


def assert_same_as_onnxruntime(ours, theirs):
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_every_op_of_the_activation_table_has_a_built_in_plugin():
    assert (set(KINDS) - {SILU}) | {"Add", "Sum", "Mul"} == set(OPS)  # SiLU is no ONNX op: x * Sigmoid(x)
    for op in OPS:
        assert registry.is_builtin(registry.plugin_for(op)), op


@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a[0] + "".join(map(str, a[2])))
def test_each_activation_matches_onnxruntime_nan_and_inf_included(activation, tmp_path):
    model = unary_model(*activation)
    inputs = feeds(model, 3, seed=1, poison=True)
    step, ours = plugin_y(model, inputs, tmp_path)
    assert step.ops == [activation[0]]
    assert_same_as_onnxruntime(ours, onnxruntime_y(model, inputs))


@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("op", ["Add", "Sum", "Mul"])
@pytest.mark.parametrize("then", [None, ACTIVATIONS[0], ACTIVATIONS[4]], ids=["alone", "relu", "clip"])
def test_binary_ops_with_a_fused_activation_match_onnxruntime(op, operand, then, tmp_path):
    model = binary_model(op, operand, then, constant_first=operand == "channel")
    inputs = feeds(model, 3, seed=2, poison=True)
    step, ours = plugin_y(model, inputs, tmp_path)
    assert step.ops == [op, *([then[0]] if then else [])]
    assert_same_as_onnxruntime(ours, onnxruntime_y(model, inputs))


def _reason(model, tmp_path):
    plan = make_plan(load_model(save(model, tmp_path / "model.onnx")), 3, CPU)
    return plan.fallbacks.get("binary")


def test_operands_the_plugin_cannot_take_are_left_to_onnxruntime_with_the_reason(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    batch_constant = binary_model("Add", "same")
    batch_constant.graph.input.pop()  # b becomes a constant with a batch axis of 3
    batch_constant.graph.initializer.append(numpy_helper.from_array(np.ones((3, 6, 5, 7), np.float32), "b"))
    assert "has a batch axis" in _reason(batch_constant, tmp_path)
    three = binary_model("Sum", "same")
    three.graph.node[0].input.append("x")
    assert "only two operands" in _reason(three, tmp_path)
    runtime_broadcast = binary_model("Mul", "same")
    runtime_broadcast.graph.input[1].CopyFrom(helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 6, 1, 1]))
    assert "computed at run time must have the output's shape" in _reason(runtime_broadcast, tmp_path)


def test_a_resnet_block_runs_without_onnxruntime_steps_and_its_residual_add_fuses_the_relu(tmp_path):
    from opplugin.registry import plugins
    from test_exact import _UnfusedConv

    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    plan = make_plan(model, 4, CPU)
    assert all(step.kind == "plugin" for step in plan.steps) and plan.fusions_given_up == {}
    assert ["Conv", "Add", "Relu"] in [step.ops for step in plan.steps]  # into the Conv's epilogue
    # a Conv that fuses nothing leaves the Add to the elementwise plugin, which takes the Relu
    unfused = make_plan(model, 4, CPU, plugins() | {"Conv": _UnfusedConv()})
    assert all(step.kind == "plugin" for step in unfused.steps) and ["Add", "Relu"] in [step.ops for step in unfused.steps]


def test_check_passes_on_the_resnet_block(tmp_path):
    path = save(resnet_block(), tmp_path / "block.onnx")
    assert main(["check", path, "--batch", "5", "--device", "cpu"]) == 0
