"""Nodes over constants evaluated by onnxruntime, the engine the reference runs, so that what a
pass folds into a constant is the value the original graph computes. (onnx's ReferenceEvaluator
fails on opset-9 Unsqueeze, which DenseNet and Inception exports use.)"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .ir import Graph


def evaluate(graph: Graph, nodes: list[onnx.NodeProto], extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The outputs of `nodes`, whose inputs are the graph's constants, `extra` or each other's outputs.
    Nodes onnxruntime cannot run as a group are tried one by one; those that still fail are left
    out of the answer (and so stay in the graph)."""
    values = _run(graph, nodes, extra)
    if values is not None or len(nodes) == 1:
        return values or {}
    values = dict(extra or {})
    for node in nodes:
        if all(name in graph.constants or name in values for name in node.input if name):
            values.update(_run(graph, [node], values) or {})
    return values


def _run(graph: Graph, nodes: list[onnx.NodeProto], extra: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
    from ..ort.sessions import session  # onnxruntime only when a graph has something to fold

    available = {**graph.constants, **(extra or {})}
    produced = {o for n in nodes for o in n.output if o}
    read = dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced)
    outputs = [o for n in nodes for o in n.output if o]
    constants = helper.make_graph(nodes, "constants", [], [helper.make_empty_tensor_value_info(o) for o in outputs],
                                  initializer=[numpy_helper.from_array(np.asarray(available[i]), i) for i in read])
    model = helper.make_model(constants, opset_imports=list(graph.proto.opset_import))
    model.ir_version = max(graph.proto.ir_version, 4)
    try:
        results = session(model, arena=False).run(outputs, {})
    except Exception:  # an op onnxruntime cannot run on its own: it stays in the graph
        return None
    if not all(isinstance(r, np.ndarray) for r in results):  # sequences and maps stay too
        return None
    return dict(zip(outputs, results))
