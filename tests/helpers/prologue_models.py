"""Pointwise nodes before a Conv, for the prologue tests. Graph inputs x [N, C, S, S] (and r
[N, M, OS, OS] for a residual); the last node writes "y".

- `se_model`: a squeeze-and-excitation scale: s = Sigmoid(GlobalAveragePool(x)), then
  Mul(s, x) (the order torchvision writes) feeding the Conv.
- `bn_model`: an inference BatchNormalization, an activation (or none), then the Conv: DenseNet's
  pre-activation; with `second_reader` the BatchNormalization's output is also a graph output.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import batchnorm_params, finish
from residual_models import activation_nodes
from opplugin.ops.activation import Activation


def _conv(rng, source: str, channels: int, maps: int, kernel: int, pads: int, out: str) -> tuple[onnx.NodeProto, dict]:
    inits = {"w": rng.standard_normal((maps, channels, kernel, kernel)).astype(np.float32) / np.sqrt(channels * kernel * kernel),
             "b": rng.standard_normal(maps).astype(np.float32) * 0.1}
    return helper.make_node("Conv", [source, "w", "b"], [out], name="conv", pads=[pads] * 4), inits


def _model(nodes, inits, channels: int, maps: int, size: int, outputs: list[str], residual: bool) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", maps, size, size]))
    graph = helper.make_graph(
        nodes, "prologue", inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", f"{name}_c", f"{name}_h", f"{name}_w"]) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    return finish(graph)


def se_model(channels: int = 8, maps: int = 6, size: int = 6, kernel: int = 1, residual: bool = False,
             seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    pads = kernel // 2
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="squeeze"),
             helper.make_node("Sigmoid", ["pooled"], ["s"], name="excite"),
             helper.make_node("Mul", ["s", "x"], ["scaled"], name="scale")]
    conv, inits = _conv(rng, "scaled", channels, maps, kernel, pads, "c" if residual else "y")
    nodes.append(conv)
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["y"], name="add"))
    return _model(nodes, inits, channels, maps, size, ["y"], residual)


def bn_model(activation: Activation | None, channels: int = 8, maps: int = 6, size: int = 6, kernel: int = 1,
             second_reader: bool = False, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    params = batchnorm_params(rng, channels)
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["normed"], name="bn", epsilon=1e-5)]
    source = "normed"
    if activation:
        more, constants = activation_nodes(activation, "normed", "activated")
        nodes += more
        params |= constants
        source = "activated"
    conv, inits = _conv(rng, source, channels, maps, kernel, kernel // 2, "y")
    nodes.append(conv)
    return _model(nodes, params | inits, channels, maps, size, ["y", "normed"] if second_reader else ["y"], False)


def feeds(model: onnx.ModelProto, batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs of every graph input at this batch (never zeros)."""
    rng = np.random.default_rng(seed)
    result = {}
    for value in model.graph.input:
        shape = [batch if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]
        result[value.name] = rng.standard_normal(shape).astype(np.float32)
    return result


def dense_model(channels: int = 128, growth: int = 64, size: int = 28, seed: int = 0) -> onnx.ModelProto:
    """Two DenseNet layers: c0 = Conv(x); cat1 = Concat(x, c0); c1 = Conv(Relu(BatchNormalization(cat1)));
    y = Concat(x, c0, c1). cat1 is a prefix of y's buffer, read in place by the fused step."""
    rng = np.random.default_rng(seed)
    wide = channels + growth
    params = {f"bn_{k}": v for k, v in batchnorm_params(rng, wide).items()}
    inits = {"w0": rng.standard_normal((growth, channels, 1, 1)).astype(np.float32) / np.sqrt(channels),
             "w1": rng.standard_normal((growth, wide, 1, 1)).astype(np.float32) / np.sqrt(wide)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0"),
             helper.make_node("Concat", ["x", "c0"], ["cat1"], name="cat1", axis=1),
             helper.make_node("BatchNormalization", ["cat1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["normed"], name="bn"),
             helper.make_node("Relu", ["normed"], ["activated"], name="relu"),
             helper.make_node("Conv", ["activated", "w1"], ["c1"], name="conv1"),
             helper.make_node("Concat", ["x", "c0", "c1"], ["y"], name="cat2", axis=1)]
    return _model(nodes, params | inits, channels, growth, size, ["y"], False)
