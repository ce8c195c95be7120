"""Einsum nodes of two operands for the CPU and GPU tests of the Einsum rewrite: the cases, a one-node model, its feeds and onnxruntime's answer."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


# equation -> (A's shape, B's shape, whether B is a constant); axis 0 of A is the batch
CASES = {
    "bghid,bghjd->bghij": ((2, 3, 4, 5, 8), (2, 3, 4, 6, 8), False),
    "bghij,bghjd->bghid": ((2, 3, 4, 5, 6), (2, 3, 4, 6, 8), False),
    "bhqd,bhkd->bhkq": ((2, 4, 7, 8), (2, 4, 9, 8), False),  # the output transposed too
    "bij,bj->bi": ((2, 5, 7), (2, 7), False),
    "bi,bj->bij": ((2, 5), (2, 3), False),
    "bnc,ck->bkn": ((2, 6, 5), (5, 4), True),  # a constant B, arranged at load
    "bnc,bk->bnkc": ((2, 6, 5), (2, 4), False),  # nothing contracted, two free in A
    "bhnc,bmc->bhmn": ((2, 3, 6, 5), (2, 4, 5), False),  # A's h broadcasts over B
    "bc,bhkc->bkh": ((2, 5), (2, 3, 4, 5), False),  # B's h broadcasts over A, no rows
}


def einsum_model(equation: str, a_shape, b_shape, b_constant: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(len(equation))
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", *a_shape[1:]])]
    initializers = []
    if b_constant:
        initializers.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", *b_shape[1:]]))
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation=equation)
    graph = helper.make_graph([node], "einsum", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def einsum_feeds(model: onnx.ModelProto, a_shape, b_shape, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    names = [i.name for i in model.graph.input]
    shapes = {"a": (batch, *a_shape[1:]), "b": (batch, *b_shape[1:])}
    return {name: rng.standard_normal(shapes[name]).astype(np.float32) for name in names}


def onnxruntime_einsum(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
