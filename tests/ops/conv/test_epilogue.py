"""The residual epilogue on the CPU: which chains a plan fuses into a Conv (residual Add or
Sum, every activation of the shared table, SiLU as x * Sigmoid(x), the max pool), what the
fused step reads, and the numpy reference of the fused step against onnxruntime."""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import save
from residual_models import MAPS, SIZE, activation_nodes, conv_then, residual_model
from resnet_block import bottleneck_block, resnet_block

from opplugin.cli import main
from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.ops.activation import KINDS, SILU, Activation
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.ops.conv.plugin import epilogue_of
from opplugin.plan.partition import OrtStep, make_plan
from plan_text import describe
from opplugin.runtime import Runner
from opplugin.runtime.exact import split_fused

CPU = select_device("cpu")
ACTIVATIONS = [*(Activation.plain(op) for op in KINDS), Activation("LeakyRelu", 0.3), Activation("Clip", 0.0, 6.0),
               Activation("HardSigmoid", 0.1, 0.6)]


def plan_of(model: onnx.ModelProto, tmp_path, batch: int = 2):
    return make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, CPU)


def conv_step(plan):
    return next(s for s in plan.plugin_steps if s.node.op_type == "Conv")


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def feeds(batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32),
            "r": rng.standard_normal((batch, MAPS, SIZE, SIZE)).astype(np.float32)}


# --- the description ------------------------------------------------------------------------


def test_suffix_and_when_a_kernel_may_pool_first():
    assert Epilogue("Relu", (2, 2), residual=True).suffix == "+add+relu+maxpool2"
    assert Epilogue(Activation("Clip", 0.0, 6.0)).suffix == "+clip0_6"
    assert Epilogue(Activation(SILU), residual=True).suffix == "+add+silu"
    assert Epilogue("Relu", (2, 2)).pool_first and Epilogue(None, (2, 2)).pool_first
    assert Epilogue(Activation("LeakyRelu", 0.2), (2, 2)).pool_first
    # a residual belongs to each conv output; HardSwish, SiLU and a negative slope do not commute with max
    assert not Epilogue("Relu", (2, 2), residual=True).pool_first
    for act in (Activation.plain("HardSwish"), Activation(SILU), Activation("LeakyRelu", -0.5)):
        assert not Epilogue(act, (2, 2)).pool_first, act
    assert not Epilogue("Relu").pool_first  # no pool
    assert Epilogue("Tanh", (2, 2), residual=True).defines() == {"ACTIVATION(v)": "tanhf(v)", "RESIDUAL": 1, "POOL_FIRST": 0}


def test_apply_adds_the_residual_before_the_activation_and_the_pool_and_keeps_nan():
    y = np.array([[[[1.0, -3.0], [np.nan, 0.5]]]], np.float32)
    r = np.array([[[[-2.0, 1.0], [0.0, np.inf]]]], np.float32)
    assert np.array_equal(Epilogue("Relu", residual=True).apply(y, r), np.array([[[[0.0, 0.0], [np.nan, np.inf]]]]), equal_nan=True)
    assert np.isnan(Epilogue("Relu", (2, 2), residual=True).apply(y, r)).all()
    with pytest.raises(ValueError, match="residual"):
        Epilogue(residual=True).apply(y)


# --- plans ------------------------------------------------------------------------------------


def test_a_resnet_basic_block_fuses_add_and_relu_and_reads_the_shortcut_as_fourth_input(tmp_path):
    plan = plan_of(resnet_block(), tmp_path)
    conv2 = next(s for s in plan.plugin_steps if s.name == "conv2")
    assert conv2.ops == ["Conv", "Add", "Relu"] and conv2.outputs == ["r2"]
    x, w, b, residual = conv2.inputs
    assert (x, residual) == ("r1", "s_relu") and b in plan.model.initializers
    assert not any("Add" in s.ops or "Relu" in s.ops for s in plan.steps if isinstance(s, OrtStep))
    assert "Conv > Add > Relu" in describe(plan) and "s_relu [2, 8, 12, 12]" in describe(plan)


