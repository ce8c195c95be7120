"""Small channel-last graphs (Transpose > ... > Transpose, as ConvNeXt is exported), built with
onnx.helper, for the layout sink's CPU and GPU tests, and what they are compared by."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opplugin.ort.sessions import session

TO_LAST, TO_FIRST = [0, 2, 3, 1], [0, 3, 1, 2]


class Builder:
    """Nodes and constants of one graph, x [N, C, H, W] in."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.constants: dict[str, np.ndarray] = {}

    def constant(self, name: str, value) -> str:
        self.constants[name] = np.asarray(value, np.float32)
        return name

    def random(self, name: str, shape, spread: float = 1.0, offset: float = 0.0) -> str:
        return self.constant(name, self.rng.uniform(-spread, spread, shape) + offset)

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"{op.lower()}_{output}", **attributes))
        return output

    def layernorm(self, source: str, channels: int, output: str, axis: int = -1) -> str:
        scale, bias = self.random(f"{output}_scale", channels, 0.5, 1.0), self.random(f"{output}_bias", channels, 0.5)
        return self.node("LayerNormalization", [source, scale, bias], output, axis=axis, epsilon=1e-6)

    def gelu(self, x: str, form: str) -> str:
        """x * 0.5 * (1 + erf(x / sqrt 2)) written out, in one of its associations (form)."""
        root2, one, half = self.constant("root2", math.sqrt(2)), self.constant("one", 1.0), self.constant("half", 0.5)
        if form == "times_reciprocal":
            scaled = self.node("Mul", [x, self.constant("inverse_root2", 1 / math.sqrt(2))], f"{x}_scaled")
        else:
            scaled = self.node("Div", [x, root2], f"{x}_scaled")
        p = self.node("Add", [self.node("Erf", [scaled], f"{x}_erf"), one], f"{x}_p")
        if form == "half_first":
            return self.node("Mul", [self.node("Mul", [x, half], f"{x}_half"), p], f"{x}_gelu")
        if form == "x_first":
            return self.node("Mul", [self.node("Mul", [x, p], f"{x}_xp"), half], f"{x}_gelu")
        return self.node("Mul", [x, self.node("Mul", [half, p], f"{x}_ph")], f"{x}_gelu")  # torch's export

    def model(self, outputs: dict[str, list], channels: int, size: int, opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "channel_last",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                                  [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
                                  initializer=[numpy_helper.from_array(v, k) for k, v in self.constants.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
        model.ir_version = 8
        return model


def convnext_block(channels: int = 8, size: int = 7, gelu_form: str = "torch", opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """Depthwise 7x7 Conv > Transpose > LayerNorm > MatMul + bias > GELU > MatMul + bias > Transpose
    > Mul by the layer scale > Add the block's input: one ConvNeXt block."""
    b = Builder(seed)
    c, hidden = channels, 4 * channels
    dw = b.node("Conv", ["x", b.random("dw_w", (c, 1, 7, 7), 0.3), b.random("dw_b", c, 0.1)], "dw", group=c, pads=[3] * 4)
    last = b.layernorm(b.node("Transpose", [dw], "to_last", perm=TO_LAST), c, "ln")
    up = b.node("Add", [b.node("MatMul", [last, b.random("w1", (c, hidden), 0.5)], "mm1"), b.random("b1", hidden, 0.2)], "fc1")
    act = b.gelu(up, gelu_form)
    down = b.node("Add", [b.node("MatMul", [act, b.random("w2", (hidden, c), 0.3)], "mm2"), b.random("b2", c, 0.2)], "fc2")
    first = b.node("Transpose", [down], "to_first", perm=TO_FIRST)
    scaled = b.node("Mul", [b.random("gamma", (c, 1, 1), 0.5, 1.0), first], "scaled")
    b.node("Add", [scaled, "x"], "y")
    return b.model({"y": ["N", channels, size, size]}, channels, size, opset)


def convnext_stage(channels: int = 32, size: int = 32, side: str | None = None, seed: int = 4) -> onnx.ModelProto:
    """ConvNeXt's start in small: the stem (Conv 4x4 stride 4) > Transpose > LayerNorm > Transpose (stem_out) > one
    block (depthwise 7x7 Conv > Transpose > LayerNorm > MatMul + bias > GELU > MatMul + bias > Transpose > Mul by the
    layer scale > Add stem_out) > y. `side`: "output" (stem_out is a graph output too) or "onnxruntime" (a Hardmax,
    which no plugin runs, reads stem_out too)."""
    b = Builder(seed)
    c, hidden, out = channels, 4 * channels, size // 4
    stem = b.node("Conv", ["x", b.random("stem_w", (c, 3, 4, 4), 0.3), b.random("stem_b", c, 0.1)], "stem", strides=[4, 4])
    normed = b.layernorm(b.node("Transpose", [stem], "stem_last", perm=TO_LAST), c, "stem_ln")
    stem_out = b.node("Transpose", [normed], "stem_out", perm=TO_FIRST)
    dw = b.node("Conv", [stem_out, b.random("dw_w", (c, 1, 7, 7), 0.3), b.random("dw_b", c, 0.1)], "dw", group=c, pads=[3] * 4)
    last = b.layernorm(b.node("Transpose", [dw], "to_last", perm=TO_LAST), c, "ln")
    up = b.node("Add", [b.node("MatMul", [last, b.random("w1", (c, hidden), 0.5)], "mm1"), b.random("b1", hidden, 0.2)], "fc1")
    down = b.node("Add", [b.node("MatMul", [b.gelu(up, "torch"), b.random("w2", (hidden, c), 0.3)], "mm2"), b.random("b2", c, 0.2)],
                  "fc2")
    scaled = b.node("Mul", [b.random("gamma", (c, 1, 1), 0.5, 1.0), b.node("Transpose", [down], "to_first", perm=TO_FIRST)], "scaled")
    b.node("Add", [scaled, stem_out], "y")
    outputs = {"y": ["N", c, out, out]}
    if side == "output":
        outputs[stem_out] = ["N", c, out, out]
    elif side == "onnxruntime":
        outputs[b.node("Hardmax", [stem_out], "side", axis=1)] = ["N", c, out, out]
    return b.model(outputs, 3, size)


def downsampling(channels: int = 8, size: int = 8, seed: int = 1) -> onnx.ModelProto:
    """Transpose > LayerNorm > Transpose > Conv 2x2 stride 2: ConvNeXt's downsampling layer."""
    b = Builder(seed)
    normed = b.node("Transpose", [b.layernorm(b.node("Transpose", ["x"], "to_last", perm=TO_LAST), channels, "ln")], "to_first",
                    perm=TO_FIRST)
    b.node("Conv", [normed, b.random("w", (2 * channels, channels, 2, 2), 0.5)], "y", strides=[2, 2], kernel_shape=[2, 2])
    return b.model({"y": ["N", 2 * channels, size // 2, size // 2]}, channels, size)


def read_channel_last(reader: str, channels: int = 6, size: int = 5, seed: int = 2) -> onnx.ModelProto:
    """Transpose > LayerNorm > MatMul > Relu > Transpose > y, where `reader` also reads a channel-last
    tensor: "reshape" (Reshape of the MatMul's output), "output" (the LayerNorm's output is also a graph output),
    "reduce" (ReduceMean over H and W of the LayerNorm's output), or "flatten" of the Relu."""
    b = Builder(seed)
    last = b.layernorm(b.node("Transpose", ["x"], "to_last", perm=TO_LAST), channels, "ln")
    mm = b.node("MatMul", [last, b.random("w", (channels, channels), 0.5)], "mm")
    relu = b.node("Relu", [mm], "relu")
    b.node("Transpose", [relu], "y", perm=TO_FIRST)
    outputs = {"y": ["N", channels, size, size]}
    flat, last_shape = ["N", size * size * channels], ["N", size, size, channels]
    if reader == "reshape":
        b.constants["flat"] = np.array([0, -1], np.int64)
        b.node("Reshape", [mm, "flat"], "side")
    elif reader == "reduce":
        b.node("ReduceMean", [last], "side", axes=[1, 2], keepdims=1)
    elif reader == "flatten":
        b.node("Flatten", [relu], "side", axis=1)
    if reader == "output":
        outputs[last] = last_shape
    else:
        outputs["side"] = {"reshape": flat, "reduce": ["N", 1, 1, channels], "flatten": flat}[reader]
    return b.model(outputs, channels, size)


def layernorm_over_two_axes(channels: int = 4, size: int = 5, seed: int = 3) -> onnx.ModelProto:
    """Transpose > LayerNormalization over W and C (axis -2) > Transpose: no NCHW form, the transposes stay."""
    b = Builder(seed)
    scale, bias = b.random("scale", (size, channels), 0.5, 1.0), b.random("bias", (size, channels), 0.5)
    normed = b.node("LayerNormalization", [b.node("Transpose", ["x"], "to_last", perm=TO_LAST), scale, bias], "ln", axis=-2)
    b.node("Transpose", [normed], "y", perm=TO_FIRST)
    return b.model({"y": ["N", channels, size, size]}, channels, size)


def outputs_of(model: onnx.ModelProto, x: np.ndarray) -> dict[str, np.ndarray]:
    """The model's outputs by name, onnxruntime running it on `x`."""
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session(model).run(names, {"x": x})))


def ops(model: onnx.ModelProto) -> Counter:
    """How many nodes of each op type the model has."""
    return Counter(n.op_type for n in model.graph.node)
