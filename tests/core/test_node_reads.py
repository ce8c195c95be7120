"""What a node reads: its inputs, and what its subgraphs read of the enclosing graphs, at any depth."""
import onnx
from onnx import TensorProto, helper

from opplugin.core.node_reads import outer_reads, reads, rename_reads


def _value(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _if_in_a_loop() -> onnx.NodeProto:
    """Loop(trips, "", acc0) whose body defines i, go, acc and t, and reads `outer` in a nested If and `w` itself."""
    branch = helper.make_graph([helper.make_node("Add", ["acc", "outer"], ["b"])], "then", [], [_value("b")])
    other = helper.make_graph([helper.make_node("Identity", ["acc"], ["e"])], "else", [], [_value("e")])
    body = helper.make_graph(
        [helper.make_node("If", ["go"], ["t"], then_branch=branch, else_branch=other),
         helper.make_node("Mul", ["t", "w"], ["acc_next"]), helper.make_node("Identity", ["go"], ["go_next"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("go", TensorProto.BOOL, []),
                 _value("acc")], [helper.make_tensor_value_info("go_next", TensorProto.BOOL, []), _value("acc_next")])
    return helper.make_node("Loop", ["trips", "", "acc0"], ["out"], body=body)


def test_reads_counts_what_nested_subgraphs_read_of_the_outer_graph_once():
    loop = _if_in_a_loop()
    assert reads(loop) == ["trips", "acc0", "outer", "w"]  # the omitted input left out; acc, go, t defined inside
    assert outer_reads(loop.attribute[0].g) == ["outer", "w"]
    assert reads(helper.make_node("Add", ["a", "a"], ["b"])) == ["a"]


def test_rename_reads_renames_outer_reads_inside_subgraphs_and_leaves_their_own_names():
    loop = _if_in_a_loop()
    rename_reads(loop, "outer", "renamed")
    rename_reads(loop, "acc", "not_this")  # the body's own input: an outer `acc` is not what it reads
    assert reads(loop) == ["trips", "acc0", "renamed", "w"]
    branch = next(a.g for a in loop.attribute[0].g.node[0].attribute if a.name == "then_branch")
    assert list(branch.node[0].input) == ["acc", "renamed"]
