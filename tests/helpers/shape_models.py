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


def view_by_gather(channels: int = 6, in_order: bool = True) -> onnx.ModelProto:
    """A view of a pooled (N, C, 1, 1) tensor written as torch's dynamo exporter writes as_strided:
    the data flattened, then Gather at indices Range(0, N) * C + (0 .. C-1), computed from the
    batch; then a Transpose and a Relu that want concrete shapes. With `in_order` False the
    indices take the channels in reverse: a real gather, which must stay one."""
    ramp = np.arange(channels)[::1 if in_order else -1].reshape(1, channels, 1, 1)
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="pool"),
        helper.make_node("Reshape", ["pooled", "flat"], ["flattened"], name="flatten"),
        helper.make_node("Shape", ["x"], ["n_1d"], name="batch", start=0, end=1),
        helper.make_node("Squeeze", ["n_1d"], ["n"], name="batch_scalar"),
        helper.make_node("Range", ["zero", "n", "one"], ["images"], name="range"),
        helper.make_node("Mul", ["images", "per_image"], ["starts"], name="starts"),
        helper.make_node("Unsqueeze", ["starts", "axes"], ["starts4"], name="unsqueeze"),
        helper.make_node("Add", ["starts4", "ramp"], ["indices"], name="indices"),
        helper.make_node("Gather", ["flattened", "indices"], ["viewed"], name="as_strided", axis=0),
        helper.make_node("Transpose", ["viewed"], ["nhwc"], name="permute", perm=[0, 2, 3, 1]),
        helper.make_node("Relu", ["nhwc"], ["y"], name="relu"),
    ]
    constants = [_const("flat", [-1]), _const("zero", 0), _const("one", 1), _const("per_image", channels),
                 _const("axes", [1, 2, 3]), _const("ramp", ramp)]
    graph = helper.make_graph(nodes, "view_by_gather",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 1, channels])], initializer=constants)
    return finish(graph)
