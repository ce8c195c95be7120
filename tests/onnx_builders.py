"""Small ONNX models built in memory for the tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="opplugin-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_cnn(seed: int = 0, channels: int = 3, size: int = 12, maps: int = 4, group: int = 1) -> onnx.ModelProto:
    """Conv > Relu > MaxPool > Conv(group) > Relu > Flatten > Gemm > Softmax, batch axis "N"."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((maps, channels, 3, 3)).astype(np.float32) * 0.3
    b1 = rng.standard_normal(maps).astype(np.float32) * 0.1
    w2 = rng.standard_normal((maps, maps // group, 3, 3)).astype(np.float32) * 0.3
    pooled = size // 2
    out2 = pooled - 2
    gemm_w = rng.standard_normal((maps * out2 * out2, 5)).astype(np.float32) * 0.1
    gemm_b = np.zeros(5, np.float32) + 0.01
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2", group=group),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        initializer=[
            numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (gemm_w, "gw"), (gemm_b, "gb")]
        ],
    )
    return finish(graph)


def single_conv(x_shape, w_shape, attributes: dict, bias: bool, weights_as_input: bool = False) -> onnx.ModelProto:
    """One Conv node; weights as initializers, or as graph inputs when weights_as_input."""
    inputs = ["x", "w"] + (["b"] if bias else [])
    node = helper.make_node("Conv", inputs, ["y"], name="conv", **attributes)
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    initializers = []
    if weights_as_input:
        graph_inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w_shape)))
        if bias:
            graph_inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [w_shape[0]]))
    else:
        rng = np.random.default_rng(1)
        initializers.append(numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w"))
        if bias:
            initializers.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
    graph = helper.make_graph(
        [node], "single_conv", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"y{i}" for i in range(len(x_shape))])],
        initializer=initializers,
    )
    return finish(graph)


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def conv_spec(n, c, m, size, kernel, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), bias=True, group=1):
    """A 2-D ConvSpec written the way the kernel tests think of it."""
    from opplugin.ops.conv.spec import ConvSpec

    return ConvSpec(n, c, m, size, kernel, strides, dilations, pads, group, bias)


def conv_model(x_shape, w: np.ndarray, b: np.ndarray | None, attributes: dict, batch_axis: str = "N") -> onnx.ModelProto:
    """One Conv with these weights (and bias) as initializers, as a real model carries
    them, and a symbolic batch axis, so a Runner may split the batch into chunks."""
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    node = helper.make_node("Conv", inputs, ["y"], name="conv", **attributes)
    initializers = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    graph = helper.make_graph(
        [node],
        "conv_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_axis, *x_shape[1:]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_axis, w.shape[0], *[None] * (len(x_shape) - 2)])],
        initializer=initializers,
    )
    return finish(graph)


def long_named_chain(name_length: int = 200, relus: int = 200, pairs: int = 100) -> onnx.ModelProto:
    """Conv > Relu x`relus` > (Neg > Abs) x`pairs` > Conv, every node and tensor named with
    about `name_length` characters: a network whose names and op chains outgrow a terminal."""
    rng = np.random.default_rng(2)
    stem = "features_denseblock_denselayer_" * (name_length // 31 + 1)

    def name(kind: str, index: int) -> str:
        return f"{kind}_{stem[:name_length]}_{index}"

    ops = ["Relu"] * relus + ["Neg", "Abs"] * pairs
    tensors = [name("tensor", i) for i in range(len(ops) + 2)]
    nodes = [helper.make_node("Conv", ["x", "w1"], [tensors[0]], name=name("conv_first", 0), pads=[1, 1, 1, 1])]
    nodes += [helper.make_node(op, [tensors[i]], [tensors[i + 1]], name=name(op.lower(), i)) for i, op in enumerate(ops)]
    nodes.append(helper.make_node("Conv", [tensors[-2], "w2"], ["y"], name=name("conv_last", 1), pads=[1, 1, 1, 1]))
    graph = helper.make_graph(
        nodes,
        "long_named_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
        initializer=[numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
                     numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "w2")],
    )
    return finish(graph)
