"""Layout chains that only move whole rows become one Gather of rows at load (graph/passes/row_gather.py):
Swin's cyclic shift (two Slice + Concat pairs) and window partition (Reshape > Transpose > Reshape) before a
projection, and the reverse before a residual Add. The result keeps its name and its values at any batch;
chains that split rows, mix images, or copy once already stay as they are."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import save
from opplugin.graph.model import load_model
from opplugin.graph.simplify import simplify
from opplugin.runtime import Runner

SIDE, WINDOW, CHANNELS = 8, 4, 16


def _roll(source: str, axis: int, shift: int, name: str) -> list:
    """torch.roll as exporters write it: the last `shift` positions of `axis`, then the rest."""
    return [helper.make_node("Slice", [source, f"{name}_s0", f"{name}_e0", f"axis{axis}"], [f"{name}_tail"], name=f"{name}_tail"),
            helper.make_node("Slice", [source, f"{name}_s1", f"{name}_e1", f"axis{axis}"], [f"{name}_head"], name=f"{name}_head"),
            helper.make_node("Concat", [f"{name}_tail", f"{name}_head"], [name], name=name, axis=axis)]


def _roll_constants(name: str, shift: int) -> dict:
    return {f"{name}_s0": [SIDE - shift], f"{name}_e0": [SIDE], f"{name}_s1": [0], f"{name}_e1": [SIDE - shift]}


def shifted_windows(reader: str = "MatMul", perm_last: bool = True, shift: int = 2, source: str = "Relu"):
    """x (N, 8, 8, 16) > `source` (a Relu, or a Linear layer: MatMul by V (16, 16) and a bias Add) > rolled by `shift` on both spatial axes > partitioned into 4x4 windows (N*4, 16, 16)
    > `reader`: a MatMul by W (16, 24), or an Add of a constant per window position (16, 16)."""
    rng = np.random.default_rng(0)
    blocks = SIDE // WINDOW
    constants = {**_roll_constants("roll_h", shift), **_roll_constants("roll_w", shift), "axis1": [1], "axis2": [2],
                 "split": [-1, blocks, WINDOW, blocks, WINDOW, CHANNELS], "windows": [-1, WINDOW * WINDOW, CHANNELS]}
    perm = [0, 1, 3, 2, 4, 5] if perm_last else [0, 1, 3, 2, 5, 4]
    before = [helper.make_node("Relu", ["x"], ["r"], name="relu")] if source == "Relu" else \
        [helper.make_node("MatMul", ["x", "v"], ["projected"], name="proj"), helper.make_node("Add", ["projected", "b"], ["r"], name="proj_bias")]
    nodes = [*before, *_roll("r", 1, shift, "roll_h"), *_roll("roll_h", 2, shift, "roll_w"),
             helper.make_node("Reshape", ["roll_w", "split"], ["split_view"], name="split_view"),
             helper.make_node("Transpose", ["split_view"], ["partition"], name="partition", perm=perm),
             helper.make_node("Reshape", ["partition", "windows"], ["windowed"], name="windowed")]
    weights = [numpy_helper.from_array(rng.standard_normal((CHANNELS, 24)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal((WINDOW * WINDOW, CHANNELS)).astype(np.float32), "position"),
               numpy_helper.from_array(rng.standard_normal((CHANNELS, CHANNELS)).astype(np.float32), "v"),
               numpy_helper.from_array(rng.standard_normal(CHANNELS).astype(np.float32), "b")]
    if reader == "MatMul":
        nodes.append(helper.make_node("MatMul", ["windowed", "w"], ["y"], name="qkv"))
        out = ["M", WINDOW * WINDOW, 24]
    else:
        nodes.append(helper.make_node("Add", ["windowed", "position"], ["y"], name="position_add"))
        out = ["M", WINDOW * WINDOW, CHANNELS]
    graph = helper.make_graph(nodes, "shifted_windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIDE, SIDE, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              weights + [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("reader", ["MatMul", "Add"])
def test_a_shift_and_window_partition_become_one_row_gather_with_the_same_values_at_any_batch(tmp_path, reader):
    proto = shifted_windows(reader)
    simplified, done = simplify(proto)
    ops = [n.op_type for n in simplified.graph.node]
    assert ops == ["Relu", "Reshape", "Gather", "Reshape", reader]
    assert done.constants_folded["row-moving layout nodes"] == 9  # 4 Slices, 2 Concats, Reshape > Transpose > Reshape
    assert simplified.graph.node[3].output[0] == "windowed"  # the chain's end keeps its name
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, SIDE, SIDE, CHANNELS)).astype(np.float32)}
        runner = Runner(load_model(save(proto, tmp_path / "m.onnx")), batch, "cpu")
        if reader == "MatMul":  # the product gathers A's rows as it loads them: no step of the Gather's own
            assert [s.ops for s in runner.plan.plugin_steps] == [["Relu"], ["Reshape", "Gather", "Reshape", "MatMul"]]
            assert runner.kernels[runner.plan.plugin_steps[1].name].name == "matmul.rows*reference"
        else:
            assert [s.ops for s in runner.plan.plugin_steps][1] == ["Gather"]
        theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], theirs, rtol=1e-6, atol=1e-6)


def test_the_gather_of_rows_a_linear_layer_writes_moves_before_it_and_the_layer_writes_the_chains_end(tmp_path):
    """Swin's window reverse after the attention's projection: the product works on each row alone, so it
    gathers its own A's rows (as it loads them) and writes the chain's end with its bias Add."""
    proto = shifted_windows("Add", source="Linear")
    simplified, done = simplify(proto)
    assert [n.op_type for n in simplified.graph.node] == ["Reshape", "Gather", "Reshape", "MatMul", "Add", "Add"]
    assert done.constants_folded["row-moving layout nodes"] == 9
    bias = simplified.graph.node[4]
    assert bias.name == "proj_bias" and bias.output[0] == "windowed"  # the bias Add writes the chain's end now
    runner = Runner(load_model(save(proto, tmp_path / "m.onnx")), 3, "cpu")
    assert runner.plan.plugin_steps[0].ops[:4] == ["Reshape", "Gather", "Reshape", "MatMul"]
    feeds = {"x": np.random.default_rng(3).standard_normal((3, SIDE, SIDE, CHANNELS)).astype(np.float32)}
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], theirs, rtol=1e-5, atol=1e-5)


def test_a_chain_that_moves_values_within_a_row_stays():
    """The window's channels reversed in pairs by the Transpose: no longer whole rows, so no row gather."""
    simplified, done = simplify(shifted_windows(perm_last=False))
    assert "row-moving layout nodes" not in done.constants_folded
    assert "Transpose" in [n.op_type for n in simplified.graph.node]


