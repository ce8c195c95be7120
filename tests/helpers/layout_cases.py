"""Single-node models of the layout ops (batch axis symbolic) for the CPU and GPU tests, and
models of several nodes: a channel shuffle, Concats whose producers write in place."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INT_MAX = 2**63 - 1


def _tensor(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", *shape[1:]] if shape else None)


def single_node(op: str, shapes: list, attributes: dict | None = None, constants: list | None = None, outputs: int = 1,
                opset: int = 13) -> onnx.ModelProto:
    """`op` on graph inputs x0.. of `shapes` (axis 0 symbolic), then constant inputs (None: left out, "")."""
    inputs = [f"x{i}" for i in range(len(shapes))]
    initializers, names = [], list(inputs)
    for i, value in enumerate(constants or []):
        if value is None:
            names.append("")
            continue
        initializers.append(numpy_helper.from_array(np.asarray(value), f"c{i}"))
        names.append(f"c{i}")
    results = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, results, name=f"{op.lower()}_node", **(attributes or {}))
    graph = helper.make_graph([node], op.lower(), [_tensor(n, s) for n, s in zip(inputs, shapes)],
                              [helper.make_tensor_value_info(r, TensorProto.FLOAT, None) for r in results], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def i64(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def f32(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


X = (2, 6, 5, 7)
CASES = {
    "concat_channels_2": lambda: single_node("Concat", [X, (2, 3, 5, 7)], {"axis": 1}),
    "concat_channels_4": lambda: single_node("Concat", [X, (2, 1, 5, 7), (2, 9, 5, 7), X], {"axis": 1}),
    "concat_last_axis": lambda: single_node("Concat", [X, (2, 6, 5, 2)], {"axis": -1}),
    "concat_rows": lambda: single_node("Concat", [X, (2, 6, 3, 7)], {"axis": 2}),
    "concat_2d": lambda: single_node("Concat", [(2, 10), (2, 33)], {"axis": 1}),
    "transpose_nchw_nhwc": lambda: single_node("Transpose", [(2, 40, 9, 35)], {"perm": [0, 2, 3, 1]}),
    "transpose_nhwc_nchw": lambda: single_node("Transpose", [(2, 9, 35, 40)], {"perm": [0, 3, 1, 2]}),
    "transpose_last_two": lambda: single_node("Transpose", [(2, 3, 33, 65)], {"perm": [0, 1, 3, 2]}),
    "transpose_shuffle_5d": lambda: single_node("Transpose", [(2, 2, 3, 4, 5)], {"perm": [0, 2, 1, 3, 4]}),
    "transpose_keeps_inner": lambda: single_node("Transpose", [(2, 3, 4, 5)], {"perm": [0, 2, 1, 3]}),
    "transpose_3d": lambda: single_node("Transpose", [(2, 70, 31)], {"perm": [0, 2, 1]}),
    "slice_step2": lambda: single_node("Slice", [X], constants=[i64(1, 0), i64(6, INT_MAX), i64(1, 3), i64(2, 3)]),
    "slice_reverse": lambda: single_node("Slice", [X], constants=[i64(-1), i64(-INT_MAX), i64(-1), i64(-1)]),
    "slice_backward_step3": lambda: single_node("Slice", [X], constants=[i64(5, 4), i64(0, 1), i64(1, 2), i64(-3, -2)]),
    "slice_no_axes": lambda: single_node("Slice", [X], constants=[i64(0, 1, 1), i64(INT_MAX, 5, 4)]),
    "slice_contiguous": lambda: single_node("Slice", [X], constants=[i64(1), i64(3), i64(2)]),
    "slice_empty_backward": lambda: single_node("Slice", [X], constants=[i64(-10), i64(0), i64(2), i64(-1)]),
    "gather_one_index_scalar": lambda: single_node("Gather", [X], {"axis": 1}, constants=[np.asarray(2, np.int64)]),
    "gather_one_index_kept": lambda: single_node("Gather", [X], {"axis": 1}, constants=[i64(-1)]),
    "gather_run_step2": lambda: single_node("Gather", [X], {"axis": 3}, constants=[i64(0, 2, 4, 6)]),
    "gather_2d_indices_backward": lambda: single_node("Gather", [X], {"axis": 2}, constants=[np.asarray([[-1, -2], [-3, -4]], np.int64)]),
    # indices that do not step evenly: a table (GatherSpec.table), whole blocks copied (rows of 8: float4 copies; of 7: one float each)
    "gather_table_rows": lambda: single_node("Gather", [(2, 12, 8)], {"axis": 1}, constants=[np.asarray([[3, 0, 11], [-1, 2, 2]], np.int64)]),
    "gather_table_odd_inner": lambda: single_node("Gather", [X], {"axis": 2}, constants=[i64(4, 0, 3, 3, 1)]),
    "split_equal": lambda: single_node("Split", [X], {"axis": 1}, outputs=3),
    "split_sizes": lambda: single_node("Split", [X], {"axis": 1}, constants=[i64(2, 3, 1)], outputs=3),
    "split_last_axis": lambda: single_node("Split", [X], {"axis": -1}, constants=[i64(3, 4)], outputs=2),
    "pad_constant": lambda: single_node("Pad", [X], {"mode": "constant"}, constants=[i64(0, 0, 1, 2, 0, 0, 3, 0), f32(1.5)]),
    "pad_constant_crop": lambda: single_node("Pad", [X], {"mode": "constant"}, constants=[i64(0, 1, -1, 2, 0, 0, 1, -3)]),
    "pad_reflect": lambda: single_node("Pad", [X], {"mode": "reflect"}, constants=[i64(0, 0, 2, 3, 0, 0, 4, 1)]),
    "pad_edge": lambda: single_node("Pad", [X], {"mode": "edge"}, constants=[i64(0, 2, 1, 0, 0, 1, 3, 2)]),
    "pad_axes_opset18": lambda: single_node("Pad", [X], {"mode": "reflect"}, constants=[i64(1, 2, 2, 1), None, i64(-2, -1)], opset=18),
    "squeeze": lambda: single_node("Squeeze", [(2, 1, 5, 1)], constants=[i64(1, -1)]),
    "unsqueeze": lambda: single_node("Unsqueeze", [X], constants=[i64(1, -1)]),
}

RESIZES = {
    "nearest_asymmetric_floor_x2": ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                                    f32(1, 1, 2, 2), None),
    "nearest_half_pixel_sizes": ({"mode": "nearest", "axes": [2, 3]}, None, i64(9, 4)),
    "nearest_round_prefer_ceil_x1_7": ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, f32(1, 1, 1.7, 1.7), None),
    "nearest_down_half": ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}, f32(1, 1, 0.5, 0.5), None),
    "linear_half_pixel_x2": ({"mode": "linear"}, f32(1, 1, 2, 2), None),
    "linear_align_corners_sizes": ({"mode": "linear", "coordinate_transformation_mode": "align_corners", "axes": [-2, -1]}, None,
                                   i64(11, 3)),
    "linear_pytorch_half_pixel_to_1": ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel", "axes": [2, 3]}, None,
                                       i64(1, 13)),
    "linear_asymmetric_x1_5": ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, f32(1, 1, 1.5, 2.5), None),
    "linear_width_only": ({"mode": "linear"}, f32(1, 1, 1, 3), None),
}
for _name, (_attributes, _scales, _sizes) in RESIZES.items():
    CASES[f"resize_{_name}"] = (lambda a=_attributes, s=_scales, z=_sizes:
                                single_node("Resize", [X], a, constants=[None, s, z], opset=18 if z is not None else 13))


def channel_shuffle(groups: int = 3, channels: int = 12, size: int = 5) -> onnx.ModelProto:
    """Reshape -> Transpose -> Reshape, as ShuffleNet exports its channel shuffle (target shapes constant)."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape1"], ["grouped"], name="reshape1"),
        helper.make_node("Transpose", ["grouped"], ["swapped"], name="transpose", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["swapped", "shape2"], ["y"], name="reshape2"),
    ]
    inits = [numpy_helper.from_array(i64(0, groups, channels // groups, size, size), "shape1"),
             numpy_helper.from_array(i64(0, channels, size, size), "shape2")]
    graph = helper.make_graph(nodes, "shuffle", [_tensor("x", (2, channels, size, size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def inception_like(seed: int = 0, channels: int = 4, size: int = 6) -> onnx.ModelProto:
    """Branches concatenated along the channels, as an Inception block: a Conv (+Relu), a Pad, a Transpose
    pair's result and the graph input itself, then a Concat that reads a branch twice and a Relu after it."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((5, channels, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["branch1"], name="relu"),
        helper.make_node("Pad", ["x", "pads"], ["branch2"], name="pad", mode="edge"),
        helper.make_node("Slice", ["branch2", "starts", "ends", "axes"], ["branch2s"], name="slice"),
        helper.make_node("Transpose", ["x"], ["nhwc"], name="to_nhwc", perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["nhwc"], ["branch3"], name="to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Concat", ["branch1", "branch2s", "branch3", "x", "branch3"], ["cat"], name="concat", axis=1),
        helper.make_node("Relu", ["cat"], ["y"], name="relu_out"),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(i64(0, 0, 1, 1, 0, 0, 1, 1), "pads"),
             numpy_helper.from_array(i64(1, 1), "starts"), numpy_helper.from_array(i64(size + 1, size + 1), "ends"),
             numpy_helper.from_array(i64(2, 3), "axes")]
    graph = helper.make_graph(nodes, "inception_like", [_tensor("x", (2, channels, size, size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def dense_block(layers: int = 3, channels: int = 4, growth: int = 3, size: int = 5, seed: int = 0,
                pre_activation: bool = False) -> onnx.ModelProto:
    """DenseNet's pattern: layer i reads the Concat of the block input and every earlier layer's output
    (so each output has several Concat readers), and the block's output is the Concat of all. With
    `pre_activation`, each Concat is read by an elementwise op first (DenseNet's BatchNormalization > Relu)."""
    rng = np.random.default_rng(seed)
    nodes, inits, features = [], [], ["x"]
    for i in range(layers):
        cat = f"cat{i}"
        nodes.append(helper.make_node("Concat", list(features), [cat], name=f"concat{i}", axis=1))
        w = rng.standard_normal((growth, channels + i * growth, 3, 3)).astype(np.float32) * 0.2
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        if pre_activation:
            nodes.append(helper.make_node("Relu", [cat], [f"act{i}"], name=f"act{i}"))
            cat = f"act{i}"
        nodes.append(helper.make_node("Conv", [cat, f"w{i}"], [f"conv{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"f{i}"], name=f"relu{i}"))
        features.append(f"f{i}")
    nodes.append(helper.make_node("Concat", features, ["y"], name="concat_out", axis=1))
    graph = helper.make_graph(nodes, "dense_block", [_tensor("x", (2, channels, size, size))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def random_feeds(model: onnx.ModelProto, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [batch, *(d.dim_value for d in value.type.tensor_type.shape.dim[1:])]
        feeds[value.name] = rng.uniform(-2, 2, shape).astype(np.float32)
    return feeds


def _model(name: str, nodes: list, inits: list, x_shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [_tensor("x", x_shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def nested_concats(size: int = 6) -> onnx.ModelProto:
    """Concat(Concat(Transpose, Pad), Slice) along the channels, then a Relu: every Concat input comes
    from a layout kernel, so both Concats launch nothing once their producers write in place."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="swap_hw", perm=[0, 1, 3, 2]),
        helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="reflect"),
        helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"], name="crop"),
        helper.make_node("Concat", ["t", "s"], ["inner"], name="concat_inner", axis=1),
        helper.make_node("Slice", ["x", "c_start", "c_end", "c_axis", "c_step"], ["r"], name="reverse_channels"),
        helper.make_node("Concat", ["inner", "r"], ["outer"], name="concat_outer", axis=1),
        helper.make_node("Relu", ["outer"], ["y"], name="relu"),
    ]
    inits = [numpy_helper.from_array(i64(0, 0, 2, 2, 0, 0, 2, 2), "pads"), numpy_helper.from_array(i64(2, 2), "starts"),
             numpy_helper.from_array(i64(size + 2, size + 2), "ends"), numpy_helper.from_array(i64(2, 3), "axes"),
             numpy_helper.from_array(i64(-1), "c_start"), numpy_helper.from_array(i64(-INT_MAX), "c_end"),
             numpy_helper.from_array(i64(1), "c_axis"), numpy_helper.from_array(i64(-1), "c_step")]
    return _model("nested_concats", nodes, inits, (2, 3, size, size))


def activations_concatenated(size: int = 5) -> onnx.ModelProto:
    """Concat(Sigmoid(x), Tanh(x)) along the channels, then a Relu: elementwise producers, which write any view."""
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Concat", ["s", "t"], ["cat"], name="concat", axis=1),
        helper.make_node("Relu", ["cat"], ["y"], name="relu"),
    ]
    return _model("activations_concatenated", nodes, [], (2, 3, size, size))


def concat_as_output(size: int = 4) -> onnx.ModelProto:
    """Concat(Transpose(x), Pad(x)) as the graph's output: the buffer written in place is what the run returns."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="swap_hw", perm=[0, 1, 3, 2]),
        helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="constant"),
        helper.make_node("Concat", ["t", "p"], ["y"], name="concat", axis=1),
    ]
    inits = [numpy_helper.from_array(i64(0, 1, 0, 0, 0, 2, 0, 0), "pads")]
    return _model("concat_as_output", nodes, inits, (2, 3, size, size))
