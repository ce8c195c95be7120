"""An inference BatchNormalization after or before a linear layer, folded into the layer's weight and a bias.

BatchNorm1d after nn.Linear (LeViT's Linear + BN blocks, the BN neck of re-identification and
projection heads) exports as Gemm > BatchNormalization, or over tokens as MatMul (N, T, C) >
Reshape (N*T, C) > BatchNormalization > Reshape back to (N, T, C). A BatchNormalization of a
2-D input normalises its last axis, the product's output columns, so y * factor + shift folds
as W' = W * factor per column plus a bias: Gemm's C (with beta folded in), or after a MatMul an
Add of the shift, which the Gemm plugin fuses as its column bias. The folded nodes write the
tensor the BatchNormalization (or the Reshape back) wrote, so `check` compares them with it;
the Reshapes and the BatchNormalization go. Where the Reshape after it does not give back the
product's shape (LeViT's attention splits the columns into heads), the Reshape before it stays
and writes the BatchNormalization's tensor; the biased product before it is a recorded view
(Simplification.views) of that tensor in the product's shape.

A BatchNormalization before linear layers (LeViT's classifier heads read pooled features through
one; a face model's BatchNorm2d > Flatten > Linear) folds into their weights' rows instead: the
product of x * factor + shift is x times the rows scaled by factor, plus shift times the weight,
a bias. Its readers then read its input (through the Flatten, whose output becomes a recorded view
of that input).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..attributes import attribute
from ..ir import Graph
from ..static_shapes import probe_shapes

COUNT_KEY = "BatchNormalization into MatMul/Gemm"  # "12 BatchNormalization into MatMul/Gemm folded"


def batchnorm_affine(constants: dict[str, np.ndarray], bn: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """(factor, shift) in float64 when `bn` is an inference BatchNormalization with constant
    parameters (y = x * factor + shift per channel), else None."""
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
        return None
    if len(bn.input) != 5 or [o for o in bn.output if o] != [bn.output[0]]:
        return None
    if attribute(bn, "training_mode", 0) or attribute(bn, "spatial", 1) != 1 or attribute(bn, "is_test", 1) == 0:
        return None
    if not all(name in constants for name in bn.input[1:5]):
        return None
    scale, offset, mean, var = (constants[name].astype(np.float64) for name in bn.input[1:5])
    factor = scale / np.sqrt(var + np.float64(attribute(bn, "epsilon", 1e-5)))
    return factor, offset - mean * factor


def fold_linear_batchnorms(graph: Graph) -> dict[str, int]:
    """Fold each BatchNormalization that normalises a MatMul's or Gemm's output columns into it, or
    failing that the input features of the MatMuls and Gemms that alone read it
    {COUNT_KEY: how many} when any."""
    shapes: list = []  # the probe shapes, inferred once and only where a Reshape stands between

    def probes():
        if not shapes:
            shapes.extend(probe_shapes(graph))
        return shapes

    count = 0
    for bn in [n for n in graph.nodes if n.op_type == "BatchNormalization"]:
        count += _fold(graph, bn, probes) or _fold_before(graph, bn, probes)
    return {COUNT_KEY: count} if count else {}


def _fold(graph: Graph, bn: onnx.NodeProto, probes) -> bool:
    affine = batchnorm_affine(graph.constants, bn)
    source = graph.writer(bn.input[0]) if affine else None
    if source is None:
        return False
    reshape = source if source.op_type == "Reshape" else None
    linear = graph.writer(reshape.input[0]) if reshape else source
    if linear is None or linear.op_type not in ("MatMul", "Gemm") or linear.domain not in ("", "ai.onnx"):
        return False
    weight = column_weight(graph, linear)
    if weight is None or any(graph.constants[name].shape != (weight[1],) for name in bn.input[1:5]):
        return False
    between = [linear.output[0], *([reshape.output[0]] if reshape else [])]
    if any(graph.only_reader(name) is None for name in between):
        return False
    if not reshape:
        if not _is_flat(graph, linear, bn, probes):
            return False
        _fold_into(graph, linear, affine, bn.output[0])
        graph.nodes.remove(bn)
        return True
    product_shape = _product_shape(reshape, linear, probes)
    if product_shape is None:
        return False
    restore = _restoring_reshape(graph, bn, linear, probes)
    if restore is not None:  # the product, biased, is what the Reshape back wrote
        _fold_into(graph, linear, affine, restore.output[0])
        graph.nodes.remove(restore)
        graph.nodes.remove(reshape)
    else:  # the Reshape to (rows, columns) of the biased product writes the BatchNormalization's tensor
        biased = graph.new_name(f"{bn.output[0]}_unflattened")
        _fold_into(graph, linear, affine, biased)
        graph.views[biased] = (bn.output[0], (0, 1), (), (-1, *product_shape[1:]))
        reshape.input[0], reshape.output[0] = biased, bn.output[0]
    graph.nodes.remove(bn)
    return True


def _fold_before(graph: Graph, bn: onnx.NodeProto, probes) -> bool:
    """Fold `bn` into the linear layers that alone read it (directly, or through a Flatten of its
    channels and maps), where its input's shape is the same at every batch but the first axis."""
    affine = batchnorm_affine(graph.constants, bn)
    if affine is None or bn.output[0] in graph.outputs:
        return False
    shapes = [s.get(bn.input[0]) for s in probes()]
    if any(shape is None or len(shape) < 2 for shape in shapes) or shapes[0][1:] != shapes[1][1:]:
        return False
    factor, shift = affine
    features, flatten = bn.output[0], None
    if len(shapes[0]) > 2:  # channels and maps: one feature per (channel, position) after Flatten(axis=1)
        readers = graph.readers(bn.output[0])
        if len(readers) != 1 or readers[0].op_type != "Flatten" or attribute(readers[0], "axis", 1) != 1:
            return False
        flatten, features = readers[0], readers[0].output[0]
        positions = int(np.prod(shapes[0][2:]))
        factor, shift = np.repeat(factor, positions), np.repeat(shift, positions)
    linears = graph.readers(features)
    if features in graph.outputs or not linears or not all(_reads_features(graph, n, features, len(factor)) for n in linears):
        return False
    for linear in linears:
        _scale_rows(graph, linear, factor, shift)
    if flatten is None:
        for linear in linears:
            linear.input[0] = bn.input[0]
    else:  # the Flatten now flattens the BatchNormalization's input, under a name of its own
        flat = graph.new_name(f"{bn.input[0]}_flat")
        graph.views[flat] = (bn.input[0], tuple(range(len(shapes[0]))), (), (-1, len(factor)))
        flatten.input[0], flatten.output[0] = bn.input[0], flat
        for linear in linears:
            linear.input[0] = flat
    graph.nodes.remove(bn)
    return True


