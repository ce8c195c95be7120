"""A LayerNorm written out as its arithmetic, rewritten at load time into one LayerNormalization.

Exporters before opset 17, and models that normalise NCHW's channels by hand (ConvNeXt's
"channels first" LayerNorm), write

    mean = ReduceMean(X, axes)            keepdims=1
    d    = Sub(X, mean)
    var  = ReduceMean(Pow(d, 2) or Mul(d, d), axes)
    y    = Div(d, Sqrt(Add(var, epsilon)))
    y    = Mul(y, scale)      optional, a constant
    y    = Add(y, bias)       optional, a constant

which is one pass over each row in one kernel (ops/reduction) but seven or nine steps and six
tensors as written. The node that replaces it writes the pattern's last tensor, so `check`
still compares it with the original graph's.

- Axes that run to the last axis (written as negative numbers, -k..-1) with a scale and opset
  17 or later: ONNX's own LayerNormalization(axis=-k).
- Otherwise (a channel axis, positive axes whose rank is not known here, no scale, an older
  opset): LayerNormalization of the "opplugin" domain with attributes `axes` and `epsilon`, a
  model-local function whose body is the same arithmetic, so onnx's shape inference and
  onnxruntime still run it as the original graph.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, helper

from ..attributes import attribute
from ..functions import OPPLUGIN_DOMAIN, declare, default_opset, is_declared
from ..ir import Graph

FUNCTION_NAME = "LayerNormalization"
COUNT_KEY = "decomposed LayerNormalization"  # as the simplification's summary reads: "2 decomposed LayerNormalization folded"


def fold_decomposed_layernorms(graph: Graph) -> dict[str, int]:
    """Rewrite every decomposed LayerNorm into one node; {COUNT_KEY: how many} when any, else {}."""
    count = 0
    for node in list(graph.nodes):
        if node in graph.nodes and node.op_type == "ReduceMean" and node.domain in ("", "ai.onnx"):
            match = _Match.at(graph, node)
            if match is not None:
                match.rewrite(graph)
                count += 1
    return {COUNT_KEY: count} if count else {}



class _Match:
    """One decomposed LayerNorm found in the graph: its nodes in order, X, the axes, epsilon, scale and bias names."""

    def __init__(self, nodes, x, axes, epsilon, scale, bias):
        self.nodes, self.x, self.axes, self.epsilon, self.scale, self.bias = nodes, x, axes, epsilon, scale, bias

    @classmethod
    def at(cls, graph: Graph, mean: onnx.NodeProto) -> "_Match | None":
        axes = _reduce_axes(graph, mean)
        if axes is None:
            return None
        x = mean.input[0]
        sub = graph.only_reader(mean.output[0], "Sub")
        if sub is None or list(sub.input) != [x, mean.output[0]]:
            return None
        d = sub.output[0]
        readers = graph.readers(d)
        square = next((n for n in readers if n.op_type in ("Pow", "Mul")), None)
        div = next((n for n in readers if n.op_type == "Div"), None)
        if len(readers) != 2 or square is None or div is None or not _is_square(graph, square, d):
            return None
        variance = graph.only_reader(square.output[0], "ReduceMean")
        if variance is None or variance.input[0] != square.output[0] or _reduce_axes(graph, variance) != axes:
            return None
        add = graph.only_reader(variance.output[0], "Add")
        epsilon = _constant_operand(graph, add, variance.output[0]) if add is not None else None
        if epsilon is None or epsilon.size != 1:
            return None
        sqrt = graph.only_reader(add.output[0], "Sqrt")
        if sqrt is None or graph.only_reader(sqrt.output[0], "Div") is not div or list(div.input) != [d, sqrt.output[0]]:
            return None
        nodes = [mean, sub, square, variance, add, sqrt, div]
        scale = bias = None
        mul = graph.only_reader(div.output[0], "Mul")
        if mul is not None and _constant_operand(graph, mul, div.output[0]) is not None:
            scale = _other(mul, div.output[0])
            nodes.append(mul)
            plus = graph.only_reader(mul.output[0], "Add")
            if plus is not None and _constant_operand(graph, plus, mul.output[0]) is not None:
                bias = _other(plus, mul.output[0])
                nodes.append(plus)
        if any(o in graph.outputs for n in nodes[:-1] for o in n.output):
            return None  # an intermediate the graph gives out must stay
        return cls(nodes, x, axes, float(np.asarray(epsilon).reshape(-1)[0]), scale, bias)

    def rewrite(self, graph: Graph) -> None:
        output = self.nodes[-1].output[0]
        trailing = all(a < 0 for a in self.axes) and sorted(self.axes) == list(range(-len(self.axes), 0))
        # ONNX's LayerNormalization takes a scale and bias of at most the normalised rank
        fits = all(np.ndim(graph.constants[name]) <= len(self.axes) for name in (self.scale, self.bias) if name)
        if trailing and self.scale and graph.opset >= 17 and fits:
            inputs = [self.x, self.scale] + ([self.bias] if self.bias else [])
            node = helper.make_node("LayerNormalization", inputs, [output], name=self.nodes[0].name,
                                    axis=min(self.axes), epsilon=self.epsilon)
        else:
            scale = self.scale or _new_constant(graph, f"{output}_scale", np.ones(1, np.float32))
            bias = self.bias or _new_constant(graph, f"{output}_bias", np.zeros(1, np.float32))
            node = helper.make_node(FUNCTION_NAME, [self.x, scale, bias], [output], name=self.nodes[0].name,
                                    domain=OPPLUGIN_DOMAIN, axes=list(self.axes), epsilon=self.epsilon)
            declare_function(graph.proto)
        index = graph.nodes.index(self.nodes[-1])
        graph.nodes[index] = node
        for gone in self.nodes[:-1]:
            graph.nodes.remove(gone)


def _reduce_axes(graph: Graph, node: onnx.NodeProto) -> tuple[int, ...] | None:
    """A ReduceMean's axes when it keeps its dims and names them as constants, else None."""
    if node.op_type != "ReduceMean" or not attribute(node, "keepdims", 1):
        return None
    axes = attribute(node, "axes")
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in graph.constants:
            return None
        axes = np.asarray(graph.constants[node.input[1]]).reshape(-1).tolist()
    return tuple(int(a) for a in axes) if axes else None


