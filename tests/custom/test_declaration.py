"""A custom op's declaration read against nodes: attributes over their defaults, inputs and
outputs counted, shapes from the shape function, the reference in float64, and every misuse
one DeclarationError line that names the node and the op."""
import numpy as np
import onnx
import pytest
from onnx import helper

from custom_models import split_max_op, swish_op
from opplugin.custom import REQUIRED, CustomOp, DeclarationError
from opplugin.gpu.device import select_device
from opplugin.registry import NodeInfo, TensorInfo, op_key

CPU = select_device("cpu")


def node_info(node: onnx.NodeProto, shapes) -> NodeInfo:
    inputs = [TensorInfo(name, shape, np.dtype(np.float32)) for name, shape in zip(node.input, shapes)]
    return NodeInfo(node, inputs, [TensorInfo(o, shapes[0], np.dtype(np.float32)) for o in node.output],
                    {a.name: helper.get_attribute_value(a) for a in node.attribute})


def test_an_op_outside_onnx_is_filed_under_its_domain_and_onnx_ops_under_their_type():
    assert swish_op().op_type == "com.example::Swish2"
    assert op_key("", "Conv") == op_key("ai.onnx", "Conv") == "Conv"
    assert op_key("com.microsoft", "Gelu") == "com.microsoft::Gelu"


def test_attributes_take_their_defaults_where_the_node_leaves_them_out():
    op = swish_op()
    plain = helper.make_node("Swish2", ["x"], ["y"], name="s", domain="com.example")
    given = helper.make_node("Swish2", ["x"], ["y"], name="s", domain="com.example", beta=3.0)
    assert op.make_spec(node_info(plain, [(2, 3)])) == {"beta": 1.0}
    assert op.make_spec(node_info(given, [(2, 3)])) == {"beta": 3.0}


@pytest.mark.parametrize(("node", "message"), [
    (helper.make_node("Swish2", ["x"], ["y"], name="s", domain="com.example", gamma=3.0),
     "s: com.example::Swish2 declares no attribute 'gamma' (it declares beta)"),
    (helper.make_node("Swish2", ["x", "z"], ["y"], name="s", domain="com.example"),
     "s: com.example::Swish2 takes 1 inputs (X), the node gives 2"),
    (helper.make_node("Swish2", ["x"], ["y", "w"], name="s", domain="com.example"),
     "s: com.example::Swish2 declares 1 outputs (Y), the node has 2"),
])
def test_a_node_that_does_not_fit_its_declaration_is_one_line(node, message):
    with pytest.raises(DeclarationError) as caught:
        swish_op().make_spec(node_info(node, [(2, 3)] * len(node.input)))
    assert str(caught.value) == message


def test_a_required_attribute_the_node_lacks_is_named():
    op = CustomOp("com.example", "Scale", inputs=["X"], outputs=["Y"], attributes={"factor": REQUIRED}, reference=lambda x, factor: x * factor)
    node = helper.make_node("Scale", ["x"], ["y"], name="scale", domain="com.example")
    with pytest.raises(DeclarationError, match="needs attribute 'factor', which the node does not give"):
        op.make_spec(node_info(node, [(2, 3)]))


def test_an_optional_input_may_be_left_out_and_the_shape_function_gives_each_output():
    op = split_max_op()
    x = TensorInfo("x", (2, 8, 5, 5), np.dtype(np.float32))
    op.check_arity("halves", 1, 2)
    op.check_arity("halves", 2, 2)
    types = op.output_types("halves", [x], {})
    assert [(t.shape, t.dtype) for t in types] == [((2, 4, 5, 5), np.float32)] * 2


def test_a_shape_function_that_raises_or_gives_too_few_outputs_is_one_line():
    broken = CustomOp("com.example", "Broken", inputs=["X"], outputs=["A", "B"], shapes=lambda x: 1 / 0)
    short = CustomOp("com.example", "Short", inputs=["X"], outputs=["A", "B"], shapes=lambda x: (x.shape, x.dtype))
    x = TensorInfo("x", (2, 3), np.dtype(np.float32))
    with pytest.raises(DeclarationError, match=r"^n: the shape function of com.example::Broken raised ZeroDivisionError"):
        broken.output_types("n", [x], {})
    with pytest.raises(DeclarationError, match="gave 1 outputs, it declares 2"):
        short.output_types("n", [x], {})


def test_the_reference_computes_in_float64_and_its_failures_name_the_node():
    seen = []
    op = CustomOp("com.example", "Probe", inputs=["X"], outputs=["Y"], reference=lambda x: seen.append(x.dtype) or x * 2)
    [y] = op.call_reference("p", [np.ones((2, 2), np.float32)], {})
    assert seen == [np.float64] and y.dtype == np.float64 and np.all(y == 2)
    raising = CustomOp("com.example", "Raises", inputs=["X"], outputs=["Y"], reference=lambda x: x[99, 99])
    with pytest.raises(DeclarationError, match=r"^p: the reference of com.example::Raises raised IndexError"):
        raising.call_reference("p", [np.ones((2, 2), np.float32)], {})


def test_on_the_cpu_the_reference_is_the_only_variant_that_can_run():
    op = swish_op()
    node = helper.make_node("Swish2", ["x"], ["y"], name="s", domain="com.example")
    info = node_info(node, [(2, 3)])
    assert op.variant_notes(info, CPU) == {"reference": None}
    kernel = op.build(info, CPU)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    [y] = kernel([x])
    assert y.dtype == np.float32 and np.allclose(y, x / (1 + np.exp(-x)), rtol=1e-6)
    with pytest.raises(DeclarationError, match="has no implementation 'triton'"):
        op.build(info, CPU, "triton")


def test_an_implementation_must_be_one_and_named_once():
    with pytest.raises(DeclarationError, match="is not an implementation"):
        swish_op().implement(lambda x: x)


def test_an_onnx_op_takes_its_inputs_outputs_and_attribute_defaults_from_its_schema():
    conv = CustomOp("", "Conv", reference=lambda x, w, b=None, **attributes: x)
    assert conv.op_type == "Conv" and conv.input_names == ["X", "W", "B"] and conv.required_inputs == 2
    assert conv.output_names == ["Y"]
    assert conv.attributes["group"] == 1 and conv.attributes["auto_pad"] == "NOTSET" and conv.attributes["pads"] is None
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", pads=[1, 1, 1, 1])
    assert conv.make_spec(node_info(node, [(1, 3, 8, 8), (4, 3, 3, 3)]))["pads"] == [1, 1, 1, 1]


def test_a_tuned_choice_holds_for_every_chunk_of_the_batch():
    from custom_models import swish_node

    op = swish_op()
    cuda = type("FakeCuda", (), {"is_cuda": True, "name": "NVIDIA H200"})()
    assert op.choice_key(swish_node(op, batch=10000), cuda) == op.choice_key(swish_node(op, batch=2268), cuda)
    assert op.choice_key(swish_node(op, beta=1.0), cuda) != op.choice_key(swish_node(op, beta=2.0), cuda)


def test_stored_choices_are_kept_beside_others_and_read_again_when_the_file_changes(tmp_path):
    from opplugin.custom import choices

    path = tmp_path / "custom_ops.json"
    assert choices.load(path) == {}
    choices.store({"a": "cupy"}, path)
    choices.store({"b": "cuda:x.cu"}, path)
    assert choices.load(path) == {"a": "cupy", "b": "cuda:x.cu"}
    path.write_text("not json")
    assert choices.load(path) == {}
