"""MatMul nodes of any rank built in memory, for the CPU and GPU tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def matmul_model(a_shape, b_shape, constant: str = "b", activation: str | None = None, softmax: bool = False,
                 opset: int = 17, seed: int = 0, bias: tuple[int, ...] | None = None, bias_first: bool = False) -> onnx.ModelProto:
    """y = MatMul(a, b) (then an Add of a constant of shape `bias`, its first operand where `bias_first`, then
    the activation, then a Softmax over the last axis); `constant` names the operand that is an initializer
    ("a", "b" or ""), the others are graph inputs with the batch axis "N"."""
    rng = np.random.default_rng(seed)
    inputs, inits = [], []
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if name == constant:
            inits.append(numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(np.float32), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", *shape[1:]]))
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"], name="mm")]
    last = "mm"
    if bias is not None:
        inits.append(numpy_helper.from_array(rng.uniform(-1, 1, bias).astype(np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["bias", last] if bias_first else [last, "bias"], ["biased"], name="add"))
        last = "biased"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["act"], name="act"))
        last = "act"
    if softmax:
        nodes.append(helper.make_node("Softmax", [last], ["sm"], name="softmax", axis=-1))
        last = "sm"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "matmul", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
    model.ir_version = 8
    return model


# name -> (A shape, B shape, constant operand, activation, softmax): shapes at batch 2
CASES = {
    "ConvNeXt MLP in: (N, H, W, C) x (C, 4C), Gelu left out": ((2, 7, 7, 96), (96, 384), "b", None, False),
    "ConvNeXt MLP out, Relu fused": ((2, 7, 7, 384), (384, 96), "b", "Relu", False),
    "rank 3 rows, Softmax fused": ((2, 5, 24), (24, 10), "b", None, True),
    "2-D, odd sizes": ((2, 37), (37, 19), "b", "Sigmoid", False),
    "batched, both at run time": ((2, 3, 17, 33), (2, 3, 33, 9), "", None, False),
    "batched, a constant B broadcast over the batch": ((2, 4, 70, 20), (4, 20, 65), "b", "Tanh", False),
    "batched, a constant B of rank 4 broadcast over axis 1": ((2, 3, 8, 5), (1, 1, 5, 6), "b", None, False),
    "batched, a constant A, B at run time": ((3, 12), (2, 3, 12, 7), "a", None, False),
    "attention scores: (N, H, T, D) x (N, H, D, T)": ((2, 3, 50, 64), (2, 3, 64, 50), "", None, False),
    "attention values: (N, H, T, T) x (N, H, T, D), T odd": ((2, 3, 49, 49), (2, 3, 49, 64), "", None, False),
}


# name -> (A shape, B shape, bias shape, bias first, activation): a Linear layer's MatMul by a constant B, then
# its bias Add, which the Gemm families take as their column bias (shapes at batch 2)
BIAS_CASES = {
    "tokens (N, T, C) x (C, 4C) + bias (4C,)": ((2, 49, 32), (32, 128), (128,), False, None),
    "bias (1, 1, N) first, then Relu": ((2, 5, 24), (24, 10), (1, 1, 10), True, "Relu"),
    "2-D rows + bias (1, N), then Sigmoid": ((2, 37), (37, 19), (1, 19), False, "Sigmoid"),
}


def fresh_inputs(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [batch, *(d.dim_value for d in value.type.tensor_type.shape.dim[1:])]
        feeds[value.name] = rng.uniform(-1, 1, shape).astype(np.float32) + np.float32(0.1)
    return feeds


def mlp_block(seed: int = 0) -> onnx.ModelProto:
    """A ConvNeXt-style MLP on NHWC: LayerNormalization over C, (C, 4C) MatMul, Relu, (4C, C) MatMul,
    then a Softmax over C and a ReduceMean over H and W, in opset 17."""
    rng = np.random.default_rng(seed)
    c = 32
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in {
        "gamma": rng.uniform(0.5, 1.5, c), "beta": rng.uniform(-0.2, 0.2, c),
        "w1": rng.uniform(-0.3, 0.3, (c, 4 * c)), "w2": rng.uniform(-0.2, 0.2, (4 * c, c))}.items()]
    inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "hw"))
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["ln", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["o"], name="fc2"), helper.make_node("Softmax", ["o"], ["s"], name="softmax", axis=-1),
             helper.make_node("ReduceSum", ["s", "hw"], ["y"], name="pool", keepdims=0)]
    graph = helper.make_graph(nodes, "mlp_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 6, c])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="opplugin-tests")
    model.ir_version = 8
    return model
