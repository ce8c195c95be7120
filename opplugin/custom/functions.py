"""A custom op that declares a function of the model (an ONNX FunctionProto, as torch's dynamo
exporter writes them): its calls run as one node on the op's kernels, and what the declaration
leaves out the function gives: its inputs, outputs and attributes, and its body as the reference
(evaluated by onnx's ReferenceEvaluator, in float64 where the body's ops keep it)."""
from __future__ import annotations

import copy
from typing import Any, Sequence

import onnx

from ..graph.float64_nodes import node_in_float64
from .declaration import CustomOp


def with_function_references(ops: Sequence[CustomOp], proto: onnx.ModelProto) -> list[CustomOp]:
    """`ops`, each one that declares a function of `proto` completed from it (a copy; the others as they are)."""
    functions = {(f.domain, f.name): f for f in proto.functions}
    completed = []
    for op in ops:
        function = functions.get((op.domain, op.name))
        completed.append(op if function is None else _from_function(op, function))
    return completed


def function_ids(ops: Sequence[CustomOp]) -> frozenset[tuple[str, str]]:
    """(domain, name) of the function each op may declare: what loading keeps whole."""
    return frozenset((op.domain, op.name) for op in ops)


def _from_function(op: CustomOp, function: onnx.FunctionProto) -> CustomOp:
    twin = copy.copy(op)
    if not twin.input_names:
        twin.input_names, twin.required_inputs = list(function.input), len(function.input)
    if not twin.output_names:
        twin.output_names = list(function.output)
    if not twin.attributes:
        twin.attributes = {name: None for name in function.attribute}
        twin.attributes.update({a.name: onnx.helper.get_attribute_value(a) for a in function.attribute_proto})
    if twin.reference_function is None:
        twin.reference_function = body_reference(function)
    return twin


def body_reference(function: onnx.FunctionProto):
    """The function's body as a reference: (*inputs, **attributes) -> its outputs."""
    from onnx.reference import ReferenceEvaluator

    in_float64 = onnx.FunctionProto()
    in_float64.CopyFrom(function)
    del in_float64.node[:]
    in_float64.node.extend(node_in_float64(node) for node in function.node)
    evaluator = ReferenceEvaluator(in_float64)

    def reference(*inputs: Any, **attributes: Any) -> list[Any]:
        feeds = {name: value for name, value in zip(function.input, inputs) if value is not None}
        given = {k: v for k, v in attributes.items() if v is not None}
        return evaluator.run(None, feeds, attributes=given)  # a function is run with its attributes, none or some

    reference.__name__ = f"{function.name}_body"
    return reference
