"""Small models onnxruntime runs that opplugin once crashed on: control flow whose subgraphs read
tensors of the outer graph by name, tensors with an axis of size 0, and the models onnxruntime
itself refuses (a Conv in float64, a Conv over an empty image), which opplugin must refuse in one
line; and graphs without outputs, or whose outputs no node computes."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish

F = TensorProto.FLOAT


def _value(name: str, shape=None, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _weights(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _branch(name: str, nodes: list[onnx.NodeProto], output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_value(output)])


def _condition(nodes: list, source: str, name: str = "c") -> None:
    """`name`: whether the sum of `source` is positive (an If's condition, computed at run time)."""
    nodes += [helper.make_node("ReduceSum", [source], [f"{name}_sum"], keepdims=0),
              helper.make_node("Greater", [f"{name}_sum", "zero"], [name])]


def if_reading_outer_tensors(seed: int = 0) -> onnx.ModelProto:
    """x [N,3,6,6] > Conv (plugin) > y, read by a Relu and, by name only, by both branches of an If,
    whose then-branch also reads a weight `scale` of the outer graph and an Identity's output `yi`
    that only it reads. The Conv must not fuse the Relu (a branch reads y), the If's step must get y,
    yi's rename and scale, and the Identity may go."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("Identity", ["y"], ["yi"])]
    _condition(nodes, "x")
    then = _branch("then", [helper.make_node("Mul", ["yi", "scale"], ["t"])], "t")
    other = _branch("else", [helper.make_node("Neg", ["y"], ["e"])], "e")
    nodes += [helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other),
              helper.make_node("Add", ["z", "r"], ["out"])]
    graph = helper.make_graph(nodes, "if_outer", [_value("x", ["N", 3, 6, 6])], [_value("out", ["N", 4, 6, 6])], initializer=[
        numpy_helper.from_array(_weights(rng, 4, 3, 3, 3), "w"), numpy_helper.from_array(np.float32(0.5), "scale"),
        numpy_helper.from_array(np.float32(0.0), "zero")])
    return finish(graph)


def loop_with_nested_if() -> onnx.ModelProto:
    """A Loop of 3 iterations whose body reads the outer tensors `y` (a Sigmoid's) and `u` (an onnxruntime
    step's, CumSum: no plugin runs it, and a plugin step lies between) by name, y inside an If nested in the body."""
    inner = helper.make_graph([helper.make_node("Add", ["acc", "y"], ["acc_y"])], "inner_then", [], [_value("acc_y")])
    skip = helper.make_graph([helper.make_node("Identity", ["acc"], ["acc_same"])], "inner_else", [], [_value("acc_same")])
    body = helper.make_graph(
        [helper.make_node("Greater", ["i", "one"], ["late"]),
         helper.make_node("If", ["late"], ["acc_if"], then_branch=inner, else_branch=skip),
         helper.make_node("Add", ["acc_if", "u"], ["acc_next"]),
         helper.make_node("Identity", ["go"], ["go_next"])],
        "body", [_value("i", [], TensorProto.INT64), _value("go", [], TensorProto.BOOL), _value("acc")],
        [_value("go_next", [], TensorProto.BOOL), _value("acc_next")])
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["u"]),
             helper.make_node("Sigmoid", ["x"], ["y"]),
             helper.make_node("Loop", ["trips", "", "x"], ["looped"], body=body),
             helper.make_node("Tanh", ["looped"], ["out"])]
    graph = helper.make_graph(nodes, "loop_nested", [_value("x", ["N", 5])], [_value("out", ["N", 5])], initializer=[
        numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(1, np.int64), "axis"),
        numpy_helper.from_array(np.array(1, np.int64), "one")])
    return finish(graph)


def scan_reading_outer_tensor() -> onnx.ModelProto:
    """A Scan over the rows of x [4, 3] (a fixed batch) whose body adds the outer tensor `b` (a Relu's)."""
    body = helper.make_graph([helper.make_node("Add", ["state", "row"], ["summed"]),
                              helper.make_node("Add", ["summed", "b"], ["state_next"]),
                              helper.make_node("Identity", ["state_next"], ["row_out"])],
                             "scan_body", [_value("state", [3]), _value("row", [3])], [_value("state_next", [3]), _value("row_out", [3])])
    nodes = [helper.make_node("Relu", ["bias"], ["b"]),
             helper.make_node("Scan", ["start", "x"], ["final", "rows"], body=body, num_scan_inputs=1),
             helper.make_node("Sigmoid", ["rows"], ["out"])]
    graph = helper.make_graph(nodes, "scan_outer", [_value("x", [4, 3]), _value("bias", [3])], [_value("out", [4, 3])],
                              initializer=[numpy_helper.from_array(np.zeros(3, np.float32), "start")])
    return finish(graph)


