"""A constant Mul along the last axis after a linear layer, folded into the layer's weight columns and bias.

A layer scale multiplies a block's Linear output by learnt per-channel values before the residual Add
(CaiT, DeiT III and ViTs built with init_values, timm's ConvNeXt with its MLP as Linear layers):
MatMul(x, W) [> Add(b)] > Mul(gamma), or a Gemm > Mul(gamma). With gamma constant along every axis but
the last (or a scalar), y = (x W + b) * gamma = x (W * gamma) + b * gamma: W's columns and the bias are
scaled once, at load, in float64 and stored as float32 (conv_affine.py does the same for a Conv). The
layer then writes the Mul's tensor, and its bias Add is left to the Gemm plugin's column bias, so the
residual Add after it can join the product's step too. The tensors between must have no other reader.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..ir import DEFAULT_DOMAINS, Graph
from .linear_batchnorm import column_weight, fold_gemm_columns, fold_matmul_columns

COUNT_KEY = "layer scale into MatMul/Gemm"  # the summary reads "24 layer scale into MatMul/Gemm folded"


def fold_linear_scales(graph: Graph) -> dict[str, int]:
    """Fold every constant Mul along the last axis that alone reads a linear layer's (biased) output into
    that layer: {COUNT_KEY: how many} when any."""
    count = sum(_fold(graph, mul) for mul in [n for n in graph.nodes if n.op_type == "Mul" and n.domain in DEFAULT_DOMAINS])
    return {COUNT_KEY: count} if count else {}


def _fold(graph: Graph, mul: onnx.NodeProto) -> bool:
    data, factor = _data_and_constant(graph, mul)
    if data is None:
        return False
    linear, bias_add = graph.writer(data), None
    if linear is not None and linear.op_type == "Add" and linear.domain in DEFAULT_DOMAINS:
        bias_add = linear
        product, _ = _data_and_constant(graph, bias_add)
        linear = graph.writer(product) if product is not None else None
    if linear is None or linear.op_type not in ("MatMul", "Gemm") or linear.domain not in DEFAULT_DOMAINS:
        return False
    weight = column_weight(graph, linear)
    if weight is None or (bias_add is not None and linear.op_type == "Gemm"):
        return False
    columns = weight[1]
    # a factor of more axes than the product would broadcast the Mul's output to a higher rank: a Gemm's
    # is 2-D, a MatMul's (A's rank) at least 1
    gamma = _along_last_axis(factor, columns) if factor.ndim <= (2 if linear.op_type == "Gemm" else 1) else None
    shift = np.zeros(columns) if bias_add is None else _along_last_axis(_data_and_constant(graph, bias_add)[1], columns)
    between = [linear.output[0], *([bias_add.output[0]] if bias_add is not None else [])]
    if gamma is None or shift is None or any(graph.only_reader(name) is None for name in between):
        return False
    if linear.op_type == "Gemm":
        fold_gemm_columns(graph, linear, gamma, shift, mul.output[0])
    elif bias_add is not None:
        fold_matmul_columns(graph, linear, gamma, shift * gamma, mul.output[0])
    else:  # W's columns scaled, no bias to add
        scaled = graph.new_name(f"{linear.input[1]}_scaled")
        graph.constants[scaled] = (weight[0].astype(np.float64) * gamma).astype(np.float32)
        linear.input[1], linear.output[0] = scaled, mul.output[0]
    for node in (bias_add, mul):
        if node is not None:
            graph.nodes.remove(node)
    return True


def _data_and_constant(graph: Graph, node: onnx.NodeProto) -> tuple[str | None, np.ndarray | None]:
    """(the tensor a binary node computes on, its constant float32 other operand), or (None, None)."""
    if len(node.input) != 2:
        return None, None
    for data, other in (node.input, node.input[::-1]):
        value = graph.constant(other)
        if value is not None and data not in graph.constants and value.dtype == np.float32:
            return data, value
    return None, None


def _along_last_axis(value: np.ndarray, columns: int) -> np.ndarray | None:
    """`value` as `columns` float64 values when it is one per column of the last axis (every other axis 1)
    or a single value; None otherwise."""
    if any(extent != 1 for extent in value.shape[:-1]) or (value.ndim and value.shape[-1] not in (1, columns)):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (columns,)).copy()
