"""Reduction and normalisation nodes built in memory, with onnxruntime's results, for the CPU and GPU tests."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from opplugin.model import Model
from opplugin.plan import make_plan
from opplugin.device import CPU


def node_model(op: str, x_shape, attributes: dict | None = None, constants: dict | None = None, opset: int = 18,
               domain: str = "") -> onnx.ModelProto:
    """One `op` node reading x (batch axis "N") and the named constants, writing y."""
    constants = constants or {}
    inputs = ["x", *constants]
    node = helper.make_node(op, inputs, ["y"], name="node", domain=domain, **(attributes or {}))
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *x_shape[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items() if k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
    model.ir_version = 9
    return model


def reduce_model(op: str, x_shape, axes, keepdims: int = 1, opset: int = 18) -> onnx.ModelProto:
    if axes is None:
        return node_model(op, x_shape, {"keepdims": keepdims}, opset=opset)
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    if axes_as_input:
        return node_model(op, x_shape, {"keepdims": keepdims}, {"axes": np.asarray(axes, np.int64)}, opset)
    return node_model(op, x_shape, {"keepdims": keepdims, "axes": list(axes)}, opset=opset)


def affine_constants(rng, channels_shape) -> dict:
    return {"scale": (rng.uniform(0.5, 1.5, channels_shape)).astype(np.float32),
            "bias": rng.uniform(-0.5, 0.5, channels_shape).astype(np.float32)}


def fresh(shape, seed: int, spread: float = 2.0) -> np.ndarray:
    """Random float32 values (never zeros): uniform in +-spread around an offset, so a mean is not 0."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-spread, spread, shape) + 0.25).astype(np.float32)


def onnxruntime_output(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def planned(model: onnx.ModelProto, batch: int, device=CPU):
    """The plan of an in-memory model at `batch` (Model as load_model makes it, without a file)."""
    from opplugin.simplify import simplify

    simplified, done = simplify(model)
    return make_plan(Model(simplified, "test", original=model, simplification=done), batch, device)