def empty_axis_models() -> dict[str, onnx.ModelProto]:
    """Models onnxruntime runs with an axis of size 0: an empty input and output, an empty intermediate
    that a Concat joins, and a MatMul over an empty axis (its result zeros)."""
    at, axis = (numpy_helper.from_array(np.array([v], np.int64), n) for v, n in ((2, "at"), (1, "axis")))
    return {
        "empty_input": finish(helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["out"])], "empty_input",
            [_value("x", ["N", 3, 0])], [_value("out", ["N", 3, 0])])),
        "empty_slice": finish(helper.make_graph(
            [helper.make_node("Slice", ["x", "at", "at", "axis"], ["e"]), helper.make_node("Relu", ["e"], ["er"]),
             helper.make_node("Concat", ["er", "x"], ["joined"], axis=1), helper.make_node("Tanh", ["joined"], ["out"])],
            "empty_slice", [_value("x", ["N", 4])], [_value("out", ["N", 4])], initializer=[at, axis])),
        "empty_matmul": finish(helper.make_graph(
            [helper.make_node("MatMul", ["x", "m"], ["p"]), helper.make_node("Relu", ["p"], ["out"])], "empty_matmul",
            [_value("x", ["N", 0])], [_value("out", ["N", 5])],
            initializer=[numpy_helper.from_array(np.ones((0, 5), np.float32), "m")])),
    }


def conv_over_empty_image(seed: int = 0) -> onnx.ModelProto:
    """A Conv whose input has height 0: onnxruntime's Conv refuses it when it runs."""
    rng = np.random.default_rng(seed)
    return finish(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["out"])],
        "conv_empty", [_value("x", ["N", 3, 0, 4])], [_value("out", ["N", 4, 0, 4])],
        initializer=[numpy_helper.from_array(_weights(rng, 4, 3, 3, 3), "w")]))


def conv_in_float64(seed: int = 0) -> onnx.ModelProto:
    """Cast to double > Conv > Cast to float: onnxruntime's CPU provider has no float64 Conv, so it
    cannot make a session of this model at all."""
    rng = np.random.default_rng(seed)
    return finish(helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xd"], to=TensorProto.DOUBLE),
         helper.make_node("Conv", ["xd", "wd"], ["cd"], pads=[1, 1, 1, 1]),
         helper.make_node("Cast", ["cd"], ["out"], to=F)],
        "conv_f64", [_value("x", ["N", 3, 5, 5])], [_value("out", ["N", 4, 5, 5])],
        initializer=[numpy_helper.from_array(_weights(rng, 4, 3, 3, 3).astype(np.float64), "wd")]))


def relu_in_float64_between_casts() -> onnx.ModelProto:
    """Cast to double > Relu > Mul > Cast to float: onnxruntime runs these in float64."""
    return finish(helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xd"], to=TensorProto.DOUBLE), helper.make_node("Relu", ["xd"], ["rd"]),
         helper.make_node("Mul", ["rd", "half"], ["md"]), helper.make_node("Cast", ["md"], ["out"], to=F)],
        "relu_f64", [_value("x", ["N", 6])], [_value("out", ["N", 6])],
        initializer=[numpy_helper.from_array(np.array(0.5), "half")]))


def without_outputs() -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "no_outputs", [_value("x", ["N", 3])], []),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def output_is_the_input() -> onnx.ModelProto:
    return finish(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "output_input", [_value("x", ["N", 3])],
                                    [_value("y", ["N", 3]), _value("x", ["N", 3])]))


def fixed_empty_batch() -> onnx.ModelProto:
    """Input [0, 3]: onnxruntime gives back an empty output."""
    return finish(helper.make_graph([helper.make_node("Relu", ["x"], ["out"])], "zero_batch", [_value("x", [0, 3])],
                                    [_value("out", [0, 3])]))
