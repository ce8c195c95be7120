"""A per-output-channel constant Mul or Add after a Conv, folded into the Conv's weights and bias.

ConvNeXt multiplies each block's output by a learnt per-channel "layer scale" (Mul by a constant
[C, 1, 1]); a scalar Mul, and an Add of a per-channel constant, fold the same way. As with an
inference BatchNormalization (batchnorm_conv.py folds those with the same arithmetic), the Conv then
writes the folded node's output name, and nothing else may read the Conv's own output.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..ir import Graph

COUNT_KEY = "channel Mul/Add after Conv"  # the summary reads "18 channel Mul/Add after Conv folded"


def fold_channel_affine(weights: np.ndarray, bias: np.ndarray | None, factor: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Conv's weights and bias with y * factor + shift (per output channel) folded in, computed in
    float64 and stored as float32: W' = W * factor, b' = b * factor + shift."""
    channels = weights.shape[0]
    factor = np.broadcast_to(np.asarray(factor, np.float64).reshape(-1), (channels,))
    shift = np.broadcast_to(np.asarray(shift, np.float64).reshape(-1), (channels,))
    b = np.zeros(channels) if bias is None else bias.astype(np.float64)
    folded_weights = weights.astype(np.float64) * factor.reshape(-1, *([1] * (weights.ndim - 1)))
    return folded_weights.astype(np.float32), (b * factor + shift).astype(np.float32)


def fold_channel_affines(graph: Graph) -> dict[str, int]:
    """Fold every constant per-channel Mul and Add that alone reads a Conv's output into that Conv;
    {COUNT_KEY: how many} when any."""
    count = 0
    for conv in list(graph.nodes):
        while conv in graph.nodes and _fold_follower(graph, conv):
            count += 1
    return {COUNT_KEY: count} if count else {}


def _fold_follower(graph: Graph, conv: onnx.NodeProto) -> bool:
    """Fold the Mul or Add after `conv` when it can; whether it did."""
    if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.output) != 1:
        return False
    weights = graph.constant(conv.input[1]) if len(conv.input) > 1 else None
    bias_name = conv.input[2] if len(conv.input) > 2 and conv.input[2] else ""
    if weights is None or weights.dtype != np.float32 or (bias_name and bias_name not in graph.constants):
        return False
    output = conv.output[0]
    node = graph.only_reader(output)
    if node is None:
        return False
    channel = _per_channel_operand(graph, node, output, weights)
    if channel is None:
        return False
    ones, zeros = np.ones(weights.shape[0]), np.zeros(weights.shape[0])
    factor, shift = (channel, zeros) if node.op_type == "Mul" else (ones, channel)
    folded = fold_channel_affine(weights, graph.constants[bias_name] if bias_name else None, factor, shift)
    names = [graph.new_name(f"{conv.input[1]}_{node.op_type.lower()}"), graph.new_name(f"{bias_name or output}_{node.op_type.lower()}")]
    for name, value in zip(names, folded):
        graph.constants[name] = value
    data = conv.input[0]
    del conv.input[:]
    conv.input.extend([data, *names])
    conv.output[0] = node.output[0]  # the folded Conv writes what the Mul or Add wrote
    graph.nodes.remove(node)
    return True


def _per_channel_operand(graph: Graph, node: onnx.NodeProto, output: str, weights: np.ndarray) -> np.ndarray | None:
    """The constant a Mul or Add combines with the Conv's output, as float64 per output channel
    (one value, or one per channel along axis 1, ones elsewhere), or None when it is not that."""
    if node.op_type not in ("Mul", "Add") or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    other = node.input[1] if node.input[0] == output else node.input[0]
    value = graph.constant(other)
    if other == output or value is None or value.dtype != np.float32 or value.ndim > weights.ndim:
        return None
    shape = (1,) * (weights.ndim - value.ndim) + value.shape  # as it broadcasts against the Conv's output
    if any(d != 1 for axis, d in enumerate(shape) if axis != 1) or shape[1] not in (1, weights.shape[0]):
        return None
    return np.asarray(value, np.float64).reshape(-1)
