"""GELU written out as its arithmetic, rewritten at load time into one Gelu node.

ONNX has Gelu only from opset 20, so exporters for older opsets write the erf form as

    e = Erf(Div(x, sqrt(2)))     or Erf(Mul(x, 1/sqrt(2)))
    p = Add(e, 1)
    y = x * 0.5 * p               two Muls, in any association: Mul(Mul(p, 0.5), x),
                                  Mul(Mul(x, p), 0.5) or Mul(Mul(x, 0.5), p)

One node is what the pointwise compiler and the Conv/Gemm epilogues take as an activation
(ops/activation.py's "Gelu"), where five nodes would be four steps or a group of their own.
The node writes the pattern's last tensor, so `check` still compares it with the original
graph's. From opset 20 it is ONNX's Gelu; before, a Gelu of the "opplugin" domain: a
model-local function whose body is the arithmetic above, so onnx's shape inference and
onnxruntime still run it as the original graph does.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from ..functions import OPPLUGIN_DOMAIN, declare, default_opset, is_declared
from ..ir import Graph

FUNCTION_NAME = "Gelu"
COUNT_KEY = "decomposed Gelu"  # the summary reads "18 decomposed Gelu folded"
GELU_SINCE = 20  # the opset that has ONNX's own Gelu


def fold_decomposed_gelus(graph: Graph) -> dict[str, int]:
    """Rewrite every decomposed erf-form GELU into one node; {COUNT_KEY: how many} when any, else {}."""
    count = 0
    for node in list(graph.nodes):
        if node in graph.nodes and node.op_type == "Erf" and node.domain in ("", "ai.onnx"):
            match = _match(graph, node)
            if match is not None:
                _rewrite(graph, *match)
                count += 1
    return {COUNT_KEY: count} if count else {}


def _constant_is(graph: Graph, name: str, value: float) -> bool:
    constant = graph.constant(name)
    return constant is not None and np.size(constant) == 1 and np.issubdtype(np.asarray(constant).dtype, np.floating) \
        and math.isclose(float(np.asarray(constant).reshape(-1)[0]), value, rel_tol=1e-6)


def _only_binary_reader(graph: Graph, name: str, op_type: str) -> onnx.NodeProto | None:
    """The ONNX `op_type` node that alone reads `name`, with two inputs (_other picks the second); else None."""
    reader = graph.only_reader(name, op_type)
    return reader if reader is not None and len(reader.input) == 2 else None


def _other(node: onnx.NodeProto, name: str) -> str:
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(graph: Graph, erf: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str] | None:
    """(the pattern's nodes, x) for the GELU around `erf`, or None."""
    scaled = graph.writer(erf.input[0])
    if scaled is None or len(scaled.input) != 2 or graph.only_reader(scaled.output[0]) is None:
        return None
    if scaled.op_type == "Div" and _constant_is(graph, scaled.input[1], math.sqrt(2)):
        x = scaled.input[0]
    elif scaled.op_type == "Mul" and any(_constant_is(graph, i, 1 / math.sqrt(2)) for i in scaled.input):
        x = _other(scaled, next(i for i in scaled.input if _constant_is(graph, i, 1 / math.sqrt(2))))
    else:
        return None
    if graph.constant(x) is not None:
        return None
    plus = _only_binary_reader(graph, erf.output[0], "Add")
    if plus is None or not _constant_is(graph, _other(plus, erf.output[0]), 1.0):
        return None
    first = _only_binary_reader(graph, plus.output[0], "Mul")
    if first is None:
        return None
    nodes = [scaled, erf, plus, first]
    factor = _other(first, plus.output[0])
    if _constant_is(graph, factor, 0.5) or factor == x:  # (p * 0.5) * x or (p * x) * 0.5
        second = _only_binary_reader(graph, first.output[0], "Mul")
        wanted = x if factor != x else None
        if second is None or not (_other(second, first.output[0]) == wanted if wanted else
                                  _constant_is(graph, _other(second, first.output[0]), 0.5)):
            return None
        return [*nodes, second], x
    half = graph.writer(factor)  # (x * 0.5) * p
    if half is None or half.op_type != "Mul" or len(half.input) != 2 or graph.only_reader(factor) is not first:
        return None
    if not (x in half.input and _constant_is(graph, _other(half, x), 0.5)):
        return None
    return [half, *nodes], x


def _rewrite(graph: Graph, nodes: list[onnx.NodeProto], x: str) -> None:
    output = nodes[-1].output[0]
    erf = next(n for n in nodes if n.op_type == "Erf")
    if graph.opset >= GELU_SINCE:
        gelu = helper.make_node("Gelu", [x], [output], name=erf.name)
    else:
        gelu = helper.make_node(FUNCTION_NAME, [x], [output], name=erf.name, domain=OPPLUGIN_DOMAIN)
        _declare_function(graph.proto)
    graph.nodes[graph.nodes.index(nodes[-1])] = gelu
    for gone in nodes[:-1]:
        graph.nodes.remove(gone)


def _declare_function(proto: onnx.ModelProto) -> None:
    """Add the opplugin Gelu function (erf form, for the model's opset) and its domain, once."""
    if is_declared(proto, FUNCTION_NAME):
        return

    def constant(name: str, value: float) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, onnx.TensorProto.FLOAT, [], [value]))

    body = [constant("root2", math.sqrt(2)), constant("one", 1.0), constant("half", 0.5),
            helper.make_node("Div", ["X", "root2"], ["scaled"]), helper.make_node("Erf", ["scaled"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["X", "half"], ["h"]),
            helper.make_node("Mul", ["h", "p"], ["Y"])]
    declare(proto, helper.make_function(OPPLUGIN_DOMAIN, FUNCTION_NAME, ["X"], ["Y"], body,
                                        [helper.make_opsetid("", default_opset(proto))]))