def test_a_chain_that_mixes_images_stays(tmp_path):
    """(N, T, C) transposed to (T, N, C) after a roll: a row's image depends on the batch, so no map holds at every batch."""
    constants = {"s0": [3], "e0": [5], "s1": [0], "e1": [3], "axis1": [1]}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Slice", ["r", "s0", "e0", "axis1"], ["tail"], name="tail"),
             helper.make_node("Slice", ["r", "s1", "e1", "axis1"], ["head"], name="head"),
             helper.make_node("Concat", ["tail", "head"], ["rolled"], name="roll", axis=1),
             helper.make_node("Transpose", ["rolled"], ["t"], name="sequence_first", perm=[1, 0, 2]),
             helper.make_node("Relu", ["t"], ["y"], name="after")]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, "N", CHANNELS])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    simplified, done = simplify(proto)
    assert "row-moving layout nodes" not in done.constants_folded
    assert [n.op_type for n in simplified.graph.node] == ["Relu", "Slice", "Slice", "Concat", "Transpose", "Relu"]
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 5, CHANNELS)).astype(np.float32)}
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(Runner(load_model(save(proto, tmp_path / "m.onnx")), 3, "cpu").run(feeds).outputs["y"], theirs)


def test_a_roll_along_one_axis_stays_one_concat_reading_its_slices_in_place():
    """One Slice + Concat pair before a computing step is one copy already (the Concat reads both slices
    in place): a Gather would be one too, so the chain stays."""
    constants = {**_roll_constants("roll_h", 2), "axis1": [1]}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), *_roll("r", 1, 2, "roll_h"),
             helper.make_node("Relu", ["roll_h"], ["y"], name="after")]
    graph = helper.make_graph(nodes, "roll", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIDE, SIDE, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SIDE, SIDE, CHANNELS])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    simplified, done = simplify(proto)
    assert "row-moving layout nodes" not in done.constants_folded
    assert [n.op_type for n in simplified.graph.node] == ["Relu", "Slice", "Slice", "Concat", "Relu"]


