"""The Conv prologue on the CPU: the description (ops/conv/prologue.py), which pointwise nodes a
plan fuses into the Conv that reads them (opplugin/plan/prologue.py) and which it leaves, what
the fused step reads, the numpy reference of the fused step against onnxruntime, the exact
path's split, and the offline GPU plans of DenseNet-121 and EfficientNet-B0."""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from onnx_builders import finish, save
from prologue_models import bn_model, feeds, se_model

from opplugin.cli import main
from opplugin.gpu.device import Device, select_device
from opplugin.graph.model import load_model
from opplugin.ops.activation import KINDS, SILU, Activation
from opplugin.ops.conv.epilogue import Epilogue, kernel_name
from opplugin.ops.conv.prologue import AFFINE, SCALE, Prologue
from opplugin.plan.partition import OrtStep, PluginStep, make_plan
from opplugin.runtime import Runner
from opplugin.runtime.exact import split_fused

CPU = select_device("cpu")
ACTIVATIONS = [*(Activation.plain(op) for op in KINDS if op != SILU), Activation("Clip", 0.0, 6.0)]
CNN = "/work/cnn"


def plan_of(model, tmp_path, batch: int = 2, device=CPU):
    return make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, device)


def conv_step(plan) -> PluginStep:
    return next(s for s in plan.plugin_steps if s.node.op_type == "Conv")


def onnxruntime_output(model, inputs) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], inputs)[0]


# --- the description ------------------------------------------------------------------------


def test_names_and_macros_say_the_prologue():
    affine = Prologue(AFFINE, (1.0, 2.0), (0.5, -0.5), Activation.plain("Relu"))
    assert affine.prefix == "bn_relu*" and Prologue(AFFINE, (1.0,), (0.0,)).prefix == "bn*"
    assert Prologue(SCALE).prefix == "scale*"
    assert Prologue(SCALE).defines() == {"PROLOGUE": 1}
    assert affine.defines() == {"PROLOGUE": 2, "PROLOGUE_ACTIVATION(v)": "((v) < 0.0f ? 0.0f : (v))"}
    epilogue = Epilogue("Relu", prologue=affine)
    assert kernel_name("tc_3xtf32_b64x64x32_w32x32_s3", epilogue) == "conv.bn_relu*tc_3xtf32_b64x64x32_w32x32_s3+relu"
    assert epilogue.signature == "bn_relu*+relu" and epilogue.defines()["PROLOGUE"] == 2
    assert epilogue.without_prologue() == Epilogue("Relu") and epilogue.prologue_only() == Epilogue(prologue=affine)
    np.testing.assert_array_equal(affine.constants(), np.array([1.0, 2.0, 0.5, -0.5], np.float32))


def test_apply_scales_per_image_and_channel_and_keeps_nan():
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)
    x[1, 1, 0, 0] = np.nan
    s = np.array([2.0, -1.0, 0.5, 3.0], np.float32).reshape(2, 2, 1, 1)
    y = Prologue(SCALE).apply(x, s)
    np.testing.assert_array_equal(y, x * s)
    assert np.isnan(y[1, 1, 0, 0])
    with pytest.raises(ValueError, match="scale operand"):
        Prologue(SCALE).apply(x)


def test_apply_affine_then_activation_per_channel():
    x = np.array([[[[1.0, -2.0]], [[3.0, np.nan]]]], np.float32)
    y = Prologue(AFFINE, (2.0, -1.0), (-3.0, 0.5), Activation.plain("Relu")).apply(x)
    np.testing.assert_array_equal(y, np.array([[[[0.0, 0.0]], [[0.0, np.nan]]]], np.float32))


# --- plans ------------------------------------------------------------------------------------


def test_a_squeeze_and_excitation_mul_fuses_and_its_scale_comes_fifth(tmp_path):
    plan = plan_of(se_model(), tmp_path)
    step = conv_step(plan)
    assert step.ops == ["Mul", "Conv"] and [n.name for n in step.prologue] == ["scale"]
    assert step.inputs == ["x", "w", "b", "", "s"]  # X, W, B, no residual, then the scale
    assert not [s for s in plan.steps if "Mul" in s.ops and s is not step]


def test_the_scale_follows_a_residual_operand(tmp_path):
    step = conv_step(plan_of(se_model(residual=True), tmp_path))
    assert step.ops == ["Mul", "Conv", "Add"] and step.inputs == ["x", "w", "b", "r", "s"]


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS], ids=lambda a: a.suffix if a else "none")
def test_batchnorm_and_its_activation_fuse(activation, tmp_path):
    plan = plan_of(bn_model(activation), tmp_path)
    step = conv_step(plan)
    assert step.ops == ["BatchNormalization", *([activation.op] if activation else []), "Conv"]
    assert step.inputs == ["x", "w", "b"] and len(plan.steps) == 1


def test_a_pointwise_output_read_elsewhere_is_not_fused(tmp_path):
    plan = plan_of(bn_model(Activation.plain("Relu"), second_reader=True), tmp_path)
    step = conv_step(plan)
    # the BatchNormalization's output is a graph output, and a Relu alone is no prologue kind: both stay a step
    assert step.ops == ["Conv"] and not step.prologue
    assert any(s.ops == ["BatchNormalization", "Relu"] for s in plan.steps)


def test_silu_before_a_conv_is_no_prologue(tmp_path):
    plan = plan_of(bn_model(Activation(SILU)), tmp_path)
    assert not conv_step(plan).prologue


