"""Einsum of two operands as a MatMul between Transposes (graph/passes/einsum.py): which
equations are matrix products, and the rewritten graph against onnxruntime's Einsum on the
original, then planned with no onnxruntime step and run on the CPU device."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import save

from opplugin.cli import main
from opplugin.graph.model import load_model
from opplugin.graph.passes.einsum import product_roles
from opplugin.runtime import Runner
from opplugin.graph.simplify import simplify
from einsum_cases import CASES, einsum_feeds, einsum_model, onnxruntime_einsum


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


@pytest.mark.parametrize("equation", list(CASES))
def test_the_rewrite_gives_the_einsum_and_plans_no_onnxruntime_step(equation, tmp_path):
    a_shape, b_shape, b_constant = CASES[equation]
    original = einsum_model(equation, a_shape, b_shape, b_constant)
    simplified, done = simplify(original)
    ops = [n.op_type for n in simplified.graph.node]
    assert "Einsum" not in ops and "MatMul" in ops and done.constants_folded["Einsum as MatMul"] == 1
    assert simplified.graph.node[-1].output[0] == "y"  # the last node writes the Einsum's output: check compares it
    for batch in (1, 3):
        feeds = einsum_feeds(original, a_shape, b_shape, batch, seed=batch)
        np.testing.assert_allclose(onnxruntime_einsum(simplified, feeds), onnxruntime_einsum(original, feeds), rtol=1e-5, atol=1e-5)
    path = save(original, tmp_path / "einsum.onnx")
    runner = Runner(load_model(path), 3, "cpu")
    assert [s.kind for s in runner.plan.steps if s.kind != "plugin"] == [], runner.plan.fallbacks
    feeds = einsum_feeds(original, a_shape, b_shape, 3, seed=7)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_einsum(original, feeds), rtol=1e-5, atol=1e-5)
    # every step between is a view of an operand or of the output: check compares each with the original graph
    assert main(["check", str(path), "--batch", "3", "--device", "cpu"]) == 0


def test_an_equation_that_is_no_matrix_product_stays_an_einsum():
    model = einsum_model("bij,bjk->b", (2, 3, 4), (2, 4, 5), False)
    simplified, done = simplify(model)
    assert [n.op_type for n in simplified.graph.node] == ["Einsum"] and "Einsum as MatMul" not in done.constants_folded
