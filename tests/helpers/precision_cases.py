"""Models and inputs for the precision tests (check --precision): a small CNN's feeds, and a model whose values pass
FP16's range."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish


def feeds_for(model: onnx.ModelProto, batch: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    return {model.graph.input[0].name: np.random.default_rng(seed).standard_normal((batch, *dims)).astype(np.float32)}


def overflowing_model() -> onnx.ModelProto:
    """y = Relu(x * 1000): past FP16's 65504 wherever x > 65.5, within BF16's range."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "big"], ["scaled"], name="scale"),
                               helper.make_node("Relu", ["scaled"], ["y"], name="relu")], "overflow",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
                              [numpy_helper.from_array(np.array(1000.0, np.float32), "big")])
    return finish(graph)
