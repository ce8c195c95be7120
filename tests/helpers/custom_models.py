"""Models with nodes of ops onnxruntime does not know, and declarations for them, as a user
would write them: the custom-op tests share these."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opplugin.custom import CustomOp

DOMAIN = "com.example"


def swish_op() -> CustomOp:
    """com.example::Swish2: y = x * sigmoid(beta * x), shapes by default (like its input)."""
    return CustomOp(DOMAIN, "Swish2", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0},
                    reference=lambda x, beta: x / (1.0 + np.exp(-beta * x)))


def split_max_op() -> CustomOp:
    """com.example::ChannelHalves: two outputs of other shapes (the max and the mean of each
    channel half), an optional scale input and a declared shape function."""
    def shapes(x, scale=None):
        n, c, h, w = x.shape
        return [((n, c // 2, h, w), x.dtype), ((n, c // 2, h, w), x.dtype)]

    def reference(x, scale=None):
        a, b = np.split(x, 2, axis=1)
        factor = 1.0 if scale is None else scale.reshape(1, -1, 1, 1)
        return np.maximum(a, b) * factor, (a + b) / 2

    return CustomOp(DOMAIN, "ChannelHalves", inputs=["X", "scale?"], outputs=["High", "Mean"], reference=reference, shapes=shapes)


def conv_swish_model(beta: float = 1.5, channels: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Conv -> com.example::Swish2 -> GlobalAveragePool -> Flatten (the model of the custom-op issue)."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) / 3, "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Swish2", ["c"], ["s"], name="swish", domain=DOMAIN, beta=beta),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    return _model(nodes, [weight], channels)


def two_custom_ops_model(seed: int = 1) -> onnx.ModelProto:
    """Conv -> Swish2 -> ChannelHalves (two outputs, scaled) -> Add of the two -> Swish2 -> pool ->
    Flatten: custom nodes back to back, a custom node's two outputs read by onnxruntime's nodes."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) / 3, "W")
    scale = numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "scale")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Swish2", ["c"], ["s"], name="swish1", domain=DOMAIN, beta=2.0),
             helper.make_node("ChannelHalves", ["s", "scale"], ["high", "mean"], name="halves", domain=DOMAIN),
             helper.make_node("Add", ["high", "mean"], ["sum"], name="add"),
             helper.make_node("Swish2", ["sum"], ["s2"], name="swish2", domain=DOMAIN),
             helper.make_node("GlobalAveragePool", ["s2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    return _model(nodes, [weight, scale], 4)


def _model(nodes, initializers, outputs: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", outputs])], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, folder, name: str = "custom.onnx"):
    path = folder / name
    onnx.save(model, path)
    return path


OPS_FILE = '''import numpy as np
from opplugin.custom import CustomOp

swish = CustomOp("com.example", "Swish2", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0},
                 reference=lambda x, beta: x / (1.0 + np.exp(-beta * x)))
'''


def ops_file(folder, text: str = OPS_FILE, name: str = "ops.py"):
    path = folder / name
    path.write_text(text)
    return path


def function_model() -> onnx.ModelProto:
    """Conv -> a call of the model's own function local.fns::ScaledSiLU (attribute alpha, default
    2.0) -> GlobalAveragePool -> Flatten: a model-local function, as torch's dynamo exporter writes them."""
    body = [helper.make_node("Constant", [], ["alpha"], value_float=2.0),
            helper.make_node("Constant", [], ["a"], value_float=1.0),
            helper.make_node("Mul", ["X", "a"], ["Xa"]),
            helper.make_node("Sigmoid", ["Xa"], ["S"]),
            helper.make_node("Mul", ["X", "S"], ["Y"])]
    function = helper.make_function("local.fns", "ScaledSiLU", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
    rng = np.random.default_rng(2)
    weight = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) / 3, "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ScaledSiLU", ["c"], ["s"], name="silu", domain="local.fns"),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["y"], name="flat")]
    graph = helper.make_graph(nodes, "functions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local.fns", 1)],
                              functions=[function])
    onnx.checker.check_model(model)
    return model


def swish_node(op, batch: int = 4, shape=(8, 5, 5), beta: float = 2.5):
    """A NodeInfo of one com.example::Swish2 node at these shapes, with the op's record of it."""
    from opplugin.registry import NodeInfo, TensorInfo

    node = helper.make_node("Swish2", ["x"], ["y"], name="swish", domain=DOMAIN, beta=beta)
    info = NodeInfo(node, [TensorInfo("x", (batch, *shape), np.dtype(np.float32))],
                    [TensorInfo("y", (batch, *shape), np.dtype(np.float32))], {"beta": beta})
    return NodeInfo(info.node, info.inputs, info.outputs, info.attributes, spec=op.make_spec(info))


def example_with_cuda_file(folder, edit=lambda text: text):
    """The shipped lenet86_swish declarations, their CUDA C file a copy in `folder` changed by `edit`:
    (the declarations file, the .cu file)."""
    from pathlib import Path

    models = Path(__file__).resolve().parents[2] / "models"
    source = Path(folder) / "swish.cu"
    source.write_text(edit((models / "swish.cu").read_text()))
    declarations = (models / "lenet86_swish_ops.py").read_text().replace('Path(__file__).with_name("swish.cu")', repr(str(source)))
    return ops_file(folder, declarations, "swish_ops.py"), source
