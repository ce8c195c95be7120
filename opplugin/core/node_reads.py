"""The tensors a node reads: its inputs, and the tensors of enclosing graphs that the graphs of
its attributes read by name (an If's branches, a Loop's or Scan's body, at any depth). ONNX lets
a subgraph read any tensor of an outer scope without listing it, so whoever cuts a graph into
pieces, drops what nobody reads or renames a tensor must count these reads too."""
from __future__ import annotations

import onnx

_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs among `node`'s attributes (none for most nodes)."""
    found: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            found.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            found.extend(attribute.graphs)
    return found


def has_subgraphs(node: onnx.NodeProto) -> bool:
    return any(attribute.type in _GRAPH_KINDS for attribute in node.attribute)


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """The names `graph` (its nodes, and their own subgraphs) reads but does not define itself, in
    order of first use: tensors of the enclosing graphs."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    defined |= {o for n in graph.node for o in n.output if o}
    return list(dict.fromkeys(name for node in graph.node for name in reads(node) if name not in defined))


def reads(node: onnx.NodeProto) -> list[str]:
    """What `node` reads, each name once: its inputs (but the omitted ones), then what its subgraphs
    read of the enclosing graphs."""
    names = [i for i in node.input if i]
    if has_subgraphs(node):
        names += [name for graph in subgraphs(node) for name in outer_reads(graph)]
    return list(dict.fromkeys(names))


def rename_reads(node: onnx.NodeProto, old: str, new: str) -> None:
    """`node` and its subgraphs read `new` where they read `old` of an enclosing graph."""
    for index, name in enumerate(node.input):
        if name == old:
            node.input[index] = new
    for graph in subgraphs(node):
        if old in outer_reads(graph):  # a subgraph that defines `old` itself keeps its own
            for inner in graph.node:
                rename_reads(inner, old, new)
