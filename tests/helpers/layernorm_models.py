"""A LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div(/Mul/Add), as exporters write it, for the tests of its rewrite into one node."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def decomposed_layernorm(x_shape, axes, opset: int, square: str = "Pow", affine_shape=None, bias: bool = True,
                         relu_after: bool = True) -> onnx.ModelProto:
    """x -> the decomposed LayerNorm over `axes` (scale and bias of `affine_shape` when given) -> Relu -> y."""
    rng = np.random.default_rng(len(x_shape) + opset)
    inits = [numpy_helper.from_array(np.array(1e-5, np.float32), "eps"), numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    axes_as_input = opset >= 18

    def mean(source, target, name):
        if axes_as_input:
            return helper.make_node("ReduceMean", [source, "axes"], [target], name=name, keepdims=1)
        return helper.make_node("ReduceMean", [source], [target], name=name, axes=list(axes), keepdims=1)

    if axes_as_input:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
    nodes = [mean("x", "mean", "ln_mean"), helper.make_node("Sub", ["x", "mean"], ["d"], name="ln_sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="ln_pow") if square == "Pow" else helper.make_node("Mul", ["d", "d"], ["sq"], name="ln_sq"),
             mean("sq", "var", "ln_var"), helper.make_node("Add", ["var", "eps"], ["ve"], name="ln_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="ln_sqrt"), helper.make_node("Div", ["d", "sd"], ["n"], name="ln_div")]
    last = "n"
    if affine_shape is not None:
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, affine_shape).astype(np.float32), "gamma"))
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["scaled"], name="ln_scale"))  # the constant first: either order matches
        last = "scaled"
        if bias:
            inits.append(numpy_helper.from_array(rng.uniform(-0.5, 0.5, affine_shape).astype(np.float32), "beta"))
            nodes.append(helper.make_node("Add", ["scaled", "beta"], ["shifted"], name="ln_bias"))
            last = "shifted"
    if relu_after:
        nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "decomposed_ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *x_shape[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *x_shape[1:]])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="opplugin-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
