"""One Conv and the nodes after it, for the residual-epilogue tests: x [N, C, S, S] and a
residual operand r [N, M, S, S] are graph inputs; the Conv (pad 1) writes "c"."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish
from opplugin.ops.activation import GELU, SILU, Activation

CHANNELS, MAPS, SIZE = 3, 4, 8


def conv_then(followers: list[onnx.NodeProto], outputs: list[str], bias: bool = True, constants: dict | None = None,
              seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((MAPS, CHANNELS, 3, 3)).astype(np.float32) * 0.3}
    if bias:
        inits["b"] = rng.standard_normal(MAPS).astype(np.float32) * 0.1
    inits.update(constants or {})
    conv = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], name="conv", pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv, *followers], "conv_then",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CHANNELS, SIZE, SIZE]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", MAPS, SIZE, SIZE])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", f"{name}_maps", f"{name}_h", f"{name}_w"]) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    return finish(graph)


def activation_nodes(activation: Activation, source: str, out: str) -> tuple[list[onnx.NodeProto], dict]:
    """The node(s) computing `activation` of `source` into `out`, and the constants they read."""
    if activation.op == SILU:
        return [helper.make_node("Sigmoid", [source], ["sig"], name="sigmoid"),
                helper.make_node("Mul", ["sig", source], [out], name="mul")], {}
    if activation.op == "Clip":
        return [helper.make_node("Clip", [source, "lo", "hi"], [out], name="clip")], {"lo": activation.a, "hi": activation.b}
    if activation.op == GELU:  # written out, as exporters before opset 20 do: loading makes it one node
        return [helper.make_node("Div", [source, "root2"], ["scaled"], name="div"), helper.make_node("Erf", ["scaled"], ["e"], name="erf"),
                helper.make_node("Add", ["e", "one"], ["p"], name="add1"), helper.make_node("Mul", [source, "p"], ["xp"], name="mul"),
                helper.make_node("Mul", ["xp", "half"], [out], name="half")], {"root2": np.sqrt(2), "one": 1.0, "half": 0.5}
    attributes = {}
    if activation.op in ("LeakyRelu", "HardSigmoid") and activation != Activation.plain(activation.op):
        attributes = {"alpha": activation.a} | ({"beta": activation.b} if activation.op != "LeakyRelu" else {})
    return [helper.make_node(activation.op, [source], [out], name="act", **attributes)], {}


def residual_model(activation: Activation | None, pool: int | None = None, bias: bool = True, conv_first: bool = True):
    """Conv > Add(c, r) (or Add(r, c)) > activation > MaxPool(pool), the last writing "y"."""
    add_out = "s" if activation or pool else "y"
    nodes = [helper.make_node("Add", ["c", "r"] if conv_first else ["r", "c"], [add_out], name="add")]
    constants = {}
    act_out = add_out
    if activation:
        act_out = "a" if pool else "y"
        more, constants = activation_nodes(activation, add_out, act_out)
        nodes += more
    if pool:
        nodes.append(helper.make_node("MaxPool", [act_out], ["y"], name="pool", kernel_shape=[pool, pool], strides=[pool, pool]))
    return conv_then(nodes, ["y"], bias, constants)
