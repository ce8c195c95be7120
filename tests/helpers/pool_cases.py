"""Pooling nodes and small pooling CNNs built in memory, for the pool tests (CPU and GPU)."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish
from opplugin.registry import NodeInfo, TensorInfo

# AveragePool takes dilations from opset 19 (onnx's shape inference drops a ceil_mode window that starts in the end pads only from 22)
POOL_OPSET = 19
WINDOW_OPS = ("MaxPool", "AveragePool")


@st.composite
def window_pools(draw):
    """(op, x shape, attributes): any kernel up to 4, strides up to 3, asymmetric pads below the
    kernel, dilations, ceil_mode, count_include_pad, odd sizes."""
    op = draw(st.sampled_from(WINDOW_OPS))
    kernel = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    attributes = {"kernel_shape": kernel, "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
                  "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 2))], "ceil_mode": int(draw(st.booleans()))}
    if draw(st.booleans()):
        attributes["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        attributes["pads"] = [draw(st.integers(0, kernel[i % 2] - 1)) for i in range(4)]
    if op == "AveragePool":
        attributes["count_include_pad"] = int(draw(st.booleans()))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, attributes["dilations"])]
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(span[0], 13)), draw(st.integers(span[1], 13)))
    return op, shape, attributes


def pool_model(op: str, x_shape, attributes: dict, opset: int = POOL_OPSET, indices: bool = False) -> onnx.ModelProto:
    """One pooling node, x -> y (and the Indices output when asked)."""
    outputs = ["y", "indices"] if indices else ["y"]
    node = helper.make_node(op, ["x"], outputs, name="pool", **attributes)
    dims = ["yn", "yc", "yh", "yw"]  # left to shape inference
    graph_outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)]
    if indices:
        graph_outputs.append(helper.make_tensor_value_info("indices", TensorProto.INT64, dims))
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))], graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def node_info(op: str, x_shape, attributes: dict) -> NodeInfo:
    """The NodeInfo a plan would give the plugin (output shape left empty: PoolSpec computes it)."""
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attributes)
    return NodeInfo(node, [TensorInfo("x", tuple(x_shape), np.dtype(np.float32))], [TensorInfo("y", (), np.dtype(np.float32))],
                    dict(attributes))


def pool_cnn(seed: int = 0, size: int = 15) -> onnx.ModelProto:
    """Conv > Relu > MaxPool 3x3 s2 p1 (the ResNet stem's) > AveragePool 3x3 p1 (pads not counted)
    > Conv 1x1 > Relu > GlobalAveragePool > Flatten > Gemm = y, and GlobalMaxPool of the second Conv = g."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
               "w2": rng.standard_normal((6, 8, 1, 1)) * 0.3, "gw": rng.standard_normal((6, 4)) * 0.3, "gb": np.full(4, 0.01)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["p1"], ["a1"], name="avgpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], name="conv2"),
        helper.make_node("GlobalMaxPool", ["c2"], ["g"], name="globalmax"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="globalavg"),
        helper.make_node("Flatten", ["gap"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "pool_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]), helper.make_tensor_value_info("g", TensorProto.FLOAT, ["N", 6, 1, 1])],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
    )
    return finish(graph)
