"""Einsum of two operands as a MatMul between Transposes (ops/gemm/einsum_pattern.py): which
equations are matrix products, and the rewritten graph against onnxruntime's Einsum on the
original, then planned with no onnxruntime step and run on the CPU device."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import save

from opplugin.cli import main
from opplugin.model import load_model
from opplugin.ops.gemm.einsum_pattern import product_roles
from opplugin.runtime import Runner
from opplugin.simplify import simplify


@pytest.mark.parametrize("equation, roles", [
    ("bghid,bghjd->bghij", (list("bgh"), ["i"], ["j"], ["d"])),  # attention scores: q k^T
    ("bghij,bghjd->bghid", (list("bgh"), ["i"], ["d"], ["j"])),
    ("bij,bj->bi", (["b"], ["i"], [], ["j"])),
    ("bi,bj->bij", (["b"], ["i"], ["j"], [])),  # an outer product: nothing contracted
    ("ij,jk", ([], ["i"], ["k"], ["j"])),  # implicit output "ik"
    ("bnc,ck->bkn", ([], ["b", "n"], ["k"], ["c"])),  # two free in A: b leads, as MatMul broadcasts it
])
def test_matrix_products_are_recognised(equation, roles):
    assert product_roles(equation)[3:] == roles


@pytest.mark.parametrize("equation", ["bii->bi", "bij,bjk->b", "...ij,...jk->...ik", "bijk,bjkl->bil", "bij->bji", "bij,bjk->bik,b"])
def test_other_equations_stay(equation):
    assert product_roles(equation) is None


# equation -> (A's shape, B's shape, whether B is a constant); axis 0 of A is the batch
CASES = {
    "bghid,bghjd->bghij": ((2, 3, 4, 5, 8), (2, 3, 4, 6, 8), False),
    "bghij,bghjd->bghid": ((2, 3, 4, 5, 6), (2, 3, 4, 6, 8), False),
    "bhqd,bhkd->bhkq": ((2, 4, 7, 8), (2, 4, 9, 8), False),  # the output transposed too
    "bij,bj->bi": ((2, 5, 7), (2, 7), False),
    "bi,bj->bij": ((2, 5), (2, 3), False),
    "bnc,ck->bkn": ((2, 6, 5), (5, 4), True),  # a constant B, arranged at load
    "bnc,bk->bnkc": ((2, 6, 5), (2, 4), False),  # nothing contracted, two free in A
    "bhnc,bmc->bhmn": ((2, 3, 6, 5), (2, 4, 5), False),  # A's h broadcasts over B
    "bc,bhkc->bkh": ((2, 5), (2, 3, 4, 5), False),  # B's h broadcasts over A, no rows
}


def einsum_model(equation: str, a_shape, b_shape, b_constant: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(len(equation))
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", *a_shape[1:]])]
    initializers = []
    if b_constant:
        initializers.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", *b_shape[1:]]))
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation=equation)
    graph = helper.make_graph([node], "einsum", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _feeds(model: onnx.ModelProto, a_shape, b_shape, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    names = [i.name for i in model.graph.input]
    shapes = {"a": (batch, *a_shape[1:]), "b": (batch, *b_shape[1:])}
    return {name: rng.standard_normal(shapes[name]).astype(np.float32) for name in names}


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("equation", list(CASES))
def test_the_rewrite_gives_the_einsum_and_plans_no_onnxruntime_step(equation, tmp_path):
    a_shape, b_shape, b_constant = CASES[equation]
    original = einsum_model(equation, a_shape, b_shape, b_constant)
    simplified, done = simplify(original)
    ops = [n.op_type for n in simplified.graph.node]
    assert "Einsum" not in ops and "MatMul" in ops and done.constants_folded["Einsum as MatMul"] == 1
    assert simplified.graph.node[-1].output[0] == "y"  # the last node writes the Einsum's output: check compares it
    for batch in (1, 3):
        feeds = _feeds(original, a_shape, b_shape, batch, seed=batch)
        np.testing.assert_allclose(_onnxruntime(simplified, feeds), _onnxruntime(original, feeds), rtol=1e-5, atol=1e-5)
    path = save(original, tmp_path / "einsum.onnx")
    runner = Runner(load_model(path), 3, "cpu")
    assert [s.kind for s in runner.plan.steps if s.kind != "plugin"] == [], runner.plan.fallbacks
    feeds = _feeds(original, a_shape, b_shape, 3, seed=7)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], _onnxruntime(original, feeds), rtol=1e-5, atol=1e-5)
    # every step between is a view of an operand or of the output: check compares each with the original graph
    assert main(["check", str(path), "--batch", "3", "--device", "cpu"]) == 0


def test_an_equation_that_is_no_matrix_product_stays_an_einsum():
    model = einsum_model("bij,bjk->b", (2, 3, 4), (2, 4, 5), False)
    simplified, done = simplify(model)
    assert [n.op_type for n in simplified.graph.node] == ["Einsum"] and "Einsum as MatMul" not in done.constants_folded
