"""The graph the passes rewrite (graph/ir.py): who reads and writes a tensor, the one rule for an only
reader, constants, names handed out by new_name, and what write_back keeps."""
import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_builders import finish

from opplugin.graph.ir import Graph


def _chain() -> onnx.ModelProto:
    """x > Mul(scale) > m > Relu > r (an output) and Abs > a; m > Add(Constant) > y; an unread constant."""
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node("Abs", ["r"], ["a"], name="abs"),
             helper.make_node("Add", ["a", "shift"], ["y"], name="add")]
    value = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, ["N", 3]) for name in ("x", "r", "y")]
    graph = helper.make_graph(nodes, "chain", value[:1], value[1:],
                              initializer=[numpy_helper.from_array(np.full(3, 2, np.float32), "scale"),
                                           numpy_helper.from_array(np.ones(3, np.float32), "shift"),
                                           numpy_helper.from_array(np.zeros(1, np.float32), "unread")])
    return finish(graph)


def test_readers_writer_and_constants():
    graph = Graph(_chain())
    assert [n.name for n in graph.readers("m")] == ["relu"]
    assert graph.writer("a").name == "abs" and graph.writer("x") is None and graph.writer("scale") is None
    assert graph.constant("scale").tolist() == [2, 2, 2] and graph.constant("m") is None
    assert graph.inputs == {"x"} and graph.outputs == {"r", "y"} and graph.opset == 17


def test_only_reader_is_one_onnx_node_of_a_tensor_that_is_no_graph_output():
    graph = Graph(_chain())
    assert graph.only_reader("m").name == "relu"
    assert graph.only_reader("m", "Relu").name == "relu"
    assert graph.only_reader("m", "Abs") is None  # another op type
    assert graph.only_reader("r") is None  # a graph output: its reader cannot take it over
    graph.nodes[1].domain = "custom"
    assert graph.only_reader("m", "Relu") is None  # an op type names an ONNX op
    assert graph.only_reader("m").name == "relu"
    graph.nodes.append(helper.make_node("Neg", ["m"], ["n"], name="neg"))
    assert graph.only_reader("m") is None  # two readers


def test_new_name_avoids_every_name_in_use_and_remembers_what_it_gave():
    graph = Graph(_chain())
    assert graph.new_name("m") == "m_1" and graph.new_name("scale") == "scale_1" and graph.new_name("free") == "free"
    assert graph.new_names == {"m_1", "scale_1", "free"}
    assert graph.new_name("free") == "free_1"  # handed out before, though nothing writes it yet


def test_new_name_never_takes_a_name_of_the_graph_as_loaded_even_once_gone():
    graph = Graph(_chain())
    graph.nodes.pop(2)  # Abs goes, and `a` with it
    graph.rename_reads("a", "r")
    assert graph.writer("a") is None and graph.new_name("a") == "a_1"  # `check` would compare an `a` with the original's


def test_rename_reads_and_used():
    graph = Graph(_chain())
    graph.rename_reads("a", "r")
    assert list(graph.nodes[3].input) == ["r", "shift"]
    assert not graph.used("a") and graph.used("r") and graph.used("y")


def test_write_back_keeps_the_read_constants_and_the_inputs_that_are_no_constants():
    model = _chain()
    model.graph.input.append(helper.make_tensor_value_info("scale", onnx.TensorProto.FLOAT, [3]))  # IR 3 lists it
    graph = Graph(model)
    graph.nodes.pop(0)  # the Mul goes: "scale" is read no more
    graph.rename_reads("m", "x")
    graph.write_back()
    assert [n.name for n in graph.proto.graph.node] == ["relu", "abs", "add"]
    assert set(graph.constants) == {"shift"}
    assert [i.name for i in graph.proto.graph.input] == ["x"]
    assert [n.name for n in model.graph.node] == ["mul", "relu", "abs", "add"]  # the model stays as it was
