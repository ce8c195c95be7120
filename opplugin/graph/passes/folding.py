"""What constant folding and shape folding share: which nodes may become constants, and their count."""
from __future__ import annotations

import onnx

from ..ir import DEFAULT_DOMAINS, Graph

# Ops whose value is not a function of their inputs, and ops with subgraphs: never folded.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
                "If", "Loop", "Scan", "SequenceMap"}


def foldable(graph: Graph, node: onnx.NodeProto) -> bool:
    if node.domain not in DEFAULT_DOMAINS or node.op_type in NOT_FOLDABLE:
        return False
    return not any(o in graph.outputs for o in node.output)  # a graph output stays the output of a node


def count(counts: dict[str, int], op: str) -> None:
    counts[op] = counts.get(op, 0) + 1


def fold(graph: Graph, node: onnx.NodeProto, values: list, folded: dict[str, int]) -> None:
    """`node` gone, its outputs constants of `values` (in its output order), and counted."""
    graph.nodes.remove(node)
    for name, value in zip(node.output, values):
        if name:
            graph.constants[name] = value
    count(folded, node.op_type)
