"""Channel-last regions rewritten to NCHW at load time (graph/passes/layout_sink.py), with the ConvNeXt block's
decomposed GELU as one node (graph/passes/gelu.py) and its layer scale folded into the Conv before it
(graph/passes/conv_affine.py): each graph is compared, on fresh random inputs, with onnxruntime CPU running the ORIGINAL graph,
through onnxruntime on the rewritten graph, through opplugin's CPU runner, and through `check`."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest

from channel_last_models import (TO_LAST, Builder, convnext_block, downsampling, layernorm_over_two_axes, ops, outputs_of,
                                 read_channel_last)
from onnx_builders import save
from opplugin.verify.check import check
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops import activation
from opplugin.plan.partition import make_plan
from opplugin.registry import NodeInfo
from opplugin.runtime import Runner
from opplugin.graph.simplify import simplify
from reduction_cases import fresh

OFFLINE_SM90 = Device("cuda", "offline", "9.0")


def assert_same_results(model: onnx.ModelProto, tmp_path, batch: int = 2, seed: int = 7) -> onnx.ModelProto:
    """The simplified graph gives the original's outputs (onnxruntime on both, and opplugin's CPU
    runner), and `check` passes, comparing every step, transposed ones included; the simplified graph."""
    x = fresh((batch, *[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]), seed)
    expected = outputs_of(model, x)
    simplified, _ = simplify(model)
    for name, value in outputs_of(simplified, x).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), batch, "cpu")
    ours = runner.run({"x": x}).outputs
    for name, value in expected.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    result = check(runner.run, runner.plan_record(), {"x": x})
    assert result.passed, [r for r in result.records if not r["passed"]]
    return simplified


@pytest.mark.parametrize("form", ["torch", "half_first", "x_first", "times_reciprocal"])
def test_a_convnext_block_becomes_convs_without_transposes(tmp_path, form):
    model = convnext_block(gelu_form=form)
    simplified = assert_same_results(model, tmp_path)
    assert ops(simplified) == Counter({"Conv": 3, "LayerNormalization": 1, "Gelu": 1, "Add": 1}), ops(simplified)
    [norm] = [n for n in simplified.graph.node if n.op_type == "LayerNormalization"]
    assert norm.domain == "opplugin" and [a.ints for a in norm.attribute if a.name == "axes"] == [[1]]
    # the layer scale is in the second 1x1 Conv's weights, which write the Mul's output
    assert any(n.op_type == "Conv" and n.output[0] == "scaled" for n in simplified.graph.node)


def test_the_convnext_block_plans_as_fused_conv_steps(tmp_path):
    model = load_model(save(convnext_block(), tmp_path / "block.onnx"))
    plan = make_plan(model, 4, OFFLINE_SM90)
    assert [s.ops for s in plan.steps] == [["Conv"], ["LayerNormalization"], ["Conv", "Gelu"], ["Conv", "Add"]]
    assert plan.fallbacks == {}


def test_a_downsampling_layernorm_loses_both_transposes(tmp_path):
    simplified = assert_same_results(downsampling(), tmp_path, batch=3)
    assert ops(simplified) == Counter({"LayerNormalization": 1, "Conv": 1})


@pytest.mark.parametrize("reader, kept", [("reshape", "mm"), ("output", "ln"), ("reduce", "ln"), ("flatten", "relu")])
def test_a_channel_last_reader_keeps_a_transpose_at_its_border(tmp_path, reader, kept):
    simplified = assert_same_results(read_channel_last(reader), tmp_path)
    transposes = [n for n in simplified.graph.node if n.op_type == "Transpose"]
    # one Transpose writes the channel-last tensor under its own name, for the reader outside; the rest is NCHW
    assert [(n.output[0], list(n.attribute[0].ints)) for n in transposes] == [(kept, [0, 2, 3, 1])]
    assert ops(simplified)["MatMul"] == 0


def test_a_layernorm_over_two_axes_keeps_its_transposes(tmp_path):
    simplified = assert_same_results(layernorm_over_two_axes(), tmp_path)
    assert ops(simplified) == ops(layernorm_over_two_axes())


def test_a_region_that_would_add_as_many_transposes_as_it_drops_stays():
    """Transpose > Relu > Flatten: dropping the start would need a Transpose before the Flatten."""
    b = Builder(4)
    b.node("Flatten", [b.node("Relu", [b.node("Transpose", ["x"], "to_last", perm=TO_LAST)], "relu")], "y", axis=1)
    model = b.model({"y": ["N", 4 * 3 * 3]}, 4, 3)
    simplified, done = simplify(model)
    assert [n.op_type for n in simplified.graph.node] == ["Transpose", "Relu", "Flatten"] and not done.views


@pytest.mark.parametrize("form, suffix", [("none", "+gelu"), ("tanh", "+gelutanh")])
def test_gelu_is_an_activation_of_the_shared_table(form, suffix):
    node = onnx.helper.make_node("Gelu", ["v"], ["y"], approximate=form)
    act = activation.from_node(NodeInfo(node, [], [], {"approximate": form}))
    assert act is not None and act.suffix == suffix
    v = np.linspace(-6, 6, 101)
    if form == "tanh":
        exact = 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    else:
        exact = v * np.array([0.5 * (1 + math.erf(t / math.sqrt(2))) for t in v])
    np.testing.assert_allclose(act.apply(v), exact, rtol=1e-12, atol=1e-15)
    assert "opplugin_gelu(v, " in act.cuda_expression()
