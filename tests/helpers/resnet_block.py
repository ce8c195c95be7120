"""A ResNet-style block as PyTorch's TorchScript exporter writes one: Conv biases that are
Identity nodes of one shared initializer (its de-duplication), BatchNormalization, Relu,
a residual Add, then a global pool and a Gemm head; batch axis "N"."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import batchnorm_params, finish


def resnet_block(seed: int = 0, channels: int = 8, size: int = 12, classes: int = 10):
    rng = np.random.default_rng(seed)
    weights = {f"w{i}": rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.2 for i in (1, 2)}
    weights["stem_w"] = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3
    weights["shared_bias"] = np.full(channels, 0.05, np.float32)
    for i in (1, 2):
        weights.update({f"bn{i}_{k}": v for k, v in batchnorm_params(rng, channels).items()})
    weights["fc_w"] = rng.standard_normal((classes, channels)).astype(np.float32) * 0.3
    weights["fc_b"] = rng.standard_normal(classes).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Identity", ["shared_bias"], ["onnx::Conv_1"], name="bias_copy1"),
        helper.make_node("Identity", ["shared_bias"], ["onnx::Conv_2"], name="bias_copy2"),
        helper.make_node("Conv", ["x", "stem_w"], ["s"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["s_relu"], name="stem_relu"),
        helper.make_node("Conv", ["s_relu", "w1", "onnx::Conv_1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", *(f"bn1_{k}" for k in ("scale", "bias", "mean", "var"))], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "onnx::Conv_2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", *(f"bn2_{k}" for k in ("scale", "bias", "mean", "var"))], ["n2"], name="bn2"),
        helper.make_node("Add", ["n2", "s_relu"], ["sum"], name="residual"),
        helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "resnet_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializer=[numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return finish(graph)


def bottleneck_block(seed: int = 0, channels: int = 8, size: int = 12, width: int = 4, out: int = 16):
    """A ResNet-50 downsample block as the onnx package's ResNet-50 orders it: the main path's
    three convs (1x1, 3x3 stride 2, 1x1), then the shortcut's 1x1 stride-2 conv, then
    Sum(main, shortcut) > Relu: the Sum's operands are written by two convs, the later one last."""
    rng = np.random.default_rng(seed)

    def weight(name, shape, scale=0.3):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)

    inits = [weight("wa", (width, channels, 1, 1)), weight("wb", (width, width, 3, 3)), weight("wc", (out, width, 1, 1)),
             weight("ws", (out, channels, 1, 1)), weight("bc", (out,), 0.1), weight("bs", (out,), 0.1)]
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
        helper.make_node("Relu", ["a"], ["a_relu"], name="relu_a"),
        helper.make_node("Conv", ["a_relu", "wb"], ["b"], name="conv_b", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["b_relu"], name="relu_b"),
        helper.make_node("Conv", ["b_relu", "wc", "bc"], ["main"], name="conv_c"),
        helper.make_node("Conv", ["x", "ws", "bs"], ["shortcut"], name="conv_shortcut", strides=[2, 2]),
        helper.make_node("Sum", ["main", "shortcut"], ["sum"], name="sum"),
        helper.make_node("Relu", ["sum"], ["y"], name="relu_out"),
    ]
    half = size // 2
    graph = helper.make_graph(
        nodes, "bottleneck_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", out, half, half])],
        initializer=inits,
    )
    return finish(graph)
