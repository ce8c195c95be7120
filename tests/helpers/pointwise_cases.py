"""Pointwise nodes and groups built in memory for the pointwise compiler's tests (CPU and GPU),
fresh random feeds with NaN and Inf planted, and the comparisons with onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import batchnorm_params

OPSET = 20  # Gelu is an op from 20
SHAPE = (6, 5, 7)  # (C, H, W) after the batch axis "N"
# (op type, attributes, constant extra inputs) of every one-operand op, parameters given where it has them
UNARY = [("Relu", {}, ()), ("Tanh", {}, ()), ("Sigmoid", {}, ()), ("LeakyRelu", {"alpha": 0.2}, ()), ("Clip", {}, (0.0, 6.0)),
         ("Clip", {}, (-1.0,)), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ()), ("HardSwish", {}, ()), ("Neg", {}, ()),
         ("Abs", {}, ()), ("Sqrt", {}, ()), ("Reciprocal", {}, ()), ("Exp", {}, ()), ("Log", {}, ()), ("Erf", {}, ()),
         ("Elu", {"alpha": 0.7}, ()), ("Softplus", {}, ()), ("Gelu", {}, ()), ("Gelu", {"approximate": "tanh"}, ())]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Sum"]
# the second operand: a runtime tensor of this shape ("N" for the batch), or a constant of this shape
OPERANDS = {
    "same": ("N", 6, 5, 7), "se_scale": ("N", 6, 1, 1), "runtime_row": (7,), "runtime_one_image": (1, 6, 5, 7),
    "channel": (6, 1, 1), "channel4d": (1, 6, 1, 1), "scalar": (), "row": (7,), "plane": (1, 1, 5, 7),
}
RUNTIME = ("same", "se_scale", "runtime_row", "runtime_one_image")


def unary_id(case) -> str:
    op, attributes, extra = case
    return op + "".join(map(str, extra)) + "".join(str(v) for v in attributes.values())


def finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="opplugin-tests")
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def _value(name: str, shape, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def unary_model(op: str, attributes: dict, extra=(), shape=SHAPE) -> onnx.ModelProto:
    """x -> op -> y."""
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), f"e{i}") for i, v in enumerate(extra)]
    node = helper.make_node(op, ["x", *(t.name for t in inits)], ["y"], name="node", **attributes)
    graph = helper.make_graph([node], "unary", [_value("x", ("N", *shape))], [_value("y", ("N", *shape))], initializer=inits)
    return finish(graph)


def binary_model(op: str, operand: str, constant_first: bool = False, seed: int = 0, shape=SHAPE) -> onnx.ModelProto:
    """x (op) b -> y: b a graph input or a constant of OPERANDS[operand]'s shape (its C, H, W those of `shape`)."""
    b_shape = _operand_shape(operand, shape)
    inputs, inits = [_value("x", ("N", *shape))], []
    if operand in RUNTIME:
        inputs.append(_value("b", b_shape))
    else:
        value = np.random.default_rng(seed).uniform(0.5, 1.5, b_shape).astype(np.float32)
        inits.append(numpy_helper.from_array(value, "b"))
    node = helper.make_node(op, ["b", "x"] if constant_first else ["x", "b"], ["y"], name="node")
    return finish(helper.make_graph([node], "binary", inputs, [_value("y", ("N", *shape))], initializer=inits))


def _operand_shape(operand: str, shape) -> tuple:
    c, h, w = shape
    return tuple({6: c, 5: h, 7: w}.get(d, d) if isinstance(d, int) and d > 1 else d for d in OPERANDS[operand])


def where_model(shape=SHAPE) -> onnx.ModelProto:
    """Where(x < t, x, b): the bool condition from a Less (onnxruntime's), x a graph input, b a per-channel constant."""
    c, h, w = shape
    b = numpy_helper.from_array(np.linspace(-1, 1, c, dtype=np.float32).reshape(c, 1, 1), "b")
    t = numpy_helper.from_array(np.float32(0.25), "t")
    nodes = [helper.make_node("Less", ["x", "t"], ["cond"], name="less"), helper.make_node("Where", ["cond", "x", "b"], ["y"], name="node")]
    graph = helper.make_graph(nodes, "where", [_value("x", ("N", *shape))], [_value("y", ("N", *shape))], initializer=[b, t])
    return finish(graph)


