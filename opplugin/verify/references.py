"""The reference a check compares with: the model as loaded on onnxruntime's CPU provider, and
where it holds custom nodes (which onnxruntime cannot run), each of those run by its
declaration's float64 reference on the values onnxruntime computed up to it (ort.sessions.SplitReference)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx

from ..errors import ModelError
from ..graph.attributes import attributes as node_attributes
from ..graph.declared_shapes import custom_nodes
from ..ort.sessions import Reference, SplitReference
from ..registry import NodeInfo, TensorInfo, node_key, node_name


def reference_for(model, extra_outputs: Sequence[str] = (), *, views: dict[str, tuple] | None = None) -> Reference:
    """The reference of `model` (a Model, or a plan record's): onnxruntime alone, or split at its custom nodes."""
    foreign = {n.name for n in custom_nodes(model.original)}
    if not foreign:
        return Reference(model.original, extra_outputs, views=views)
    return SplitReference(model.original, foreign, lambda node, inputs: run_declared(model, node, inputs),
                          extra_outputs, views=views)


def float64_ops(model, nodes: Sequence[onnx.NodeProto]) -> list[type]:
    """onnx ReferenceEvaluator ops (OpRun classes) for the custom ops among `nodes`: each runs its
    declaration's reference and keeps its float64 result (float64.evaluate's `new_ops`)."""
    from onnx.reference.op_run import OpRun

    def run(self, *inputs, **_):
        return tuple(run_declared(model, self.onnx_node, list(inputs), exact=True))

    declared = {(n.domain, n.op_type) for n in custom_nodes(model.bare) if model.declaration(node_key(n)) is not None}
    return [type(op_type, (OpRun,), {"op_domain": domain, "_run": run})
            for domain, op_type in dict.fromkeys((n.domain, n.op_type) for n in nodes) if (domain, op_type) in declared]


def run_declared(model, node: onnx.NodeProto, inputs: list[Any], *, exact: bool = False) -> list[np.ndarray]:
    """A custom node's outputs from its declaration's float64 reference, in the dtypes it declares
    (in float64 where `exact`)."""
    declaration = model.declaration(node_key(node))
    if declaration is None:
        raise ModelError(f"{model.name}: node {node_name(node)} is {node.domain}::{node.op_type}, which no declaration runs")
    name = node_name(node)
    attributes = declaration.node_attributes(NodeInfo(node, [], [], node_attributes(node)))
    given = [TensorInfo(i, np.shape(v), np.asarray(v).dtype) for i, v in zip(node.input, inputs) if i]
    types = declaration.output_types(name, given, attributes)
    results = declaration.call_reference(name, inputs, attributes)
    if exact:
        return results
    return [np.ascontiguousarray(r, dtype=t.dtype) for r, t in zip(results, types)]
