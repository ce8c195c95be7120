"""A product of two computed tensors whose operands are each scaled by a constant first, as torch's
exporter writes scaled-dot-product attention (Q * s and K^T * s, s = d^-1/4, then MatMul): the scales move
after the product, as one Mul by their product. Two passes over Q and K^T become one over the scores,
where the attention's Softmax reads them (and where a fused attention takes the scale).

(a s1)(b s2) = (ab)(s1 s2) exactly in real numbers; in FP32 the two differ by a rounding or two of each
product, an error of FP32's order.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..ir import DEFAULT_DOMAINS, Graph


def fold_matmul_operand_scales(graph: Graph) -> dict[str, int]:
    """Move each scalar Mul that alone feeds an operand of a MatMul of two computed tensors after it;
    "MatMul operand scale" -> how many Muls went."""
    moved = 0
    for node in list(graph.nodes):
        if node.op_type != "MatMul" or node.domain not in DEFAULT_DOMAINS or len(node.input) != 2:
            continue
        if any(graph.constant(x) is not None for x in node.input):
            continue  # a product by a constant matrix: a Gemm, whose operand's scale folds elsewhere
        factor, operands, scales = np.float32(1.0), list(node.input), []
        for position, operand in enumerate(node.input):
            found = _scaled_by_constant(graph, operand, node)
            if found is not None:
                mul, source, value = found
                factor, operands[position] = np.float32(factor * value), source
                scales.append(mul)
        if not scales:
            continue
        product = node.output[0]
        unscaled, scale = graph.new_name(f"{product}_unscaled"), graph.new_name(f"{product}_scale")
        graph.constants[scale] = np.array(factor, dtype=np.float32)
        node.input[:] = operands
        node.output[0] = unscaled
        after = helper.make_node("Mul", [unscaled, scale], [product], name=f"{node.name}_scale" if node.name else "")
        graph.nodes.insert(graph.nodes.index(node) + 1, after)
        for mul in scales:
            graph.nodes.remove(mul)
        moved += len(scales)
    return {"MatMul operand scale": moved} if moved else {}


def _scaled_by_constant(graph: Graph, operand: str, product: onnx.NodeProto) -> tuple[onnx.NodeProto, str, np.float32] | None:
    """(the Mul, what it scales, the scale) where `operand` is a float32 tensor times one float32 constant
    value, read by `product` alone; else None."""
    mul = graph.writer(operand)
    if mul is None or mul.op_type != "Mul" or mul.domain not in DEFAULT_DOMAINS or len(mul.input) != 2:
        return None
    if graph.only_reader(operand) is not product or list(product.input).count(operand) != 1:
        return None
    for position in (0, 1):
        value = graph.constant(mul.input[1 - position])
        if value is not None and value.size == 1 and value.dtype == np.float32 and np.isfinite(value).all():
            source = mul.input[position]
            if graph.constant(source) is None:
                return mul, source, np.float32(value.reshape(()))
    return None
