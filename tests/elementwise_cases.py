"""Elementwise nodes built in memory for the elementwise plugin's tests (CPU and GPU)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish

SHAPE = ["N", 6, 5, 7]
# (op type, attributes, constant extra inputs) of every activation of the shared table, with parameters
ACTIVATIONS = [("Relu", {}, ()), ("Tanh", {}, ()), ("Sigmoid", {}, ()), ("LeakyRelu", {"alpha": 0.2}, ()), ("Clip", {}, (0.0, 6.0)),
               ("Clip", {}, (-1.0,)), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ()), ("HardSwish", {}, ())]
# how the second operand is given: a graph input of the same shape, or a constant of this shape
OPERANDS = {"same": None, "channel": (6, 1, 1), "channel4d": (1, 6, 1, 1), "scalar": (), "row": (7,)}


def unary_model(op: str, attributes: dict, extra=()) -> onnx.ModelProto:
    """x -> op -> y."""
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), f"e{i}") for i, v in enumerate(extra)]
    node = helper.make_node(op, ["x", *(t.name for t in inits)], ["y"], name="act", **attributes)
    graph = helper.make_graph([node], "unary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], initializer=inits)
    return finish(graph)


def binary_model(op: str, operand: str, then=None, constant_first: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x (op) b -> y, then the activation `then` ((op type, attributes, extra)) when given; b is the
    graph input "b" (operand "same") or a constant of OPERANDS[operand]'s shape."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)]
    inits = []
    if OPERANDS[operand] is None:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, SHAPE))
    else:
        value = np.random.default_rng(seed).uniform(0.5, 1.5, OPERANDS[operand]).astype(np.float32)
        inits.append(numpy_helper.from_array(value, "b"))
    operands = ["b", "x"] if constant_first else ["x", "b"]
    nodes = [helper.make_node(op, operands, ["s"], name="binary")]
    if then:
        then_op, attributes, extra = then
        inits += [numpy_helper.from_array(np.asarray(v, np.float32), f"e{i}") for i, v in enumerate(extra)]
        nodes.append(helper.make_node(then_op, ["s", *(f"e{i}" for i in range(len(extra)))], ["y"], name="then", **attributes))
    else:
        nodes[0].output[0] = "y"
    graph = helper.make_graph(nodes, "binary", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], initializer=inits)
    return finish(graph)


def feeds(model: onnx.ModelProto, batch: int, seed: int, poison: bool = False) -> dict[str, np.ndarray]:
    """Fresh random values for the graph inputs; with `poison`, NaN, +inf and -inf at a few places."""
    rng = np.random.default_rng(seed)
    out = {}
    for value in model.graph.input:
        x = rng.uniform(-3, 3, (batch, 6, 5, 7)).astype(np.float32)
        if poison:
            x[0, 0, 0, :3] = (np.nan, np.inf, -np.inf)
            x[-1, 5, 4, 6] = np.nan
        out[value.name] = x
    return out