def test_an_activation_after_a_conv_stays_in_that_convs_epilogue(tmp_path):
    model = bn_model(None)
    graph = model.graph
    # conv > Relu > conv2: the Relu belongs to the first Conv's epilogue, not the second's prologue
    nodes = list(graph.node) + [helper.make_node("Relu", ["y"], ["yr"], name="relu"),
                                helper.make_node("Conv", ["yr", "w2"], ["z"], name="conv2")]
    rng = np.random.default_rng(3)
    w2 = helper.make_tensor("w2", 1, (4, 6, 1, 1), rng.standard_normal(24).astype(np.float32))
    graph2 = helper.make_graph(nodes, "g", list(graph.input), [helper.make_tensor_value_info("z", 1, ["N", "zc", "zh", "zw"])],
                               initializer=[*graph.initializer, w2])
    plan = plan_of(finish(graph2), tmp_path)
    conv, conv2 = (s for s in plan.plugin_steps if s.node.op_type == "Conv")
    assert conv.ops == ["BatchNormalization", "Conv", "Relu"] and conv2.ops == ["Conv"]


def test_the_exact_path_runs_the_prologue_on_onnxruntime_first(tmp_path):
    plan = plan_of(se_model(residual=True), tmp_path)
    split = split_fused(plan)
    index = next(i for i, s in enumerate(split.steps) if isinstance(s, OrtStep) and s.ops == ["Mul"])
    conv = split.steps[index + 1]
    assert isinstance(conv, PluginStep) and conv.ops == ["Conv"] and conv.inputs == ["scaled", "w", "b"]
    assert split.steps[index].outputs == ["scaled"] and split.steps[index + 2].ops == ["Add"]


# --- the fused step against onnxruntime -------------------------------------------------------


@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("residual", [False, True])
def test_the_reference_scale_step_matches_onnxruntime(kernel, residual, tmp_path):
    model = se_model(kernel=kernel, residual=residual, seed=kernel)
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), 3, "cpu")
    assert conv_step(runner.plan).prologue
    inputs = feeds(model, 3)
    np.testing.assert_allclose(runner.run(inputs).outputs["y"], onnxruntime_output(model, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", [1, 3])  # 3x3 pad 1: padded positions stay zero (Relu(b) is not)
@pytest.mark.parametrize("activation", [None, Activation.plain("Relu"), Activation.plain("HardSwish")], ids=str)
def test_the_reference_affine_step_matches_onnxruntime(kernel, activation, tmp_path):
    model = bn_model(activation, kernel=kernel)
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), 3, "cpu")
    assert conv_step(runner.plan).prologue
    inputs = feeds(model, 3)
    np.testing.assert_allclose(runner.run(inputs).outputs["y"], onnxruntime_output(model, inputs), rtol=1e-5, atol=1e-5)


def test_check_passes_models_with_prologues(tmp_path):
    for number, model in enumerate([se_model(kernel=3, residual=True), bn_model(Activation.plain("Relu"), kernel=3)]):
        path = save(model, tmp_path / f"model{number}.onnx")
        assert main(["check", path, "--batch", "4", "--device", "cpu"]) == 0


# --- the CNNs on the offline sm_90 device -------------------------------------------------------


@pytest.mark.skipif(not os.path.exists(f"{CNN}/densenet121.onnx"), reason="no exported torchvision models here")
@pytest.mark.parametrize("name, op, left", [("densenet121", "BatchNormalization", 1), ("efficientnet_b0", "Mul", 1)])
def test_gpu_plans_fuse_the_pointwise_steps_into_their_convs(name, op, left):
    plan = make_plan(load_model(f"{CNN}/{name}.onnx"), 32, Device("cuda", "offline", "9.0"))
    standalone = [s for s in plan.steps if s.ops[0] == op and "Conv" not in s.ops]
    fused = [s for s in plan.plugin_steps if s.prologue]
    # DenseNet's last BatchNormalization feeds the pool; EfficientNet's first block projects on const_* (no prologue)
    assert len(standalone) == left and len(fused) >= 15
    names = {s.plugin.kernel_name(s.node, plan.device, None, s.fused, prologue=s.prologue).split("*")[0] for s in fused}
    assert names <= {"conv.bn_relu", "conv.scale"}


def test_tuning_times_a_fused_step_with_its_prologue_and_keys_it_so(tmp_path):
    from opplugin.lab.tune import conv_steps
    from opplugin.ops.conv.choice import tuning_key

    model = load_model(save(se_model(channels=128, maps=64, size=28), tmp_path / "model.onnx"))
    [(step, spec, epilogue)] = conv_steps(model, 8, Device("cuda", "offline", "9.0"))
    assert step.prologue and epilogue.prologue == Prologue(SCALE)
    assert "scale*" in str(tuning_key(spec, epilogue, "gpu")) and "scale*" not in str(tuning_key(spec, Epilogue(), "gpu"))


def test_plan_shows_the_prologue_in_the_ops_and_the_kernel_name(tmp_path, capsys):
    path = save(bn_model(Activation.plain("Relu"), channels=128, maps=64, size=28), tmp_path / "model.onnx")
    plan = make_plan(load_model(path), 8, Device("cuda", "offline", "9.0"))
    [step] = plan.plugin_steps
    assert step.plugin.kernel_name(step.node, plan.device, None, step.fused, prologue=step.prologue).startswith("conv.bn_relu*tc_3xtf32")
    assert main(["plan", path, "--device", "cpu", "--batch", "4"]) == 0
    assert "BatchNormalization" in capsys.readouterr().out


def test_a_named_variant_without_the_prologue_runs_it_in_cupy_first(tmp_path):
    path = save(bn_model(Activation.plain("Relu"), channels=128, maps=64, size=28), tmp_path / "model.onnx")
    plan = make_plan(load_model(path), 8, Device("cuda", "offline", "9.0"))
    [step] = plan.plugin_steps
    name = step.plugin.kernel_name(step.node, plan.device, "baseline", step.fused, prologue=step.prologue)
    assert name == "cupy bn_relu, then conv.baseline"
