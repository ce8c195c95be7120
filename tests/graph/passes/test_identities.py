"""Identity and inference Dropout dropped (graph/passes/identities.py), and kept where the graph's
names need them. test_simplify.py covers them dropped with the graph outputs keeping their names."""
import onnx
from onnx import helper
from onnx_builders import finish

from opplugin.graph.simplify import simplify


def test_identity_from_a_graph_input_to_a_graph_output_stays():
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1, 4, 4])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["copy"], name="copy"),
         helper.make_node("Dropout", ["x"], ["d", "mask"], name="dropout"),
         helper.make_node("Relu", ["d"], ["r"], name="relu")],
        "kept", [x],
        [helper.make_tensor_value_info("copy", onnx.TensorProto.FLOAT, ["N", 1, 4, 4]),
         helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, ["N", 1, 4, 4]),
         helper.make_tensor_value_info("mask", onnx.TensorProto.BOOL, ["N", 1, 4, 4])])
    simplified, done = simplify(finish(graph))
    assert not done.changed  # the Identity's output cannot be renamed; the Dropout's mask is read
    assert [n.op_type for n in simplified.graph.node] == ["Identity", "Dropout", "Relu"]


def test_layout_nodes_that_change_nothing_are_dropped_and_the_rest_stay():
    """A Pad of zeros (pads a constant, or computed and folded first), a Transpose in order and a Concat of
    one input go; a Pad of ones and a Transpose that permutes stay."""
    import numpy as np
    from onnx import numpy_helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 4, 4])
    constants = [numpy_helper.from_array(np.zeros(8, np.int64), "zeros"), numpy_helper.from_array(np.ones(8, np.int64), "ones"),
                 numpy_helper.from_array(np.array([4], np.int64), "four")]
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "zeros"], ["p"], name="pad_nothing"),
         helper.make_node("Sub", ["four", "four"], ["zero"], name="computed_zero"),
         helper.make_node("Expand", ["zero", "four"], ["zeros4"], name="expand_zero"),
         helper.make_node("Concat", ["zeros4", "zeros4"], ["computed_pads"], name="computed_pads", axis=0),
         helper.make_node("Pad", ["p", "computed_pads"], ["q"], name="pad_computed_nothing"),
         helper.make_node("Transpose", ["q"], ["t"], name="in_order", perm=[0, 1, 2, 3]),
         helper.make_node("Concat", ["t"], ["c"], name="lone", axis=1),
         helper.make_node("Pad", ["c", "ones"], ["grown"], name="pad_one"),
         helper.make_node("Transpose", ["grown"], ["y"], name="swap", perm=[0, 1, 3, 2])],
        "no_ops", [x], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4, 6, 6])], constants)
    simplified, done = simplify(finish(graph))
    assert [n.name for n in simplified.graph.node] == ["pad_one", "swap"]
    assert simplified.graph.node[0].input[0] == "x"
    assert done.dropped == {"Pad": 2, "Transpose": 1, "Concat": 1}


def test_the_shape_of_a_constant_folds():
    """TorchScript's Swin export builds its attention mask from Shape of a constant (an initializer):
    the Shape, and all that follows from it, is a constant."""
    import numpy as np
    from onnx import numpy_helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])
    graph = helper.make_graph(
        [helper.make_node("Shape", ["table"], ["extent"], name="shape_of_table"),
         helper.make_node("Expand", ["one", "extent"], ["ones"], name="ones_like"),
         helper.make_node("Add", ["x", "ones"], ["y"], name="add")],
        "shape_of_constant", [x], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.zeros((1, 3), np.float32), "table"), numpy_helper.from_array(np.ones(1, np.float32), "one")])
    simplified, done = simplify(finish(graph))
    assert [n.op_type for n in simplified.graph.node] == ["Add"]
    assert done.constants_folded.get("Shape") == 1
