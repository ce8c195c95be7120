"""Reduction and normalisation nodes built in memory, with onnxruntime's results, for the CPU and GPU tests."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from opplugin.graph.model import Model
from opplugin.plan.partition import make_plan
from opplugin.gpu.device import CPU


def node_model(op: str, x_shape, attributes: dict | None = None, constants: dict | None = None, opset: int = 18,
               domain: str = "") -> onnx.ModelProto:
    """One `op` node reading x (batch axis "N") and the named constants, writing y."""
    constants = constants or {}
    inputs = ["x", *constants]
    node = helper.make_node(op, inputs, ["y"], name="node", domain=domain, **(attributes or {}))
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *x_shape[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items() if k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
    model.ir_version = 9
    return model


def reduce_model(op: str, x_shape, axes, keepdims: int = 1, opset: int = 18) -> onnx.ModelProto:
    if axes is None:
        return node_model(op, x_shape, {"keepdims": keepdims}, opset=opset)
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    if axes_as_input:
        return node_model(op, x_shape, {"keepdims": keepdims}, {"axes": np.asarray(axes, np.int64)}, opset)
    return node_model(op, x_shape, {"keepdims": keepdims, "axes": list(axes)}, opset=opset)


def affine_constants(rng, channels_shape) -> dict:
    return {"scale": (rng.uniform(0.5, 1.5, channels_shape)).astype(np.float32),
            "bias": rng.uniform(-0.5, 0.5, channels_shape).astype(np.float32)}


def fresh(shape, seed: int, spread: float = 2.0) -> np.ndarray:
    """Random float32 values (never zeros): uniform in +-spread around an offset, so a mean is not 0."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-spread, spread, shape) + 0.25).astype(np.float32)


