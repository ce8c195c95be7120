"""Models whose shapes are computed at run time, as exporters write them."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish


def _const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def channel_shuffle(channels: int = 4, size: int = 6, groups: int = 2) -> onnx.ModelProto:
    """Conv, then a channel shuffle the way torch's TorchScript exporter writes it:
    Shape > Gather > (Div) > Unsqueeze > Concat as the Reshape targets, the batch among
    them, then GlobalAveragePool, whose plugin needs concrete H and W."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "weights"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c"], ["shape"], name="shape")]
    for axis, name in enumerate("nchw"):
        nodes.append(helper.make_node("Gather", ["shape", f"i{axis}"], [f"{name}_scalar"], name=f"gather_{name}", axis=0))
    nodes += [
        helper.make_node("Div", ["c_scalar", "groups_scalar"], ["per_group_scalar"], name="div"),
        *[helper.make_node("Unsqueeze", [f"{name}_scalar", "zero"], [name], name=f"unsqueeze_{name}")
          for name in ("n", "per_group", "h", "w")],
        helper.make_node("Concat", ["n", "groups", "per_group", "h", "w"], ["split_shape"], name="concat_split", axis=0),
        helper.make_node("Reshape", ["c", "split_shape"], ["split"], name="reshape_split"),
        helper.make_node("Transpose", ["split"], ["shuffled"], name="transpose", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Concat", ["n", "minus_one", "h", "w"], ["merge_shape"], name="concat_merge", axis=0),
        helper.make_node("Reshape", ["shuffled", "merge_shape"], ["merged"], name="reshape_merge"),
        helper.make_node("GlobalAveragePool", ["merged"], ["y"], name="pool"),
    ]
    constants = [numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.3, "weights"),
                 *[_const(f"i{axis}", axis) for axis in range(4)], _const("groups_scalar", groups),
                 _const("groups", [groups]), _const("zero", [0]), _const("minus_one", [-1])]
    graph = helper.make_graph(nodes, "channel_shuffle",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 1, 1])],
                              initializer=constants)
    return finish(graph)


def reshape_to_data(channels: int = 4, size: int = 6) -> onnx.ModelProto:
    """A Reshape whose target mixes the input's shape with a value read from its data
    (-1 + 0 * max(x)), and the shape of NonZero's output. Neither may fold; the Shape >
    Slice giving (C, H, W) may."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Slice", ["shape", "one", "four"], ["chw"], name="slice"),
        helper.make_node("ReduceMax", ["x"], ["largest"], name="reduce_max", keepdims=0),
        helper.make_node("Mul", ["largest", "zero"], ["nothing"], name="times_zero"),
        helper.make_node("Cast", ["nothing"], ["nothing_int"], name="cast_int", to=TensorProto.INT64),
        helper.make_node("Add", ["nothing_int", "minus_one"], ["from_data"], name="add"),
        helper.make_node("Unsqueeze", ["from_data", "axes"], ["first"], name="unsqueeze"),
        helper.make_node("Concat", ["first", "chw"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape_to_data"),
        helper.make_node("NonZero", ["x"], ["where"], name="nonzero"),
        helper.make_node("Shape", ["where"], ["found"], name="shape_of_data"),
        helper.make_node("Cast", ["found"], ["y"], name="cast", to=TensorProto.FLOAT),
    ]
    constants = [_const("one", [1]), _const("four", [4]), _const("zero", 0.0, np.float32), _const("minus_one", -1),
                 _const("axes", [0])]
    graph = helper.make_graph(nodes, "reshape_to_data",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", channels, size, size]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=constants)
    return finish(graph)
