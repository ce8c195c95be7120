"""Small models whose Concats join the channels between Convs and pools, built with onnx.helper, for the
half-precision links of Concats (plan/channel_last.py, ops/layout/channel_last.py): an Inception block in small
and a DenseNet block in small, with realistic weights (so that FP16 runs of them stay within its bounds)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish


class _Graph:
    """Nodes and weights of one graph with x [N, 3, size, size] in; each Conv's name is its output's."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self.inputs = [("x", 3)]

    def conv(self, source: str, channels: int, maps: int, output: str, kernel: int = 1, relu: bool = True) -> str:
        """Conv (a `kernel` square, same size out) > Relu, the Relu writing `output`."""
        self.weights[f"{output}_w"] = self.rng.standard_normal((maps, channels, kernel, kernel)) / np.sqrt(channels * kernel * kernel)
        self.weights[f"{output}_b"] = self.rng.standard_normal(maps) * 0.1
        conv = f"{output}_conv" if relu else output
        self.nodes.append(helper.make_node("Conv", [source, f"{output}_w", f"{output}_b"], [conv], name=output, pads=[kernel // 2] * 4))
        if relu:
            self.nodes.append(helper.make_node("Relu", [conv], [output], name=f"{output}_relu"))
        return output

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output

    def average_pool(self, source: str, output: str) -> str:
        """Inception's AveragePool 3x3 stride 1 pads 1, the pads counted."""
        return self.node("AveragePool", [source], output, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)

    def model(self, name: str, size: int, outputs: dict[str, int]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name,
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", c, size, size]) for n, c in self.inputs],
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", c, size, size]) for n, c in outputs.items()],
                                  [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in self.weights.items()])
        return finish(graph)


def inception_block(channels: int = 64, branch: int = 16, size: int = 12, output_concat: bool = False,
                    fp32_branch: bool = False) -> onnx.ModelProto:
    """stem (3 -> channels) > Relu (r0) > three branches: a 1x1 Conv (b1), a 1x1 Conv > 3x3 Conv (b2), an AveragePool
    3x3 s1 p1 > 1x1 Conv (b3), each `branch` maps (b2 1.5 times as many) > Concat (cat) > a second block alike (its
    Concat cat2) > a 1x1 Conv (y). `output_concat`: cat is a graph output too; `fp32_branch`: cat's fourth input
    is a graph input z (FP32, of `branch` channels)."""
    g = _Graph(7)
    g.conv("x", 3, channels, "r0", kernel=3)
    source, width = "r0", channels
    for block in ("", "2"):
        b1 = g.conv(source, width, branch, f"b1{block}")
        b2 = g.conv(g.conv(source, width, branch, f"b2a{block}"), branch, branch * 3 // 2, f"b2{block}", kernel=3)
        b3 = g.conv(g.average_pool(source, f"p{block}"), width, branch, f"b3{block}")
        joined = [b1, b2, b3]
        if fp32_branch and not block:
            g.inputs.append(("z", branch))
            joined.append("z")
        source = g.node("Concat", joined, f"cat{block}", axis=1)
        width = branch * len(joined) + branch // 2
    g.conv(source, width, 32, "y", relu=False)
    outputs = {"y": 32} | ({"cat": branch * 3 + branch // 2} if output_concat else {})
    return g.model("inception_block", size, outputs)


def dense_block(layers: int = 4, channels: int = 32, growth: int = 16, size: int = 10) -> onnx.ModelProto:
    """DenseNet's block in small, between Convs: stem (3 -> channels) > Relu (f0); layer i: Concat of f0 .. f(i-1)
    (cat(i)) > 3x3 Conv (growth maps) > Relu (f(i)); the Concat of them all (cat) > a 1x1 Conv (y). Every layer's
    output is an input of every later Concat."""
    g = _Graph(11)
    features = [g.conv("x", 3, channels, "f0", kernel=3)]
    for i in range(1, layers + 1):
        joined = g.node("Concat", list(features), f"cat{i}", axis=1)
        features.append(g.conv(joined, channels + (i - 1) * growth, growth, f"f{i}", kernel=3))
    cat = g.node("Concat", features, "cat", axis=1)
    g.conv(cat, channels + layers * growth, 32, "y", relu=False)
    return g.model("dense_block", size, {"y": 32})
