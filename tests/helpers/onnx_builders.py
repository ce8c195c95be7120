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


def long_named_chain(name_length: int = 200, softsigns: int = 199, pairs: int = 100) -> onnx.ModelProto:
    """Conv > Relu > Softsign x`softsigns` > (Sign > Ceil) x`pairs` > Conv, every node and tensor named with
    about `name_length` characters: a network whose names and op chains outgrow a terminal. The Conv
    fuses the Relu; no plugin claims the rest, so it is one onnxruntime step with a long chain."""
    rng = np.random.default_rng(2)
    stem = "features_denseblock_denselayer_" * (name_length // 31 + 1)

    def name(kind: str, index: int) -> str:
        return f"{kind}_{stem[:name_length]}_{index}"

    ops = ["Relu"] + ["Softsign"] * softsigns + ["Sign", "Ceil"] * pairs
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


def batchnorm_params(rng, maps: int) -> dict[str, np.ndarray]:
    """Inference BatchNormalization parameters far from the identity: scale, bias, mean, var."""
    return {
        "scale": rng.uniform(0.5, 2.0, maps).astype(np.float32) * rng.choice([-1, 1], maps).astype(np.float32),
        "bias": rng.standard_normal(maps).astype(np.float32),
        "mean": rng.standard_normal(maps).astype(np.float32),
        "var": rng.uniform(0.05, 3.0, maps).astype(np.float32),
    }


def conv_bn_relu(seed: int = 0, channels: int = 3, size: int = 10, maps: int = 6, bias: bool = True,
                 extra_reader: bool = False, epsilon: float = 1e-3) -> onnx.ModelProto:
    """Conv > BatchNormalization > Relu > MaxPool, batch axis "N", random BatchNormalization
    parameters. With `extra_reader` the Conv's output also feeds an Abs, whose result is a
    second graph output: the BatchNormalization then cannot be folded."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((maps, channels, 3, 3)).astype(np.float32) * 0.3
    bn = batchnorm_params(rng, maps)
    initializers = [numpy_helper.from_array(w, "w")]
    initializers += [numpy_helper.from_array(value, f"bn_{key}") for key, value in bn.items()]
    conv_inputs = ["x", "w"]
    if bias:
        initializers.append(numpy_helper.from_array(rng.standard_normal(maps).astype(np.float32), "b"))
        conv_inputs.append("b")
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n"], name="bn",
                         epsilon=epsilon),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", maps, size // 2, size // 2])]
    if extra_reader:
        nodes.append(helper.make_node("Abs", ["c"], ["a"], name="abs"))
        outputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", maps, size, size]))
    graph = helper.make_graph(nodes, "conv_bn_relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              outputs, initializer=initializers)
    return finish(graph)


def identities_and_constants(seed: int = 0) -> onnx.ModelProto:
    """x > Identity > Conv (weights from ConstantOfShape, bias from a Constant) > Dropout >
    Relu > Identity > y (a graph output), plus a Shape > Gather > Unsqueeze > Concat >
    Reshape flattening `y` into a second output `flat`."""
    rng = np.random.default_rng(seed)
    value = numpy_helper.from_array(np.array([0.25], np.float32))
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias_value")
    nodes = [
        helper.make_node("Identity", ["x"], ["x_same"], name="identity_in"),
        helper.make_node("Constant", [], ["w_shape"], name="w_shape_const",
                         value=numpy_helper.from_array(np.array([4, 2, 3, 3], np.int64))),
        helper.make_node("ConstantOfShape", ["w_shape"], ["w"], name="weights", value=value),
        helper.make_node("Constant", [], ["b"], name="bias", value=bias),
        helper.make_node("Conv", ["x_same", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Dropout", ["c", "ratio"], ["d"], name="dropout"),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("Identity", ["r"], ["y"], name="identity_out"),
        helper.make_node("Shape", ["y"], ["y_shape"], name="shape"),
        helper.make_node("Gather", ["y_shape", "zero"], ["batch"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch_1d"], name="unsqueeze"),
        helper.make_node("Concat", ["batch_1d", "minus_one"], ["flat_shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["y", "flat_shape"], ["flat"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes, "identities_and_constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6, 6]),
         helper.make_tensor_value_info("flat", TensorProto.FLOAT, [2, 144])],
        initializer=[numpy_helper.from_array(np.array(0, np.int64), "zero"),
                     numpy_helper.from_array(np.array([0], np.int64), "axes"),
                     numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
                     numpy_helper.from_array(np.array(0.5, np.float32), "ratio")],
    )
    return finish(graph)


def se_block(channels: int, squeezed: int, size: int, rng) -> onnx.ModelProto:
    """A squeeze-and-excitation block, batch axis "N": x -> GlobalAveragePool -> Conv 1x1 -> Relu
    -> Conv 1x1 -> HardSigmoid -> Mul with x (its two Convs are dense layers on 1x1 maps)."""
    def weights(name, m, c):
        return [numpy_helper.from_array(rng.standard_normal((m, c, 1, 1), dtype=np.float32) * np.float32(c ** -0.5), f"{name}_w"),
                numpy_helper.from_array(rng.standard_normal(m, dtype=np.float32), f"{name}_b")]

    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node("Conv", ["pooled", "squeeze_w", "squeeze_b"], ["s"], name="squeeze"),
        helper.make_node("Relu", ["s"], ["s_act"], name="squeeze_relu"),
        helper.make_node("Conv", ["s_act", "excite_w", "excite_b"], ["e"], name="excite"),
        helper.make_node("HardSigmoid", ["e"], ["scale"], name="excite_gate"),
        helper.make_node("Mul", ["x", "scale"], ["y"], name="rescale"),
    ]
    graph = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, size, size])],
        weights("squeeze", squeezed, channels) + weights("excite", channels, squeezed))
    return finish(graph)


def x_feeds(shape, seed: int = 3) -> dict[str, np.ndarray]:
    """Feeds for the builders' single input "x": uniform in [-1, 1], float32."""
    return {"x": np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}
