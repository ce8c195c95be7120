"""Load-time folding of an inference BatchNormalization into the MatMul or Gemm before it
(graph/passes/linear_batchnorm.py): LeViT's token layout (Reshape to rows, BN, Reshape back or on into
heads), Gemm > BN and MatMul > BN; every fold computes what the original graph computes
(onnxruntime on both), and `check` compares each step with the original tensors; the
BatchNormalizations that normalise another axis, or whose product is read elsewhere, stay."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_builders import finish, save

from opplugin.cli import main
from opplugin.gpu.device import Device
from opplugin.graph.passes.linear_batchnorm import COUNT_KEY
from opplugin.graph.model import load_model
from opplugin.plan.partition import PluginStep, make_plan
from opplugin.graph.simplify import simplify

pytestmark = pytest.mark.filterwarnings("error::opplugin.graph.model.SimplificationWarning")

TOKENS, DEPTH, COLUMNS = 6, 5, 8
RNG = np.random.default_rng(7)


def constant(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def output(name: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def batchnorm_parameters(channels: int) -> list[onnx.TensorProto]:
    return [
        constant("bn_scale", RNG.uniform(0.5, 2.0, channels).astype(np.float32)),
        constant("bn_offset", RNG.standard_normal(channels).astype(np.float32)),
        constant("bn_mean", RNG.standard_normal(channels).astype(np.float32)),
        constant("bn_var", RNG.uniform(0.2, 3.0, channels).astype(np.float32)),
    ]


def batchnorm(source: str, output: str, **attributes) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [source, "bn_scale", "bn_offset", "bn_mean", "bn_var"], [output],
                            epsilon=1e-3, **attributes)


def token_model(restore_shape, second_reader: bool = False) -> onnx.ModelProto:
    """x (N, T, K) > MatMul (K, C) > Reshape (-1, C) > BN > Reshape `restore_shape` > Relu."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["product"]),
        helper.make_node("Reshape", ["product", "rows_shape"], ["rows"]),
        batchnorm("rows", "normal"),
        helper.make_node("Reshape", ["normal", "restore_shape"], ["restored"]),
        helper.make_node("Relu", ["restored"], ["y"]),
    ]
    outputs = [output("y", ["N", *restore_shape[1:]])]
    if second_reader:
        nodes.append(helper.make_node("Sigmoid", ["product"], ["z"]))
        outputs.append(output("z", ["N", TOKENS, COLUMNS]))
    initializers = [
        constant("w", RNG.standard_normal((DEPTH, COLUMNS)).astype(np.float32)),
        constant("rows_shape", np.array([-1, COLUMNS], np.int64)),
        constant("restore_shape", np.array(restore_shape, np.int64)),
        *batchnorm_parameters(COLUMNS),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", TOKENS, DEPTH])
    return finish(helper.make_graph(nodes, "tokens", [x], outputs, initializers))


def gemm_model(trans_b: int = 1, with_c: bool = True) -> onnx.ModelProto:
    """x (N, K) > Gemm (alpha 2, beta 0.5) > BN > Relu."""
    b = RNG.standard_normal((COLUMNS, DEPTH) if trans_b else (DEPTH, COLUMNS)).astype(np.float32)
    inputs = ["x", "b", "c"] if with_c else ["x", "b"]
    nodes = [
        helper.make_node("Gemm", inputs, ["product"], alpha=2.0, beta=0.5, transB=trans_b),
        batchnorm("product", "normal"),
        helper.make_node("Relu", ["normal"], ["y"]),
    ]
    initializers = [constant("b", b), *batchnorm_parameters(COLUMNS)]
    if with_c:
        initializers.append(constant("c", RNG.standard_normal(COLUMNS).astype(np.float32)))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DEPTH])
    return finish(helper.make_graph(nodes, "gemm", [x], [output("y", ["N", COLUMNS])], initializers))