def _reads_features(graph: Graph, linear: onnx.NodeProto, features: str, count: int) -> bool:
    """Whether `linear` is a MatMul or Gemm that reads `features` as its rows' K = `count` inputs, by a
    constant weight."""
    if linear.op_type not in ("MatMul", "Gemm") or linear.domain not in ("", "ai.onnx") or list(linear.input).count(features) != 1:
        return False
    if linear.input[0] != features:
        return False
    weight = column_weight(graph, linear)
    if weight is None:
        return False
    transposed = linear.op_type == "Gemm" and attribute(linear, "transB", 0)
    return weight[0].shape[1 if transposed else 0] == count


def _scale_rows(graph: Graph, linear: onnx.NodeProto, factor: np.ndarray, shift: np.ndarray) -> None:
    """(x * factor + shift) @ W = x @ (W's rows times factor) + shift @ W: the new weight, and the bias
    as Gemm's C (alpha and beta folded in) or an Add after the MatMul that writes its output."""
    weights = graph.constants[linear.input[1]].astype(np.float64)
    transposed = linear.op_type == "Gemm" and attribute(linear, "transB", 0)
    rows = weights.T if transposed else weights  # (K, N)
    scaled = factor[:, None] * rows
    bias = shift @ rows
    weight_name = graph.new_name(f"{linear.input[1]}_bn")
    graph.constants[weight_name] = (scaled.T if transposed else scaled).astype(np.float32)
    if linear.op_type == "MatMul":
        shift_name, product = graph.new_name(f"{linear.output[0]}_bn_shift"), graph.new_name(f"{linear.output[0]}_unshifted")
        graph.constants[shift_name] = bias.astype(np.float32)
        target = linear.output[0]
        linear.input[1], linear.output[0] = weight_name, product
        add = helper.make_node("Add", [product, shift_name], [target], name=graph.new_name(f"{linear.name or target}_bn_shift"))
        graph.nodes.insert(graph.nodes.index(linear) + 1, add)
        return
    alpha, beta = attribute(linear, "alpha", 1.0), attribute(linear, "beta", 1.0)
    c = graph.constants[linear.input[2]].astype(np.float64) if len(linear.input) > 2 and linear.input[2] else np.zeros(1)
    bias_name = graph.new_name(f"{linear.output[0]}_bn_bias")
    graph.constants[bias_name] = (beta * c + alpha * bias).astype(np.float32)
    data = linear.input[0]
    del linear.input[:]
    linear.input.extend([data, weight_name, bias_name])
    kept = [a for a in linear.attribute if a.name != "beta"]
    del linear.attribute[:]
    linear.attribute.extend(kept)


