"""A Transpose that keeps the last axis in place, read only by a product with a constant matrix (a
Linear layer, its bias Add too), moves after that product: the product works on each row alone, so
permuting the rows before it or after it gives the same tensor.

torchvision's attention runs sequence first, so its ViT transposes (N, T, C) to (T, N, C) before each
QKV projection. After the move, the projection reads the LayerNorm's output as it lies, and the
Transpose follows it, where the attention step takes it in as a view of the projection's output
(plan/input_views.py), along with the head split that follows.

The move pays only where the Transpose leaves the plan. It is made where the product is no wider
than its input, or where only layout nodes read the product, which later steps take in as views.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..ir import DEFAULT_DOMAINS, Graph

# ops a step may read as a view (plan/input_views.py's STRIDED_VIEWS)
LAYOUT_READERS = frozenset({"Transpose", "Slice", "Split", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def sink_transposes_through_products(graph: Graph) -> dict[str, int]:
    """Move each such Transpose after its product (and the product's bias Add); "Transpose before a
    product" -> how many (the plan's line: "12 Transpose before a product folded")."""
    moved = 0
    for transpose in list(graph.nodes):
        found = _row_product_after(graph, transpose)
        if found is None:
            continue
        product, bias_add = found
        last = bias_add or product
        result = last.output[0]
        if not (_no_wider(graph, product) or all(r.op_type in LAYOUT_READERS for r in graph.readers(result))):
            continue
        product.input[0] = transpose.input[0]
        if bias_add is not None:  # the product's own output now holds the rows unpermuted: a new name
            rows = graph.new_name(f"{product.output[0]}_rows")
            bias_add.input[list(bias_add.input).index(product.output[0])] = rows
            product.output[0] = rows
        unpermuted = graph.new_name(f"{result}_rows")
        last.output[0] = unpermuted
        after = helper.make_node("Transpose", [unpermuted], [result], name=transpose.name, perm=_perm(transpose))
        graph.nodes.remove(transpose)
        graph.nodes.insert(graph.nodes.index(last) + 1, after)
        moved += 1
    return {"Transpose before a product": moved} if moved else {}


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _row_product_after(graph: Graph, transpose: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.NodeProto | None] | None:
    """(the MatMul by a constant matrix that alone reads `transpose`'s output as its A, the Add of a constant
    along the last axis that alone reads the product, if there is one); None where `transpose` is no
    Transpose keeping its last axis, or nothing such reads it."""
    if transpose.op_type != "Transpose" or transpose.domain not in DEFAULT_DOMAINS or len(transpose.input) != 1:
        return None
    perm = _perm(transpose)
    if perm is None or len(perm) < 2 or perm[-1] != len(perm) - 1:
        return None
    product = graph.only_reader(transpose.output[0], "MatMul")
    if product is None or product.input[0] != transpose.output[0] or product.input[1] == transpose.output[0]:
        return None
    weights = graph.constant(product.input[1])
    if weights is None or weights.ndim != 2:
        return None
    bias_add = graph.only_reader(product.output[0], "Add")
    if bias_add is not None:
        other = next((name for name in bias_add.input if name != product.output[0]), None)
        bias = graph.constant(other) if other is not None else None
        # a value per column (leading axes of one), no higher rank than the product: it broadcasts the same
        # over the rows in either order
        if bias is None or bias.ndim > len(perm) or not per_column(bias, weights.shape[1]):
            bias_add = None
    return product, bias_add


def per_column(bias: np.ndarray, columns: int) -> bool:
    """Whether a constant added to a product of `columns` columns is one value per column (or one for all),
    its leading axes of one: the same for every row, so rows may be permuted before the Add or after it."""
    return bias.size == bias.shape[-1] and bias.shape[-1] in (1, columns)


def _no_wider(graph: Graph, product: onnx.NodeProto) -> bool:
    """Whether the product's rows are no longer than its input's: the moved Transpose moves no more bytes."""
    rows_in, rows_out = np.asarray(graph.constant(product.input[1])).shape
    return rows_out <= rows_in