def cast_model(via, then: str | None = None, shape=SHAPE) -> onnx.ModelProto:
    """x -> Cast to `via` (a numpy dtype) [-> `then`, an op in that type] -> Cast back to float32 -> y."""
    types = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}
    nodes = [helper.make_node("Cast", ["x"], ["c"], name="node", to=types[via])]
    if then:
        nodes.append(helper.make_node(then, ["c"], ["d"], name="then"))
    nodes.append(helper.make_node("Cast", ["d" if then else "c"], ["y"], name="back", to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "cast", [_value("x", ("N", *shape))], [_value("y", ("N", *shape))])
    return finish(graph)


def batchnorm_model(then_relu: bool = False, shape=SHAPE, seed: int = 3) -> onnx.ModelProto:
    """An inference BatchNormalization of a graph input (DenseNet's pre-activation), then a Relu when asked."""
    params = batchnorm_params(np.random.default_rng(seed), shape[0])
    inits = [numpy_helper.from_array(v, f"bn_{k}") for k, v in params.items()]
    nodes = [helper.make_node("BatchNormalization", ["x", *(t.name for t in inits)], ["n" if then_relu else "y"], name="node",
                              epsilon=1e-3)]
    if then_relu:
        nodes.append(helper.make_node("Relu", ["n"], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "bn", [_value("x", ("N", *shape))], [_value("y", ("N", *shape))], initializer=inits)
    return finish(graph)


def expand_model(then_mul: bool, shape=SHAPE) -> onnx.ModelProto:
    """Expand of a per-(image, channel) s to [1, C, H, W] (the batch kept by broadcasting), then a Mul by x when asked."""
    c, h, w = shape
    target = numpy_helper.from_array(np.array([1, c, h, w], np.int64), "target")
    nodes = [helper.make_node("Expand", ["s", "target"], ["e" if then_mul else "y"], name="node")]
    inputs = [_value("s", ("N", c, 1, 1))]
    if then_mul:
        nodes.append(helper.make_node("Mul", ["e", "x"], ["y"], name="mul"))
        inputs.insert(0, _value("x", ("N", *shape)))
    graph = helper.make_graph(nodes, "expand", inputs, [_value("y", ("N", *shape))], initializer=[target])
    return finish(graph)


def se_gelu_model(shape=SHAPE) -> onnx.ModelProto:
    """An SE scale (Sigmoid of a per-(image, channel) input, times x) whose product is also a graph output,
    then GELU written out as exporters do (Div, Erf, Add, Mul, Mul), and a MaxPool reading the product:
    one group with two outputs."""
    c, h, w = shape
    scalars = {"sqrt2": 1.4142135381698608, "one": 1.0, "half": 0.5}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in scalars.items()]
    nodes = [helper.make_node("Sigmoid", ["s"], ["g"], name="sigmoid"),
             helper.make_node("Mul", ["x", "g"], ["m"], name="scale"),
             helper.make_node("Div", ["m", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="add"),
             helper.make_node("Mul", ["m", "a"], ["b"], name="mul"),
             helper.make_node("Mul", ["b", "half"], ["y"], name="half"),
             helper.make_node("MaxPool", ["m"], ["p"], name="pool", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "se_gelu", [_value("x", ("N", *shape)), _value("s", ("N", c, 1, 1))],
                              [_value("y", ("N", *shape)), _value("p", ("N", *shape))], initializer=inits)
    return finish(graph)


def feeds(model: onnx.ModelProto, batch: int, seed: int, poison: bool = False) -> dict[str, np.ndarray]:
    """Fresh random values for the graph inputs (never zeros); with `poison`, NaN, +inf and -inf at a few places."""
    rng = np.random.default_rng(seed)
    out = {}
    for value in model.graph.input:
        dims = [batch if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if dtype == np.bool_:
            out[value.name] = rng.random(dims) < 0.5
            continue
        x = rng.uniform(-3, 3, dims)
        x[np.abs(x) < 1e-3] = 0.5  # never zero
        if poison and x.size >= 8:
            flat = x.reshape(-1)
            flat[:3] = (np.nan, np.inf, -np.inf)
            flat[-1] = np.nan
        out[value.name] = x.astype(dtype)
    return out


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict, names) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(list(names), inputs)


def assert_close(ours: np.ndarray, theirs: np.ndarray, rtol: float, atol: float) -> None:
    """Same type and shape, NaN and Inf at the same places (Inf of the same sign), the rest within the tolerance."""
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (ours.dtype, theirs.dtype, ours.shape, theirs.shape)
    ours64, theirs64 = ours.astype(np.float64), theirs.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(ours64), np.isnan(theirs64))
    np.testing.assert_array_equal(np.isposinf(ours64), np.isposinf(theirs64))
    np.testing.assert_array_equal(np.isneginf(ours64), np.isneginf(theirs64))
    finite = np.isfinite(ours64) & np.isfinite(theirs64)
    np.testing.assert_allclose(ours64[finite], theirs64[finite], rtol=rtol, atol=atol)