def _is_square(graph: Graph, node: onnx.NodeProto, d: str) -> bool:
    if node.op_type == "Mul":
        return list(node.input) == [d, d]
    exponent = graph.constant(node.input[1]) if len(node.input) > 1 else None
    return node.input[0] == d and exponent is not None and np.asarray(exponent).size == 1 and float(np.asarray(exponent).reshape(-1)[0]) == 2.0


def _other(node: onnx.NodeProto, name: str) -> str:
    return node.input[1] if node.input[0] == name else node.input[0]


def _constant_operand(graph: Graph, node: onnx.NodeProto, name: str):
    """The constant that a two-input node combines with `name`, or None."""
    if len(node.input) != 2 or name not in node.input or node.input[0] == node.input[1]:
        return None
    return graph.constant(_other(node, name))


def _new_constant(graph: Graph, base: str, value: np.ndarray) -> str:
    name = graph.new_name(base)
    graph.constants[name] = value
    return name


def declare_function(proto: onnx.ModelProto) -> None:
    """Add the opplugin LayerNormalization function (for the model's opset) and its domain, once."""
    if is_declared(proto, FUNCTION_NAME):
        return
    opset = default_opset(proto)
    if opset >= 18:  # ReduceMean takes its axes as an input
        reduce_axes = [helper.make_node("Constant", [], ["axes"])]
        reduce_axes[0].attribute.append(helper.make_attribute_ref("value_ints", AttributeProto.INTS))
        reduce_axes[0].attribute[0].ref_attr_name = "axes"

        def mean(source, target):
            return helper.make_node("ReduceMean", [source, "axes"], [target], keepdims=1)
    else:
        reduce_axes = []

        def mean(source, target):
            node = helper.make_node("ReduceMean", [source], [target], keepdims=1)
            node.attribute.append(helper.make_attribute_ref("axes", AttributeProto.INTS))
            return node
    epsilon = helper.make_node("Constant", [], ["epsilon"])
    epsilon.attribute.append(helper.make_attribute_ref("value_float", AttributeProto.FLOAT))
    epsilon.attribute[0].ref_attr_name = "epsilon"
    body = [*reduce_axes, mean("X", "mean"), helper.make_node("Sub", ["X", "mean"], ["d"]), helper.make_node("Mul", ["d", "d"], ["square"]),
            mean("square", "variance"), epsilon, helper.make_node("Add", ["variance", "epsilon"], ["shifted"]),
            helper.make_node("Sqrt", ["shifted"], ["deviation"]), helper.make_node("Div", ["d", "deviation"], ["normalised"]),
            helper.make_node("Mul", ["normalised", "Scale"], ["scaled"]), helper.make_node("Add", ["scaled", "B"], ["Y"])]
    declare(proto, helper.make_function(OPPLUGIN_DOMAIN, FUNCTION_NAME, ["X", "Scale", "B"], ["Y"], body,
                                        [helper.make_opsetid("", opset)], attributes=["axes", "epsilon"]))