def test_a_downsample_block_fuses_the_sum_into_the_later_producer(tmp_path):
    plan = plan_of(bottleneck_block(), tmp_path)
    steps = {s.name: s for s in plan.plugin_steps}
    assert steps["conv_c"].ops == ["Conv"]  # its Sum's other operand does not exist yet when it runs
    assert steps["conv_shortcut"].ops == ["Conv", "Sum", "Relu"]
    assert steps["conv_shortcut"].inputs == ["x", "ws", "bs", "main"]
    order = [s.name for s in plan.steps]
    assert order.index("conv_c") < order.index("conv_shortcut")
    assert not [s for s in plan.steps if isinstance(s, OrtStep)]


@pytest.mark.parametrize("conv_first", [True, False])
def test_conv_add_without_activation_fuses_either_operand_order_and_a_missing_bias_keeps_its_place(conv_first, tmp_path):
    plan = plan_of(residual_model(None, bias=False, conv_first=conv_first), tmp_path)
    step = conv_step(plan)
    assert step.ops == ["Conv", "Add"] and step.inputs == ["x", "w", "", "r"] and step.outputs == ["y"]
    assert epilogue_of(step.fused) == Epilogue(residual=True)


@pytest.mark.parametrize("mul_inputs", [["c", "sig"], ["sig", "c"]])
def test_silu_as_sigmoid_and_mul_fuses_as_one_activation(mul_inputs, tmp_path):
    nodes = [helper.make_node("Sigmoid", ["c"], ["sig"], name="sigmoid"), helper.make_node("Mul", mul_inputs, ["y"], name="mul")]
    step = conv_step(plan_of(conv_then(nodes, ["y"]), tmp_path))
    assert step.ops == ["Conv", "Sigmoid", "Mul"] and epilogue_of(step.fused) == Epilogue(Activation(SILU))
    assert step.inputs == ["x", "w", "b"]


def test_the_longest_chain_add_silu_and_pool_fuses_whole(tmp_path):
    step = conv_step(plan_of(residual_model(Activation(SILU), pool=2), tmp_path))
    assert step.ops == ["Conv", "Add", "Sigmoid", "Mul", "MaxPool"]
    assert epilogue_of(step.fused) == Epilogue(Activation(SILU), (2, 2), residual=True)


def test_relu6_as_clip_with_constant_bounds_fuses(tmp_path):
    nodes, constants = activation_nodes(Activation("Clip", 0.0, 6.0), "c", "y")
    step = conv_step(plan_of(conv_then(nodes, ["y"], constants=constants), tmp_path))
    assert step.ops == ["Conv", "Clip"] and epilogue_of(step.fused).suffix == "+clip0_6"
    assert step.inputs == ["x", "w", "b"]  # the bounds are compiled in, not read