def padded_window_block(value_input: bool = False, value: float = 0.0):
    """A Swin block at a size its windows do not divide: x (N, 6, 6, 16) > LayerNorm > padded with zeros to 8 x 8 >
    4 x 4 windows > MatMul by W > Softmax across each window's tokens (the attention's stand-in) > MatMul by V and
    a bias Add (the projection) > windows reversed > cropped to 6 x 6 > the residual x added. `value_input`: the
    Pad's zero given as a float input, as torch's exporters write it."""
    rng = np.random.default_rng(5)
    constants = {"pads": [0, 0, 0, 0, 0, 2, 2, 0], "split": [-1, 2, WINDOW, 2, WINDOW, CHANNELS], "windows": [-1, WINDOW * WINDOW, CHANNELS],
                 "unsplit": [-1, 2, 2, WINDOW, WINDOW, CHANNELS], "image": [-1, SIDE, SIDE, CHANNELS], "zero": [0, 0], "six": [6, 6],
                 "spatial": [1, 2]}
    arrays = {"w": rng.standard_normal((CHANNELS, CHANNELS)), "v": rng.standard_normal((CHANNELS, CHANNELS)), "b": rng.standard_normal(CHANNELS),
              "gamma": 1 + 0.1 * rng.standard_normal(CHANNELS), "beta": rng.standard_normal(CHANNELS), "pad_value": value}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["normed"], name="norm", axis=-1),
             helper.make_node("Pad", ["normed", "pads", *(["pad_value"] if value_input else [])], ["padded"], name="pad", mode="constant"),
             helper.make_node("Reshape", ["padded", "split"], ["split_view"], name="split_view"),
             helper.make_node("Transpose", ["split_view"], ["partition"], name="partition", perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["partition", "windows"], ["windowed"], name="windowed"),
             helper.make_node("MatMul", ["windowed", "w"], ["qkv"], name="qkv"),
             helper.make_node("Softmax", ["qkv"], ["mixed"], name="mix", axis=1),
             helper.make_node("MatMul", ["mixed", "v"], ["projected"], name="proj"),
             helper.make_node("Add", ["projected", "b"], ["proj_out"], name="proj_bias"),
             helper.make_node("Reshape", ["proj_out", "unsplit"], ["unsplit_view"], name="unsplit_view"),
             helper.make_node("Transpose", ["unsplit_view"], ["reverse"], name="reverse", perm=[0, 1, 3, 2, 4, 5]),
             helper.make_node("Reshape", ["reverse", "image"], ["merged"], name="merged"),
             helper.make_node("Slice", ["merged", "zero", "six", "spatial"], ["cropped"], name="crop"),
             helper.make_node("Add", ["x", "cropped"], ["y"], name="residual")]
    graph = helper.make_graph(nodes, "padded_windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6, 6, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 6, CHANNELS])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()]
                              + [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("value_input", [False, True], ids=["default zero", "zero given"])
def test_padding_to_whole_windows_and_the_crop_back_are_rows_of_the_products_gathers(tmp_path, value_input):
    """The zero rows the padding makes come from a zero row padded on before the Gather (never through the
    product: they would come out as its bias); the crop is rows left out. Both products then gather as they
    load A: the first after the LayerNorm, the second with the residual Add in its epilogue."""
    proto = padded_window_block(value_input)
    simplified, done = simplify(proto)
    assert [n.op_type for n in simplified.graph.node] == ["LayerNormalization", "Reshape", "Pad", "Gather", "Reshape", "MatMul", "Softmax",
                                                          "Reshape", "Gather", "Reshape", "MatMul", "Add", "Add"]
    assert done.constants_folded["row-moving layout nodes"] == 8  # Pad, Reshape > Transpose > Reshape twice, the crop
    for batch in (1, 3):
        runner = Runner(load_model(save(proto, tmp_path / "m.onnx")), batch, "cpu")
        assert [runner.kernels[s.name].name for s in runner.plan.plugin_steps] == [
            "matmul.ln*rows*reference", "softmax.reference", "matmul.rows*reference+residual"]
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 6, 6, CHANNELS)).astype(np.float32)}
        theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], theirs, rtol=1e-5, atol=1e-5)


def test_a_roll_and_its_reverse_are_one_reshape():
    """Rolled by 2 and back by 6 along both axes of 8: every row where it was, so the chain is the Reshape it
    amounts to, and no copy is left."""
    constants = {**_roll_constants("roll_h", 2), **_roll_constants("roll_w", 2), **_roll_constants("back_h", 6),
                 **_roll_constants("back_w", 6), "axis1": [1], "axis2": [2]}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), *_roll("r", 1, 2, "roll_h"), *_roll("roll_h", 2, 2, "roll_w"),
             *_roll("roll_w", 1, 6, "back_h"), *_roll("back_h", 2, 6, "back_w"), helper.make_node("Relu", ["back_w"], ["y"], name="after")]
    graph = helper.make_graph(nodes, "rolls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIDE, SIDE, CHANNELS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SIDE, SIDE, CHANNELS])],
                              [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    simplified, done = simplify(proto)
    assert [n.op_type for n in simplified.graph.node] == ["Relu", "Reshape", "Relu"]
    assert done.constants_folded["row-moving layout nodes"] == 12
    x = np.random.default_rng(0).standard_normal((2, SIDE, SIDE, CHANNELS)).astype(np.float32)
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ours = ort.InferenceSession(simplified.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, theirs)


def test_a_pad_of_another_value_stays_and_the_windows_after_it_are_gathered(tmp_path):
    """Padding with 1.5 makes rows that are neither input rows nor zeros: the Pad stays a step of its own."""
    proto = padded_window_block(value_input=True, value=1.5)
    simplified, _ = simplify(proto)
    assert [n.name for n in simplified.graph.node if n.op_type == "Pad"] == ["pad"]
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 6, 6, CHANNELS)).astype(np.float32)}
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = Runner(load_model(save(proto, tmp_path / "m.onnx")), 2, "cpu").run(feeds).outputs["y"]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
