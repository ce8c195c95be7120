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
