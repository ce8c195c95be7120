"""graph/passes/matmul_scales.py: the scalar scales of a product's computed operands move after it, and
only where nothing else reads the scaled tensor and both operands are computed."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import save
from opplugin.graph.model import load_model
from opplugin.runtime import Runner


def product(second_reader: bool = False, constant_b: bool = False) -> onnx.ModelProto:
    """y = MatMul(a * 0.5, b * 3) (b a constant with `constant_b`), and with `second_reader` also z = Relu(a * 0.5)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "half"), numpy_helper.from_array(np.array([3.0], np.float32), "three")]
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4, 8])]
    if constant_b:
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 8, 5]))
    nodes = [helper.make_node("Mul", ["a", "half"], ["a_scaled"], name="scale_a"),
             helper.make_node("Mul", ["three", "b"], ["b_scaled"], name="scale_b"),
             helper.make_node("MatMul", ["a_scaled", "b_scaled"], ["y"], name="product")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["a_scaled"], ["z"], name="relu"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "scaled", inputs, outputs, inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def run_against_onnxruntime(proto, path):
    model = load_model(save(proto, path))
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((3, 4, 8)).astype(np.float32)}
    if any(i.name == "b" for i in proto.graph.input):
        feeds["b"] = rng.standard_normal((3, 8, 5)).astype(np.float32)
    ours = Runner(model, 3, "cpu").run(feeds).outputs
    theirs = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, value in zip([o.name for o in proto.graph.output], theirs):
        np.testing.assert_allclose(ours[name], value, rtol=1e-5, atol=1e-6)
    return model


def test_both_scales_become_one_after_the_product(tmp_path):
    model = run_against_onnxruntime(product(), tmp_path / "m.onnx")
    assert model.simplification.constants_folded == {"MatMul operand scale": 2}
    assert [n.op_type for n in model.proto.graph.node] == ["MatMul", "Mul"]
    assert model.proto.graph.node[1].output[0] == "y"  # the product's name, its value scaled as before


def test_a_scaled_tensor_read_elsewhere_keeps_its_scale(tmp_path):
    model = run_against_onnxruntime(product(second_reader=True), tmp_path / "m.onnx")
    assert model.simplification.constants_folded == {"MatMul operand scale": 1}  # b's moves, a's stays for the Relu
    assert "a_scaled" in {o for n in model.proto.graph.node for o in n.output}


def test_a_product_by_a_constant_matrix_is_left_alone(tmp_path):
    model = run_against_onnxruntime(product(constant_b=True), tmp_path / "m.onnx")
    assert "MatMul operand scale" not in model.simplification.constants_folded
