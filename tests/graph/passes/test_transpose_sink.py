"""A Transpose keeping the last axis, before a product by a constant matrix (and its bias Add), moves after
them at load (graph/passes/transpose_sink.py): the result keeps its name and values, the plan reads the
moved Transpose as a view where a step takes it in, and what would move more bytes stays."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import save
from opplugin.graph.model import load_model
from opplugin.graph.simplify import simplify
from opplugin.runtime import Runner


def sequence_first_projection(width_in: int = 8, width_out: int = 24, reader: str = "Reshape", bias: bool = True):
    """x (N, T, C) -> LayerNorm-free stand-in Relu -> Transpose to (T, N, C) -> MatMul by W (C, D) [-> Add b]
    -> `reader` (a Reshape splitting D in three, or a Relu) -> y."""
    rng = np.random.default_rng(0)
    constants = [numpy_helper.from_array(rng.standard_normal((width_in, width_out)).astype(np.float32), "w"),
                 numpy_helper.from_array(rng.standard_normal(width_out).astype(np.float32), "b"),
                 numpy_helper.from_array(np.array([5, -1, 3, width_out // 3], np.int64), "split")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["t"], name="seq_first", perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t", "w"], ["mm"], name="proj")]
    last = "mm"
    if bias:
        nodes.append(helper.make_node("Add", ["mm", "b"], ["lin"], name="bias"))
        last = "lin"
    if reader == "Reshape":
        nodes.append(helper.make_node("Reshape", [last, "split"], ["y"], name="heads"))
        out_shape = [5, "N", 3, width_out // 3]
    else:
        nodes.append(helper.make_node("Relu", [last], ["y"], name="after"))
        out_shape = [5, "N", width_out]
    graph = helper.make_graph(nodes, "seq_first", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, width_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("bias", [True, False])
def test_the_transpose_moves_after_the_product_and_its_bias_and_the_values_stay(tmp_path, bias):
    proto = sequence_first_projection(bias=bias)
    simplified, done = simplify(proto)
    ops = [n.op_type for n in simplified.graph.node]
    assert ops == ["Relu", "MatMul", *(["Add"] if bias else []), "Transpose", "Reshape"]
    assert done.constants_folded["Transpose before a product"] == 1
    assert simplified.graph.node[1].input[0] == "r"  # the product reads the rows as they lie
    moved = next(n for n in simplified.graph.node if n.op_type == "Transpose")
    assert moved.output[0] == ("lin" if bias else "mm") and moved.name == "seq_first"
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)}
    runner = Runner(load_model(save(proto, tmp_path / "m.onnx")), 2, "cpu")
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], theirs, rtol=1e-5, atol=1e-5)


def test_a_wider_product_read_by_a_computing_step_keeps_its_transpose_before_it():
    """24 columns out of 8 in, and a Relu after: moving the Transpose would permute three times the bytes."""
    simplified, done = simplify(sequence_first_projection(reader="Relu"))
    assert [n.op_type for n in simplified.graph.node] == ["Relu", "Transpose", "MatMul", "Add", "Relu"]
    assert "Transpose before a product" not in done.constants_folded


def test_a_narrower_product_takes_the_transpose_after_it_whatever_reads_it():
    simplified, _ = simplify(sequence_first_projection(width_in=24, width_out=6, reader="Relu"))
    assert [n.op_type for n in simplified.graph.node] == ["Relu", "MatMul", "Add", "Transpose", "Relu"]
