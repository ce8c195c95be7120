"""An inference BatchNormalization folded into the Conv before it, when it is that Conv's only
reader and every weight is constant: W' = W * scale / sqrt(var + eps) per output map,
b' = (b - mean) * scale / sqrt(var + eps) + B, computed in float64, stored as float32.
The folded Conv writes the tensor the BatchNormalization wrote, so `check` compares it with that.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..attributes import attribute
from ..ir import DEFAULT_DOMAINS, Graph
from .conv_affine import fold_channel_affine
from .linear_batchnorm import batchnorm_affine


def fold_batchnorms(graph: Graph) -> int:
    """Fold every BatchNormalization that can go into the Conv before it; how many did."""
    folded = 0
    for bn in list(graph.nodes):
        conv = _foldable_conv(graph, bn)
        if conv is None:
            continue
        weights, bias = fold_batchnorm(
            graph.constants[conv.input[1]],
            graph.constants[conv.input[2]] if len(conv.input) > 2 and conv.input[2] else None,
            *(graph.constants[name] for name in bn.input[1:5]),
            epsilon=attribute(bn, "epsilon", 1e-5),
        )
        names = [graph.new_name(f"{conv.input[1]}_bn"), graph.new_name(f"{bn.input[2]}_conv")]
        for name, value in zip(names, (weights, bias)):
            graph.constants[name] = value
        data = conv.input[0]
        del conv.input[:]
        conv.input.extend([data, *names])
        conv.output[0] = bn.output[0]  # the folded Conv writes what the BatchNormalization wrote
        graph.nodes.remove(bn)
        folded += 1
    return folded


def fold_batchnorm(weights: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, offset: np.ndarray,
                   mean: np.ndarray, var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """A Conv's weights and bias with the inference BatchNormalization after it folded in,
    computed in float64 and stored as float32:
    W' = W * scale / sqrt(var + eps) per output channel, b' = (b - mean) * scale / sqrt(var + eps) + B."""
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float64(epsilon))
    return fold_channel_affine(weights, bias, factor, offset.astype(np.float64) - mean.astype(np.float64) * factor)


def _foldable_conv(graph: Graph, bn: onnx.NodeProto) -> onnx.NodeProto | None:
    """The Conv that `bn` can fold into, or None: an inference BatchNormalization with
    constant parameters, after a float32 Conv with constant weights whose output
    nobody else reads."""
    if batchnorm_affine(graph.constants, bn) is None:
        return None
    source = bn.input[0]
    conv = graph.writer(source)
    if conv is None or conv.op_type != "Conv" or conv.domain not in DEFAULT_DOMAINS or len(conv.output) != 1:
        return None
    if graph.only_reader(source) is None:
        return None
    if not all(name in graph.constants for name in conv.input[1:] if name):
        return None
    weights = graph.constants[conv.input[1]]
    if weights.dtype != np.float32 or any(graph.constants[n].shape != (weights.shape[0],) for n in bn.input[1:5]):
        return None
    return conv