def test_an_intermediate_with_a_second_reader_is_not_fused(tmp_path):
    # the conv output read by the Add and by a graph output's Relu: nothing fuses
    nodes = [helper.make_node("Add", ["c", "r"], ["s"], name="add"), helper.make_node("Relu", ["c"], ["other"], name="other")]
    assert conv_step(plan_of(conv_then(nodes, ["s", "other"]), tmp_path)).ops == ["Conv"]
    # the Add's output read twice: the Add fuses, the Relu after it does not
    nodes = [helper.make_node("Add", ["c", "r"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu"),
             helper.make_node("Tanh", ["s"], ["t"], name="tanh")]
    assert conv_step(plan_of(conv_then(nodes, ["y", "t"]), tmp_path)).ops == ["Conv", "Add"]
    # the Add's output a graph output as well
    nodes = [helper.make_node("Add", ["c", "r"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")]
    assert conv_step(plan_of(conv_then(nodes, ["y", "s"]), tmp_path)).ops == ["Conv", "Add"]
    # the Sigmoid's output read by another node too: no SiLU, and no Sigmoid alone (its Mul needs the conv output)
    nodes = [helper.make_node("Sigmoid", ["c"], ["sig"], name="sigmoid"), helper.make_node("Mul", ["c", "sig"], ["y"], name="mul"),
             helper.make_node("Relu", ["sig"], ["z"], name="relu")]
    assert conv_step(plan_of(conv_then(nodes, ["y", "z"]), tmp_path)).ops == ["Conv"]


def test_an_add_that_broadcasts_or_adds_a_constant_is_not_a_residual(tmp_path):
    shift = {"shift": np.ones((1, MAPS, 1, 1), np.float32)}
    nodes = [helper.make_node("Add", ["c", "shift"], ["y"], name="add")]
    assert conv_step(plan_of(conv_then(nodes, ["y"], constants=shift), tmp_path)).ops == ["Conv"]


LIGHT_RESNET50 = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx")


@pytest.mark.skipif(not os.path.exists(LIGHT_RESNET50), reason="the onnx package ships no light_resnet50.onnx")
def test_light_resnet50_plans_every_sum_into_a_conv():
    plan = make_plan(load_model(LIGHT_RESNET50), 1, CPU)
    assert not [s.name for s in plan.steps if isinstance(s, OrtStep) and "Sum" in s.ops]
    fused = [s for s in plan.plugin_steps if "Sum" in s.ops]
    assert len(fused) == 16 and all(s.ops == ["Conv", "Sum", "Relu"] and len(s.inputs) == 4 for s in fused)


# --- the fused step against onnxruntime -------------------------------------------------------


@pytest.mark.parametrize("pool", [None, 2])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a.suffix)
def test_the_reference_fused_step_matches_onnxruntime(activation, pool, tmp_path):
    model = residual_model(activation, pool, bias=pool is None)
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), 3, "cpu")
    [step] = runner.plan.plugin_steps
    assert step.ops[:2] == ["Conv", "Add"] and step.ops[-1] == ("MaxPool" if pool else step.ops[-1])
    inputs = feeds(3, seed=len(activation.suffix) + (pool or 0))
    [theirs] = onnxruntime_outputs(model, inputs)
    ours = runner.run(inputs).outputs["y"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_nan_and_inf_in_the_residual_come_out_as_in_onnxruntime(tmp_path):
    model = residual_model(Activation.plain("Relu"), pool=2)
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), 4, "cpu", chunk=2)
    inputs = feeds(4)
    inputs["r"][0, 1, 2, 3] = np.nan
    inputs["r"][0, 2, 5, 5] = np.inf
    inputs["r"][1, 0, 0, 0] = -np.inf
    result = runner.run(inputs)
    [theirs] = onnxruntime_outputs(model, inputs)
    ours = result.outputs["y"]
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-5)
    assert result.exact_reruns == 1  # the first chunk; the second is finite


def test_the_exact_path_runs_the_residual_add_on_onnxruntime_with_the_residual_as_its_input(tmp_path):
    plan = plan_of(resnet_block(), tmp_path)
    split = split_fused(plan)
    conv2 = [s for s in split.steps if s.name.startswith("conv2")]
    assert [s.name for s in conv2] == ["conv2", "conv2 epilogue"]
    assert conv2[0].inputs == list(conv2[0].node.node.input) and conv2[0].outputs == ["n2"]
    epilogue = conv2[1]
    assert epilogue.ops == ["Add", "Relu"] and sorted(epilogue.inputs) == ["n2", "s_relu"] and epilogue.outputs == ["r2"]
    rng = np.random.default_rng(2)
    values = {name: rng.standard_normal((2, 8, 12, 12)).astype(np.float32) for name in epilogue.inputs}
    [r2] = ort.InferenceSession(epilogue.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, values)
    np.testing.assert_allclose(r2, np.maximum(values["n2"] + values["s_relu"], 0), rtol=1e-6)


def test_check_passes_a_model_with_residual_silu_and_pool_fused(tmp_path, capsys):
    path = save(residual_model(Activation(SILU), pool=2), tmp_path / "silu.onnx")
    assert main(["check", path, "--batch", "4", "--device", "cpu"]) == 0
    assert main(["plan", path, "--device", "cpu", "--batch", "4"]) == 0
    assert "Conv > Add > Sigmoid > Mul > MaxPool" in capsys.readouterr().out


def test_first_bad_reruns_a_residual_step_on_onnxruntimes_inputs(tmp_path):
    from opplugin.verify.check import check
    from opplugin.verify.first_bad import isolate_steps

    model = load_model(save(bottleneck_block(), tmp_path / "block.onnx"))
    runner = Runner(model, 2, "cpu")
    inputs = {"x": np.random.default_rng(4).standard_normal((2, 8, 12, 12)).astype(np.float32)}
    result = check(runner.run, runner.plan_record(2), inputs)
    verdicts = {v.step: v for v in isolate_steps(runner, inputs, result, 1e-5, 1e-5)}
    assert verdicts["conv_shortcut"].own is not None and verdicts["conv_shortcut"].own_passed
