"""Shape inference through nodes onnx does not know: onnx infers what it can, a custom op's
declaration (registry.Declaration) gives its nodes' outputs, and onnx goes on from them.

onnx's inference leaves the outputs of an unknown op, and everything after them, without a
shape; given a value_info for those outputs it reads them as facts. So each round declares
the outputs of every custom node whose inputs are known, and infers again, until a round
adds nothing (a model with custom nodes one after another takes a round each)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, shape_inference

from .attributes import attributes
from ..registry import STANDARD_DOMAINS, Declaration, NodeInfo, TensorInfo, node_key, node_name

Lookup = Callable[[str], "Declaration | None"]


def custom_nodes(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes of a domain outside ONNX's that call no function of the model: what onnx cannot infer."""
    functions = {(f.domain, f.name) for f in proto.functions}
    return [n for n in proto.graph.node if n.domain not in STANDARD_DOMAINS and (n.domain, n.op_type) not in functions]


def infer(proto: onnx.ModelProto, lookup: Lookup) -> onnx.ModelProto:
    """`proto` with every shape onnx and the declarations of its custom nodes can give
    (onnx's infer_shapes, strict, with data propagation)."""
    inferred = shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    pending = custom_nodes(proto)
    declared: list[onnx.ValueInfoProto] = []
    while pending:
        known = _known_types(inferred)
        ready = [n for n in pending if all(not i or i in known for i in n.input)]
        values = [v for n in ready for v in _declared_outputs(n, lookup, known)]
        pending = [n for n in pending if n not in ready]
        if not values:
            break
        declared += values
        with_values = onnx.ModelProto()
        with_values.CopyFrom(proto)
        with_values.graph.value_info.extend(declared)
        inferred = shape_inference.infer_shapes(with_values, strict_mode=True, data_prop=True)
    return inferred


def _known_types(proto: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Tensors whose shape is known in full: name -> (shape, dtype)."""
    graph = proto.graph
    known = {t.name: (tuple(t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))) for t in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape") or not tensor.elem_type:
            continue
        if all(d.HasField("dim_value") for d in tensor.shape.dim):
            known[value.name] = (tuple(d.dim_value for d in tensor.shape.dim), np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    return known


def _declared_outputs(node: onnx.NodeProto, lookup: Lookup, known) -> list[onnx.ValueInfoProto]:
    """The value_infos of the node's outputs from its declaration ([] where it has none)."""
    declaration = lookup(node_key(node))
    if declaration is None:
        return []
    name = node_name(node)
    declaration.check_arity(name, sum(1 for i in node.input if i), len(node.output))
    settings = declaration.node_attributes(NodeInfo(node, [], [], attributes(node)))
    types = declaration.output_types(name, [TensorInfo(i, *known[i]) for i in node.input if i], settings)
    return [helper.make_tensor_value_info(output, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))
            for output, t in zip(node.output, types) if output]

