"""Load-time folding of a layer scale (a constant Mul along the last axis) into the linear layer before it
(graph/passes/linear_scale.py): MatMul > Add(b) > Mul, MatMul > Mul, Gemm > Mul; every fold computes what the
original graph computes (onnxruntime on both), the residual Add after it joins the product's step, and the
Muls that scale another axis, or whose product is read elsewhere, stay."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish, save

from opplugin.cli import main
from opplugin.graph.passes.linear_scale import COUNT_KEY
from opplugin.graph.simplify import simplify

TOKENS, WIDTH = 6, 8
RNG = np.random.default_rng(11)


def layer_scale_model(gamma_shape=(WIDTH,), bias: bool = True, gemm: bool = False, product_read_twice: bool = False) -> onnx.ModelProto:
    """y = x + gamma * (x W [+ b]): a transformer block's scaled residual branch, x (N, T, C) (a Gemm's (N, C))."""
    x_dims = ["N", WIDTH] if gemm else ["N", TOKENS, WIDTH]
    initializers = [numpy_helper.from_array(RNG.standard_normal((WIDTH, WIDTH)).astype(np.float32), "w"),
                    numpy_helper.from_array(RNG.uniform(1e-3, 0.5, gamma_shape).astype(np.float32), "gamma")]
    if gemm:
        initializers.append(numpy_helper.from_array(RNG.standard_normal(WIDTH).astype(np.float32), "b"))
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["linear"], transB=1, beta=0.5)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["product" if bias else "linear"])]
        if bias:
            initializers.append(numpy_helper.from_array(RNG.standard_normal(WIDTH).astype(np.float32), "b"))
            nodes.append(helper.make_node("Add", ["product", "b"], ["linear"]))
    nodes += [helper.make_node("Mul", ["gamma", "linear"], ["scaled"]), helper.make_node("Add", ["x", "scaled"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_dims)]
    if product_read_twice:
        outputs.append(helper.make_tensor_value_info("linear", TensorProto.FLOAT, x_dims))
    graph = helper.make_graph(nodes, "layer_scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)], outputs, initializers)
    return finish(graph)


def both_outputs(original: onnx.ModelProto, folded: onnx.ModelProto, batch: int = 3):
    x = RNG.standard_normal((batch, *[d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim[1:]])).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0] for m in (original, folded)]
    return run[0], run[1]


@pytest.mark.parametrize("form", ["MatMul > Add > Mul", "MatMul > Mul", "Gemm > Mul", "a scalar"])
def test_a_layer_scale_folds_into_the_layer_before(form):
    model = {"MatMul > Add > Mul": layer_scale_model(), "MatMul > Mul": layer_scale_model(bias=False),
             "Gemm > Mul": layer_scale_model(gemm=True), "a scalar": layer_scale_model(gamma_shape=())}[form]
    folded, done = simplify(model)
    assert "Mul" not in [n.op_type for n in folded.graph.node] and done.constants_folded == {COUNT_KEY: 1}
    expected, got = both_outputs(model, folded)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["scales the tokens", "adds axes", "the product has another reader"])
def test_a_scale_that_cannot_fold_stays(case):
    model = {"scales the tokens": layer_scale_model(gamma_shape=(TOKENS, 1)), "adds axes": layer_scale_model(gamma_shape=(1, 1, 1, WIDTH)),
             "the product has another reader": layer_scale_model(product_read_twice=True)}[case]
    folded, done = simplify(model)
    assert "Mul" in [n.op_type for n in folded.graph.node] and COUNT_KEY not in done.constants_folded


def test_the_scaled_branch_and_its_residual_run_as_one_step_and_check_passes(tmp_path, capsys):
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    path = save(layer_scale_model(), tmp_path / "layer_scale.onnx")
    [step] = Runner(load_model(path), 2, "cpu").plan.plugin_steps
    assert step.ops == ["MatMul", "Add", "Add"]  # the product, its column bias (b * gamma), the residual
    assert main(["check", path, "--batch", "2", "--device", "cpu", "--data", "random"]) == 0