def _fold_into(graph: Graph, linear: onnx.NodeProto, affine: tuple[np.ndarray, np.ndarray], target: str) -> None:
    (fold_gemm_columns if linear.op_type == "Gemm" else fold_matmul_columns)(graph, linear, *affine, target)


def column_weight(graph: Graph, linear: onnx.NodeProto) -> tuple[np.ndarray, int] | None:
    """(the constant 2-D float32 weight, its output columns), or None where the weight is not that
    (or a Gemm's C is computed at run time, or A is the constant)."""
    if len(linear.input) < 2 or linear.input[0] in graph.constants:
        return None
    weight = graph.constant(linear.input[1])
    if weight is None or weight.dtype != np.float32 or weight.ndim != 2:
        return None
    if linear.op_type == "Gemm":
        if attribute(linear, "transA", 0) or (len(linear.input) > 2 and linear.input[2] and linear.input[2] not in graph.constants):
            return None
        return weight, weight.shape[0] if attribute(linear, "transB", 0) else weight.shape[1]
    return weight, weight.shape[1]


def _is_flat(graph: Graph, linear: onnx.NodeProto, bn: onnx.NodeProto, probes) -> bool:
    """Whether the BatchNormalization reads the product directly as (rows, columns): always for a
    Gemm; for a MatMul where its output is 2-D at both probe batches."""
    if linear.op_type == "Gemm":
        return True
    return all(len(shapes.get(bn.input[0], ())) == 2 for shapes in probes())


def _product_shape(reshape: onnx.NodeProto, linear: onnx.NodeProto, probes) -> tuple[int, ...] | None:
    """The product's shape at the first probe batch, where the Reshape after it makes it (rows,
    columns) at every probe and only its first axis changes with the batch; else None."""
    product, flat = linear.output[0], reshape.output[0]
    found = [(shapes.get(product), shapes.get(flat)) for shapes in probes()]
    if any(p is None or f is None or len(f) != 2 or f[1] != p[-1] for p, f in found):
        return None
    if any(p[1:] != found[0][0][1:] for p, _ in found):
        return None
    return found[0][0]


def _restoring_reshape(graph: Graph, bn: onnx.NodeProto, linear: onnx.NodeProto, probes) -> onnx.NodeProto | None:
    """The Reshape that alone reads the BatchNormalization's output and gives back the product's
    shape; else None."""
    restore = graph.only_reader(bn.output[0], "Reshape")
    if restore is None:
        return None
    if any(shapes.get(restore.output[0]) != shapes.get(linear.output[0]) for shapes in probes()):
        return None
    return restore


def fold_gemm_columns(graph: Graph, gemm: onnx.NodeProto, factor: np.ndarray, shift: np.ndarray, target: str) -> None:
    """B's output columns times factor; C' = beta * C * factor + shift, beta 1; the Gemm writes `target`."""
    b = graph.constants[gemm.input[1]].astype(np.float64)
    columns = factor[:, None] if attribute(gemm, "transB", 0) else factor[None, :]
    c = graph.constants[gemm.input[2]].astype(np.float64) if len(gemm.input) > 2 and gemm.input[2] else np.zeros(1)
    bias = attribute(gemm, "beta", 1.0) * c * factor + shift
    names = [graph.new_name(f"{gemm.input[1]}_bn"), graph.new_name(f"{gemm.output[0]}_bn_bias")]
    graph.constants[names[0]], graph.constants[names[1]] = (b * columns).astype(np.float32), bias.astype(np.float32)
    data = gemm.input[0]
    del gemm.input[:]
    gemm.input.extend([data, *names])
    kept = [a for a in gemm.attribute if a.name != "beta"]
    del gemm.attribute[:]
    gemm.attribute.extend(kept)
    gemm.output[0] = target


def fold_matmul_columns(graph: Graph, matmul: onnx.NodeProto, factor: np.ndarray, shift: np.ndarray, target: str) -> None:
    """W's columns times factor, then an Add of the shift (a column bias) that writes `target`."""
    weights = graph.constants[matmul.input[1]].astype(np.float64) * factor[None, :]
    weight_name, shift_name = graph.new_name(f"{matmul.input[1]}_bn"), graph.new_name(f"{target}_bn_shift")
    graph.constants[weight_name], graph.constants[shift_name] = weights.astype(np.float32), shift.astype(np.float32)
    product = graph.new_name(f"{target}_unshifted")
    matmul.input[1], matmul.output[0] = weight_name, product
    add = helper.make_node("Add", [product, shift_name], [target], name=graph.new_name(f"{matmul.name or target}_bn_shift"))
    graph.nodes.insert(graph.nodes.index(matmul) + 1, add)