def channel_axis_model() -> onnx.ModelProto:
    """x (N, T, K) > MatMul (K, C) > BN over axis 1, the tokens (T = C, so the parameters' shape fits both)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["product"]), batchnorm("product", "y")]
    initializers = [constant("w", RNG.standard_normal((DEPTH, COLUMNS)).astype(np.float32)), *batchnorm_parameters(COLUMNS)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", COLUMNS, DEPTH])
    return finish(helper.make_graph(nodes, "axis1", [x], [output("y", ["N", COLUMNS, COLUMNS])], initializers))


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def assert_same_outputs(original: onnx.ModelProto, folded: onnx.ModelProto, shape) -> None:
    x = RNG.uniform(-1, 1, shape).astype(np.float32)
    for theirs, ours in zip(run(original, x), run(folded, x)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_token_layout_folds_into_the_product_and_its_column_bias():
    model = token_model([-1, TOKENS, COLUMNS])
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Add", "Relu"]
    assert done.constants_folded == {COUNT_KEY: 1}
    assert folded.graph.node[1].output[0] == "restored"  # the tensor the Reshape back wrote
    assert_same_outputs(model, folded, (3, TOKENS, DEPTH))


def test_columns_split_into_heads_keep_the_reshape_and_record_a_view(tmp_path):
    model = token_model([-1, TOKENS, 2, COLUMNS // 2])
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Add", "Reshape", "Reshape", "Relu"]
    biased = folded.graph.node[1].output[0]
    assert done.views == {biased: ("normal", (0, 1), (), (-1, TOKENS, COLUMNS))}
    assert folded.graph.node[2].output[0] == "normal"
    assert_same_outputs(model, folded, (3, TOKENS, DEPTH))
    # every step, the biased product through its view included, against the original graph
    assert main(["check", save(model, tmp_path / "heads.onnx"), "--batch", "3", "--device", "cpu", "--data", "random"]) == 0


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("with_c", [True, False])
def test_gemm_takes_the_scale_in_b_and_the_shift_in_c(trans_b, with_c):
    model = gemm_model(trans_b, with_c)
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["Gemm", "Relu"] and done.constants_folded == {COUNT_KEY: 1}
    gemm = folded.graph.node[0]
    assert gemm.output[0] == "normal" and "beta" not in [a.name for a in gemm.attribute]
    assert_same_outputs(model, folded, (4, DEPTH))


def test_the_plan_fuses_the_shift_into_the_matmul_step(tmp_path):
    model = load_model(save(token_model([-1, TOKENS, COLUMNS]), tmp_path / "tokens.onnx"))
    plan = make_plan(model, 3, Device("cpu", "cpu"))
    products = [s for s in plan.steps if isinstance(s, PluginStep) and "MatMul" in s.ops]
    assert [s.ops for s in products] == [["MatMul", "Add", "Relu"]]
    assert main(["check", str(tmp_path / "tokens.onnx"), "--batch", "2", "--device", "cpu", "--data", "random"]) == 0


@pytest.mark.parametrize("model", [
    pytest.param(lambda: token_model([-1, TOKENS, COLUMNS], second_reader=True), id="product-read-twice"),
    pytest.param(channel_axis_model, id="normalises-another-axis"),
])
def test_a_batchnorm_that_cannot_fold_stays(model):
    model = model()
    folded, done = simplify(model)
    assert "BatchNormalization" in [n.op_type for n in folded.graph.node] and COUNT_KEY not in done.constants_folded
    assert_same_outputs(model, folded, (3, *[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]))


# --- a BatchNormalization before the linear layers: into their weights' rows ---


def heads_model() -> onnx.ModelProto:
    """x (N, K) > BN > two Gemm heads (one transB, alpha and beta set), summed: LeViT's classifier."""
    nodes = [
        batchnorm("x", "normal"),
        helper.make_node("Gemm", ["normal", "head_w", "head_b"], ["head"], transB=1),
        helper.make_node("Gemm", ["normal", "dist_w", "dist_b"], ["dist"], alpha=0.5, beta=2.0),
        helper.make_node("Add", ["head", "dist"], ["y"]),
    ]
    initializers = [
        constant("head_w", RNG.standard_normal((COLUMNS, DEPTH)).astype(np.float32)),
        constant("head_b", RNG.standard_normal(COLUMNS).astype(np.float32)),
        constant("dist_w", RNG.standard_normal((DEPTH, COLUMNS)).astype(np.float32)),
        constant("dist_b", RNG.standard_normal(COLUMNS).astype(np.float32)),
        *batchnorm_parameters(DEPTH),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DEPTH])
    return finish(helper.make_graph(nodes, "heads", [x], [output("y", ["N", COLUMNS])], initializers))


def maps_model(second_reader: bool = False) -> onnx.ModelProto:
    """x (N, C, 2, 3) > BN > Flatten > MatMul (C*6, COLUMNS): a face model's embedding layer."""
    nodes = [
        batchnorm("x", "normal"),
        helper.make_node("Flatten", ["normal"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    outputs = [output("y", ["N", COLUMNS])]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["flat"], ["z"]))
        outputs.append(output("z", ["N", DEPTH * 6]))
    initializers = [constant("w", RNG.standard_normal((DEPTH * 6, COLUMNS)).astype(np.float32)), *batchnorm_parameters(DEPTH)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DEPTH, 2, 3])
    return finish(helper.make_graph(nodes, "maps", [x], outputs, initializers))


def test_a_batchnorm_before_two_heads_folds_into_both():
    model = heads_model()
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["Gemm", "Gemm", "Add"] and done.constants_folded == {COUNT_KEY: 1}
    assert all(n.input[0] == "x" and "beta" not in [a.name for a in n.attribute] for n in folded.graph.node[:2])
    assert_same_outputs(model, folded, (4, DEPTH))


def test_a_batchnorm_of_maps_before_flatten_folds_and_the_flatten_is_a_view(tmp_path):
    model = maps_model()
    folded, done = simplify(model)
    assert [n.op_type for n in folded.graph.node] == ["Flatten", "MatMul", "Add"]
    flat = folded.graph.node[0].output[0]
    assert done.views == {flat: ("x", (0, 1, 2, 3), (), (-1, DEPTH * 6))}
    assert_same_outputs(model, folded, (3, DEPTH, 2, 3))
    assert main(["check", save(model, tmp_path / "maps.onnx"), "--batch", "3", "--device", "cpu", "--data", "random"]) == 0


def test_a_batchnorm_whose_features_another_node_reads_stays():
    model = maps_model(second_reader=True)
    folded, done = simplify(model)
    assert "BatchNormalization" in [n.op_type for n in folded.graph.node] and COUNT_KEY not in done.constants_folded
