"""Einsum of two operands rewritten at load time as a MatMul between Transposes, where its
equation is a (batched) matrix product:

    "bghid,bghjd->bghij"   (attention scores, q k^T)  ->  MatMul(q, Transpose(k, ...dj))
    "bghij,bghjd->bghid"   (attention times values)    ->  MatMul(a, v)
    "bij,bj->bi"           (a matrix times a vector)   ->  Squeeze(MatMul(a, Unsqueeze(v, -1)), -1)
    "bnc,ck->bkn"          (a constant projection)     ->  Transpose(MatMul(x, w), 0, 2, 1)

Every index is a batch index (in both operands and the output), a free one (in one operand
and the output) or the contracted one (in both operands, not the output): at most one is
contracted, so that no axes need merging (which would take their sizes). An operand's last
free index is the product's rows (or columns); its other free ones lead, as MatMul's
broadcasting takes them. The operands are arranged as (batch..., A's other free, B's other
free, rows, contracted) and (..., contracted, columns), an axis of 1 standing in for what one
lacks where broadcasting would not line it up; one Transpose takes the product to the output's
order. A Transpose that keeps the order is left out, and a constant operand is arranged here,
once. The last node writes the Einsum's output; each tensor between is recorded as a view of an
operand or of the output (transposed, axes of 1 inserted: Simplification.views), so that `check`
compares every step with the original graph. Other equations stay Einsum nodes (onnxruntime runs
them), as does an Einsum reading a tensor that is itself such a view.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..functions import default_opset
from ..ir import Graph

COUNT_KEY = "Einsum as MatMul"  # the summary reads "44 Einsum as MatMul folded"
AXES_INPUT_SINCE = 13  # Squeeze and Unsqueeze read their axes from an input from this opset on


def decompose_einsums(graph: Graph) -> dict[str, int]:
    """Rewrite each two-operand Einsum whose equation is a matrix product;
    {COUNT_KEY: how many} when any, else {}."""
    count = 0
    for node in list(graph.nodes):
        if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx") or len(node.input) != 2 or len(node.output) != 1:
            continue
        roles = product_roles(_equation(node))
        if roles is not None and not any(name in graph.views for name in node.input):
            _rewrite(graph, node, *roles)
            count += 1
    return {COUNT_KEY: count} if count else {}


def _equation(node: onnx.NodeProto) -> str:
    value = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "equation"), b"")
    return (value.decode() if isinstance(value, bytes) else str(value)).replace(" ", "")


def product_roles(equation: str) -> tuple[str, str, str, list[str], list[str], list[str], list[str]] | None:
    """(a, b, out, batch, free in a, free in b, contracted), each list in the output's order, of a
    two-operand equation that is a matrix product (see the module), else None."""
    if "..." in equation or equation.count(",") != 1:
        return None
    left, _, out = equation.partition("->")
    a, b = left.split(",")
    if "->" not in equation:  # implicit output: the indices seen once, in alphabetical order
        out = "".join(sorted(x for x in set(a + b) if (a + b).count(x) == 1))
    if not (a + b + out).isalpha() or any(len(set(s)) != len(s) for s in (a, b, out)) or not set(out) <= set(a + b):
        return None
    batch = [x for x in out if x in a and x in b]
    free_a = [x for x in out if x in a and x not in b]
    free_b = [x for x in out if x in b and x not in a]
    contracted = [x for x in a if x in b and x not in out]
    if len(batch + free_a + contracted) != len(a) or len(batch + free_b + contracted) != len(b) or len(contracted) > 1:
        return None  # an index summed within one operand, or contracted axes that would have to merge
    return a, b, out, batch, free_a, free_b, contracted


def _rewrite(graph: Graph, node: onnx.NodeProto, a: str, b: str, out: str, batch: list[str], free_a: list[str],
             free_b: list[str], contracted: list[str]) -> None:
    base = node.name or node.output[0]
    made: list[onnx.NodeProto] = []

    def step(op: str, inputs: list[str], role: str, view: tuple, **attributes) -> str:
        """A new node writing a new tensor, which is `view` (Simplification.views) of an original one."""
        result = graph.new_name(f"{base}_{role}")
        made.append(helper.make_node(op, inputs, [result], name=f"{base}/{role}", **attributes))
        graph.views[result] = view
        return result

    def with_axes(op: str, source: str, axes: list[int], role: str, view: tuple) -> str:
        """Squeeze or Unsqueeze `axes` (negative: counted from the end) of `source`."""
        if not axes:
            return source
        if default_opset(graph.proto, AXES_INPUT_SINCE) < AXES_INPUT_SINCE:
            return step(op, [source], role, view, axes=axes)
        name = graph.new_name(f"{base}_{role}_axes")
        graph.constants[name] = np.asarray(axes, np.int64)
        return step(op, [source, name], role, view)

    def operand(source: str, indices: str, order: list[str], ones: list[int], role: str) -> str:
        """`source` with its axes in `order`, then axes of 1 at the places `ones` of the result."""
        perm = [indices.index(x) for x in order]
        constant = graph.constant(source)
        if constant is not None:  # arranged here, once
            name = graph.new_name(f"{base}_{role}")
            graph.constants[name] = np.ascontiguousarray(np.expand_dims(np.transpose(constant, perm), tuple(ones)))
            return name
        original = source
        if perm != sorted(perm):
            source = step("Transpose", [source], f"{role}_t", (original, tuple(perm)), perm=perm)
        return with_axes("Unsqueeze", source, ones, f"{role}_ones", (original, tuple(perm), tuple(ones)))

    rows, columns = free_a[-1:], free_b[-1:]
    extra_a, extra_b = free_a[:-1], free_b[:-1]
    nb, na, nx = len(batch), len(extra_a), len(extra_b)
    # (batch, A's other free, 1 for each of B's, rows, K) and (batch, 1 for each of A's, B's other free, K, columns):
    # MatMul lines operands up from their last axes, so the leading ones of 1 are left out where nothing precedes them
    b_ones = nx if nb + na else 0
    a_ones = na if nb else 0
    left_rank, right_rank = nb + na + b_ones + 2, nb + a_ones + nx + 2
    left_ones = [nb + na + k for k in range(b_ones)] + ([] if rows else [left_rank - 2]) + ([] if contracted else [left_rank - 1])
    right_ones = [nb + k for k in range(a_ones)] + ([] if contracted else [right_rank - 2]) + ([] if columns else [right_rank - 1])
    left = operand(node.input[0], a, batch + extra_a + rows + contracted, left_ones, "a")
    right = operand(node.input[1], b, batch + extra_b + contracted + columns, right_ones, "b")
    product = batch + extra_a + extra_b + rows + columns
    to_product = tuple(out.index(x) for x in product)  # the Einsum's output in the product's order
    squeezed = ([] if rows else [-2]) + ([] if columns else [-1])
    rank = len(product) + len(squeezed)
    result = step("MatMul", [left, right], "matmul", (node.output[0], to_product, tuple(rank + k for k in squeezed)))
    result = with_axes("Squeeze", result, squeezed, "squeeze", (node.output[0], to_product))
    perm = [product.index(x) for x in out]
    if perm != sorted(perm):
        step("Transpose", [result], "out_t", (node.output[0], tuple(range(len(out)))), perm=perm)
    del graph.views[made[-1].output[0]]
    made[-1].output[0] = node.output[0]  # the last node writes the Einsum's output
    at = graph.nodes.index(node)
    graph.nodes[at:at + 1] = made

