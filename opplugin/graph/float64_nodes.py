"""ONNX nodes rewritten to compute in float64: their float32 casts and tensor attributes made
float64, so that onnx's ReferenceEvaluator, whose ops are numpy, keeps float64 throughout (the
exact result verify/float64.py arbitrates with, a model function's body as a custom op's reference)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def up(value: np.ndarray) -> np.ndarray:
    value = np.asarray(value)
    return value.astype(np.float64) if value.dtype in (np.float16, np.float32) else value


def node_in_float64(node: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of `node` whose float32 casts and tensor attributes are float64 (a ConstantOfShape's default
    value, a float32 zero, too)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    if copy.op_type == "Constant":  # a float or floats given as such: float32 by ONNX's rule, a float64 tensor here
        for attribute in copy.attribute:
            if attribute.name in ("value_float", "value_floats"):
                value = np.asarray(attribute.f if attribute.name == "value_float" else list(attribute.floats), np.float64)
                attribute.CopyFrom(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
    if copy.op_type == "ConstantOfShape" and not any(a.name == "value" for a in copy.attribute):  # ONNX's default: a float32 zero
        copy.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float64))))
    for attribute in copy.attribute:
        if attribute.name == "to" and attribute.type == onnx.AttributeProto.INT and attribute.i in (TensorProto.FLOAT, TensorProto.FLOAT16):
            attribute.i = TensorProto.DOUBLE
        elif attribute.type == onnx.AttributeProto.TENSOR:
            attribute.t.CopyFrom(numpy_helper.from_array(up(numpy_helper.to_array(attribute.t)), attribute.t.name))
    return copy
