"""Partitioning into plugin and onnxruntime steps."""
import numpy as np
import onnxruntime as ort

from onnx_builders import save, tiny_cnn
from opplugin.graph.model import load_model
from opplugin.plan.partition import OrtStep, make_plan
from plan_text import describe
from opplugin.gpu.device import Device
from opplugin.gpu.device import CPU
from opplugin.registry import plugins


def test_convs_gemms_and_their_epilogues_become_plugin_steps_and_the_rest_maximal_onnxruntime_runs(tiny_model_path):
    plan = make_plan(load_model(tiny_model_path), 4, CPU)
    kinds = [(type(s).__name__, s.ops) for s in plan.steps]
    assert kinds == [
        ("PluginStep", ["Conv", "Relu", "MaxPool"]),
        ("PluginStep", ["Conv", "Relu"]),
        ("PluginStep", ["Gemm", "Softmax"]),
    ]
    assert plan.steps[0].outputs == ["p1"] and plan.steps[1].inputs == ["p1", "w2"]
    assert plan.steps[2].inputs == ["r2", "gw", "gb"] and plan.steps[2].outputs == ["y"]  # r2 read through the Flatten, a view
    assert plan.fallbacks == {}
    # with the Conv plugin alone, what follows the Convs is one onnxruntime run
    conv_only = make_plan(load_model(tiny_model_path), 4, CPU, registry={"Conv": plugins()["Conv"]})
    assert [(type(s).__name__, s.ops) for s in conv_only.steps][2:] == [("OrtStep", ["Flatten", "Gemm", "Softmax"])]
    assert conv_only.steps[2].inputs == ["r2"] and conv_only.steps[2].outputs == ["y"]


def test_a_tensor_read_twice_is_not_fused_away(tmp_path):
    import onnx

    model = tiny_cnn()
    # the graph also returns conv1's output: the Conv's kernel must write it
    model.graph.output.append(onnx.helper.make_tensor_value_info("c1", onnx.TensorProto.FLOAT, ["N", 4, 12, 12]))
    plan = make_plan(load_model(save(model, tmp_path / "two_readers.onnx")), 2, CPU)
    assert plan.steps[0].ops == ["Conv"] and plan.steps[0].outputs == ["c1"]
    assert [s.ops for s in plan.steps[1:3]] == [["Relu"], ["MaxPool"]] and plan.steps[2].kind == "plugin"


def test_a_pool_in_ceil_mode_is_left_to_onnxruntime(tmp_path):
    model = tiny_cnn()
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    pool.attribute.append(onnx_helper().make_attribute("ceil_mode", 1))
    plan = make_plan(load_model(save(model, tmp_path / "ceil_pool.onnx")), 2, CPU)
    assert plan.steps[0].ops == ["Conv", "Relu"]
    assert plan.steps[1].ops == ["MaxPool"]


def onnx_helper():
    from onnx import helper

    return helper


def test_onnxruntime_step_sub_models_run_on_their_own(tiny_model_path):
    plan = make_plan(load_model(tiny_model_path), 2, CPU, registry={"Conv": plugins()["Conv"]})
    step = plan.steps[2]
    assert isinstance(step, OrtStep)
    session = ort.InferenceSession(step.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"r2": np.random.default_rng(0).uniform(0, 1, (2, 4, 4, 4)).astype(np.float32)})
    assert y.shape == (2, 5)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_registry_without_plugins_gives_one_onnxruntime_step(tiny_model_path):
    plan = make_plan(load_model(tiny_model_path), 1, CPU, registry={})
    assert len(plan.steps) == 1 and isinstance(plan.steps[0], OrtStep)
    assert plan.steps[0].inputs == ["x"] and plan.steps[0].outputs == ["y"]


def test_on_a_gpu_device_unsupported_convs_fall_back_with_a_reason(tmp_path):
    from onnx_builders import single_conv

    # 1-D convolution is outside what the CUDA variants cover: the plan must say so
    path = save(single_conv((1, 3, 20), (4, 3, 5), {}, bias=True), tmp_path / "conv1d.onnx")
    plan = make_plan(load_model(path), 1, Device("cuda", "test GPU"))
    assert plan.plugin_steps == []
    assert "2-D" in plan.fallbacks["conv"]
    text = describe(plan)
    assert "Left to onnxruntime" in text and "conv" in text


def test_describe_lists_every_step(tiny_model_path):
    text = describe(make_plan(load_model(tiny_model_path), 3, CPU))
    for name in ("conv1", "conv2", "reads as a view: f = Flatten of r2", "Conv > Relu > MaxPool", "Gemm > Softmax", "(fused)",
                 "x [3, 3, 12, 12]"):
        assert name in text


def test_plan_says_which_variants_a_large_filter_bank_rules_out(tmp_path):
    from onnx_builders import single_conv

    # 64 x 32 x 3 x 3 floats = 72 KiB of filters: over the 64 KiB of constant memory
    path = save(single_conv((1, 32, 10, 10), (64, 32, 3, 3), {}, bias=True), tmp_path / "wide.onnx")
    gpu = Device("cuda", "test GPU")
    plan = make_plan(load_model(path), 1, gpu)
    step = plan.plugin_steps[0]
    notes = {step.name: step.plugin.variant_notes(step.node, gpu)}
    assert notes["conv"]["baseline"] is None
    assert "64 KiB" in notes["conv"]["const"] and "64 KiB" in notes["conv"]["const_mo"]
    text = describe(plan)
    assert "CUDA variants offered: baseline" in text and "const not offered" in text


def test_a_plugin_for_an_op_inside_a_fused_chain_says_the_fusion_was_given_up():
    from example_plugin import ReluPlugin
    from opplugin.registry import plugins

    model = load_model("lenet86")
    fused = make_plan(model, 1, CPU)
    assert fused.steps[0].ops == ["Conv", "Relu", "MaxPool"] and fused.fusions_given_up == {}

    with_relu = make_plan(model, 1, CPU, registry={**plugins(), "Relu": ReluPlugin()})
    # the Relu plugin takes its nodes, so each Conv runs alone, and the plan says why
    assert [s.ops for s in with_relu.plugin_steps][:2] == [["Conv"], ["Relu"]]
    assert set(with_relu.fusions_given_up) == {"conv1", "conv2", "fc1"}
    why = with_relu.fusions_given_up["conv1"]
    assert why == "Conv > Relu > MaxPool not fused: a plugin is registered for Relu, so relu1 runs as a step of its own"
    text = describe(with_relu)
    assert "Fusions given up:" in text and f"conv1: {why}" in text
