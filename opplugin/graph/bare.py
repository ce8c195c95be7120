"""A model without its weights, and the weights as arrays.

Shape inference and onnx's checker take a serialised model: handed a model with its
weights, each call copies them twice (to bytes and back), which on a VGG costs
seconds and gigabytes. They need only the graph, the small constants whose values
shapes depend on (a Reshape's target), and the type and shape of the large ones,
so a skeleton gives them that: large constants become typed graph inputs.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Constants with more elements than this are weights, not shape arithmetic.
SMALL_CONSTANT = 1024


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose graph has no initializers (its weights are not copied)."""
    bare = onnx.ModelProto()
    _copy_fields(model, bare, skip={"graph"})
    _copy_fields(model.graph, bare.graph, skip={"initializer"})
    return bare


def _copy_fields(source, target, skip: set[str]) -> None:
    for descriptor, value in source.ListFields():
        if descriptor.name in skip:
            continue
        field = getattr(target, descriptor.name)
        if descriptor.is_repeated:
            field.extend(value)
        elif descriptor.message_type is not None:
            field.CopyFrom(value)
        else:
            setattr(target, descriptor.name, value)


def with_initializers(bare: onnx.ModelProto, constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The whole model: `bare` with `constants` as its initializers (IR 3 lists them as inputs too)."""
    model = onnx.ModelProto()
    model.CopyFrom(bare)
    graph = model.graph
    for name, value in constants.items():
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    if model.ir_version < 4:
        listed = {i.name for i in graph.input}
        graph.input.extend(_typed(name, value) for name, value in constants.items() if name not in listed)
    return model


def skeleton(bare: onnx.ModelProto, constants: dict[str, np.ndarray], batch: int | None = None) -> onnx.ModelProto:
    """`bare` with its small constants as initializers and its large ones as typed graph inputs,
    for shape inference and the checker. With `batch`, graph inputs whose first axis is free get it."""
    graph = bare.graph
    small = {k: v for k, v in constants.items() if np.size(v) <= SMALL_CONSTANT}
    inputs = []
    for value in graph.input:
        if value.name in constants:  # IR 3 lists initializers among the inputs
            continue
        inputs.append(onnx.ValueInfoProto())
        inputs[-1].CopyFrom(value)
        dims = inputs[-1].type.tensor_type.shape.dim
        if batch is not None and dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = batch
    inputs += [_typed(name, value) for name, value in constants.items() if name not in small]
    probe = helper.make_model(
        helper.make_graph(list(graph.node), graph.name or "skeleton", inputs, list(graph.output),
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in small.items()]),
        opset_imports=list(bare.opset_import))
    probe.ir_version = max(bare.ir_version, 4)  # from IR 4 on, initializers need not be graph inputs
    probe.functions.extend(bare.functions)
    return probe


def _typed(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    value = np.asarray(value)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
