"""Constant subgraphs (Constant, ConstantOfShape, arithmetic on initializers) evaluated by
onnxruntime into constants, alternating with shape folding (shape_folding.py), until a round
folds nothing more: a shape that folds makes more nodes constant, and those may feed more shapes."""
from __future__ import annotations

import onnx

from ..evaluate import evaluate
from ..ir import Graph
from ..static_shapes import probe_shapes
from .folding import fold, foldable
from .shape_folding import SHAPE_OF, fold_shape_arithmetic


def fold_constants(graph: Graph) -> dict[str, int]:
    """Evaluate every node whose inputs are all constant, and the shape arithmetic over Shape and
    Size of tensors whose shapes are static but for the batch, into constants, until a round
    folds nothing more; op type -> how many nodes went."""
    folded: dict[str, int] = {}
    while True:
        before = sum(folded.values())
        has_shapes = any(n.op_type in SHAPE_OF for n in graph.nodes)
        probes = probe_shapes(graph) if has_shapes else ({}, {})
        _fold_constant_nodes(graph, folded)
        if has_shapes:
            fold_shape_arithmetic(graph, *probes, folded)
        if sum(folded.values()) == before:
            return folded


def _fold_constant_nodes(graph: Graph, folded: dict[str, int]) -> None:
    """Every node whose inputs are constants (or outputs of such nodes before it), evaluated at once."""
    known = set(graph.constants)
    batch: list[onnx.NodeProto] = []
    for node in list(graph.nodes):
        if foldable(graph, node) and all(name in known for name in node.input if name):  # a Shape of a constant too
            batch.append(node)
            known.update(o for o in node.output if o)
    values = evaluate(graph, batch) if batch else {}
    for node in batch:
        if all(o in values for o in node.output if o):
            fold(graph, node, [values.get(o) for o in node.output], folded)