def onnxruntime_output(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def planned(model: onnx.ModelProto, batch: int, device=CPU):
    """The plan of an in-memory model at `batch` (Model as load_model makes it, without a file)."""
    from opplugin.graph.simplify import simplify

    simplified, done = simplify(model)
    return make_plan(Model(simplified, "test", original=model, simplification=done), batch, device)


def _affine(channels_shape, seed: int = 0) -> dict:
    return affine_constants(np.random.default_rng(seed), channels_shape)


# name -> (model, x shape at batch 2 or more): every op, inner and strided runs, staged axes, rows
# from a warp's to a whole block's, small inner extents, both Softmax readings, keepdims both ways
CASES = {
    "ReduceSum last axis": (reduce_model("ReduceSum", (1, 1000), [1]), (4, 1000)),
    "ReduceSum over C of NCHW, keepdims 0": (reduce_model("ReduceSum", (1, 96, 7, 7), [1], 0), (2, 96, 7, 7)),
    "ReduceMax over axes 1 and 3 (two stages)": (reduce_model("ReduceMax", (1, 5, 6, 7), [1, 3], 1), (3, 5, 6, 7)),
    "ReduceMax a long row, opset 13": (reduce_model("ReduceMax", (1, 40000), [-1], 0, opset=13), (2, 40000)),
    "ReduceMean over C, H, W, keepdims 0": (reduce_model("ReduceMean", (1, 64, 14, 14), [1, 2, 3], 0), (2, 64, 14, 14)),
    "ReduceMean over H and W (the global pool kernel)": (reduce_model("ReduceMean", (1, 32, 7, 7), [2, 3], 0), (2, 32, 7, 7)),
    "ReduceMean over H, inner 5, opset 17": (reduce_model("ReduceMean", (1, 3, 33, 5), [2], 1, opset=17), (2, 3, 33, 5)),
    "ReduceSum, every axis but the batch, opset 11": (reduce_model("ReduceSum", (1, 4, 9), [1, 2], 0, opset=11), (3, 4, 9)),
    "ReduceL2 over H and W of NHWC (ConvNeXt V2's response norm)": (reduce_model("ReduceL2", (1, 7, 7, 40), [1, 2]), (2, 7, 7, 40)),
    "ReduceL2 over axes 1 and 3 (two stages: squares, then the root)": (reduce_model("ReduceL2", (1, 5, 6, 7), [1, 3], 0), (3, 5, 6, 7)),
    "ReduceL1 over C of NCHW, keepdims 0": (reduce_model("ReduceL1", (1, 24, 5, 5), [1], 0), (2, 24, 5, 5)),
    "ReduceSumSquare last axis, opset 13": (reduce_model("ReduceSumSquare", (1, 300), [1], 1, opset=13), (2, 300)),
    "ReduceMin over H": (reduce_model("ReduceMin", (1, 3, 33, 5), [2]), (2, 3, 33, 5)),
    "ReduceProd over C of NCHW": (reduce_model("ReduceProd", (1, 6, 4, 4), [1]), (2, 6, 4, 4)),
    "ReduceLogSum of a row of 1000": (reduce_model("ReduceLogSum", (1, 1000), [1], 0), (2, 1000)),
    "Softmax over classes": (node_model("Softmax", (1, 10), {"axis": -1}, opset=13), (8, 10)),
    "Softmax over C of NCHW": (node_model("Softmax", (1, 19, 9, 11), {"axis": 1}, opset=13), (2, 19, 9, 11)),
    "Softmax opset 11, axis 1: the rest as one row": (node_model("Softmax", (1, 3, 4, 5), {"axis": 1}, opset=11), (2, 3, 4, 5)),
    "LogSoftmax a long row": (node_model("LogSoftmax", (1, 5000), {}, opset=13), (3, 5000)),
    "LogSoftmax over H, inner 3": (node_model("LogSoftmax", (1, 3, 70, 3), {"axis": 2}, opset=13), (2, 3, 70, 3)),
    "LayerNormalization over NHWC's channels": (
        node_model("LayerNormalization", (1, 7, 7, 96), {"axis": -1, "epsilon": 1e-6}, _affine((96,)), opset=17), (2, 7, 7, 96)),
    "LayerNormalization over C, H, W, no bias": (
        node_model("LayerNormalization", (1, 12, 5, 5), {"axis": 1}, {"scale": _affine((12, 5, 5))["scale"]}, opset=17), (2, 12, 5, 5)),
    "LayerNormalization a long row, scale broadcast": (
        node_model("LayerNormalization", (1, 4, 5000), {"axis": 1}, _affine((5000,)), opset=17), (2, 4, 5000)),
    "GroupNormalization 32 groups, opset 18 (scale per group)": (
        node_model("GroupNormalization", (1, 64, 14, 14), {"num_groups": 32}, _affine((32,)), opset=18), (2, 64, 14, 14)),
    "GroupNormalization 2 groups, opset 21 (scale per channel)": (
        node_model("GroupNormalization", (1, 6, 9, 7), {"num_groups": 2}, _affine((6,)), opset=21), (3, 6, 9, 7)),
    "InstanceNormalization": (node_model("InstanceNormalization", (1, 8, 17, 19), {"epsilon": 1e-3}, _affine((8,))), (3, 8, 17, 19)),
}


def random_case(draw) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """(model, x shape) of a random reduction, softmax or LayerNorm: rank 2-4, small odd extents,
    any axes but the batch, keepdims both ways (a hypothesis `draw`)."""
    from hypothesis import strategies as st

    rank = draw(st.integers(2, 4))
    shape = (draw(st.integers(1, 3)), *(draw(st.integers(1, 40 if rank == 2 else 9)) for _ in range(rank - 1)))
    kind = draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                                 "Softmax", "LogSoftmax", "LayerNormalization"]))
    if kind.startswith("Reduce"):
        axes = draw(st.lists(st.integers(1, rank - 1), min_size=1, max_size=rank - 1, unique=True))
        return reduce_model(kind, shape, axes, int(draw(st.booleans()))), shape
    axis = draw(st.integers(1, rank - 1))
    if kind == "LayerNormalization":
        return node_model(kind, shape, {"axis": axis}, _affine(shape[axis:], seed=rank), opset=17), shape
    return node_model(kind, shape, {"axis": axis}, opset=13), shape
