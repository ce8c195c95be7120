"""The graph's static shapes at two probe batches, from onnx's shape inference on the graph without
its weights (bare.py): a shape the same at both does not depend on the batch, one that differs
follows it. Shape folding and the linear BatchNormalization fold read them."""
from __future__ import annotations

from onnx import shape_inference

from .bare import skeleton
from .ir import Graph

Shapes = dict[str, tuple[int, ...]]

# The batches the graph's shapes are inferred at: one small and one large, so that neither a clamp
# nor an integer division of the batch is mistaken for a constant.
PROBE_BATCHES = (2, 1009)


def probe_shapes(graph: Graph) -> tuple[Shapes, Shapes]:
    """Static shapes at each of the PROBE_BATCHES (inferred once when no input's batch is free)."""
    free = any(not i.type.tensor_type.shape.dim[:1] or not i.type.tensor_type.shape.dim[0].HasField("dim_value")
               for i in graph.proto.graph.input if i.name in graph.inputs)
    if not free:
        shapes = static_shapes(graph, PROBE_BATCHES[0])
        return shapes, shapes
    return static_shapes(graph, PROBE_BATCHES[0]), static_shapes(graph, PROBE_BATCHES[1])


def static_shapes(graph: Graph, batch: int) -> Shapes:
    """Tensors whose every dimension is a known number, from onnx's shape inference with
    `batch` as the first axis of the graph inputs that leave it free."""
    graph.write_nodes()
    try:
        inferred = shape_inference.infer_shapes(skeleton(graph.proto, graph.constants, batch), data_prop=True)
    except Exception:  # no shapes: Shape nodes simply stay
        return {}
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes
