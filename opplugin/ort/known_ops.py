"""Which ops onnxruntime runs: ONNX's own and onnxruntime's contrib domains (com.microsoft and
the like), from the schemas the installed build registers, and a model's own functions, which it
inlines. A node of any other domain needs a declaration (custom/)."""
from __future__ import annotations

import functools

import onnx


@functools.cache
def _contrib_ops() -> frozenset[tuple[str, str]]:
    """(domain, op type) of every op the installed onnxruntime build registers a schema for."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        return frozenset((schema.domain, schema.name) for schema in state.get_all_operator_schema())
    except Exception:  # a build without the schema list: ONNX's own ops only
        return frozenset()


def runs(node: onnx.NodeProto, functions: frozenset[tuple[str, str]] = frozenset()) -> bool:
    """Whether onnxruntime can run `node`, given the (domain, name) of the model's functions."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    if (node.domain, node.op_type) in functions:
        return True
    if domain == "" and onnx.defs.has(node.op_type):
        return True
    return (domain, node.op_type) in _contrib_ops()


def first_unknown(node: onnx.NodeProto, functions: frozenset[tuple[str, str]] = frozenset()) -> onnx.NodeProto | None:
    """The first node, `node` itself or one in the graphs of its attributes (an If's branches, a
    Loop's body), that onnxruntime cannot run; None where it runs them all."""
    if not runs(node, functions):
        return node
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            found = next((bad for inner in graph.node if (bad := first_unknown(inner, functions)) is not None), None)
            if found is not None:
                return found
    return None
