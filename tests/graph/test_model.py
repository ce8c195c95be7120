"""Loading, validating and shape inference; every bad file gives a ModelError that says what is wrong."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_builders import finish, save, tiny_cnn
from opplugin.errors import InputError, ModelError
from opplugin.graph.model import SHIPPED_MODELS, load_model


def test_loads_and_infers_shapes_for_a_batch(tiny_model_path):
    model = load_model(tiny_model_path)
    assert [i.name for i in model.inputs] == ["x"]
    assert model.input_shape() == ("N", 3, 12, 12)
    assert model.sample_shape() == (3, 12, 12)
    tensors = model.infer(7)
    assert tensors["c1"].shape == (7, 4, 12, 12)
    assert tensors["p1"].shape == (7, 4, 6, 6)
    assert tensors["y"].shape == (7, 5)
    assert tensors["w1"].dtype == np.float32


def test_node_infos_carry_constants_and_attributes(tiny_model_path):
    infos = load_model(tiny_model_path).node_infos(2)
    conv = infos[0]
    assert conv.op_type == "Conv" and conv.name == "conv1"
    assert conv.attributes["pads"] == [1, 1, 1, 1]
    assert set(conv.constants) == {"w1", "b1"}
    assert conv.inputs[0].shape == (2, 3, 12, 12)


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope.onnx")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        load_model(path)


def test_truncated_file(tmp_path, tiny_model_path):
    data = open(tiny_model_path, "rb").read()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(path)


def test_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 20)
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(path)


def test_folder_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match="folder"):
        load_model(tmp_path)


def test_a_pipe_is_not_a_model_and_is_not_opened(tmp_path):
    os.mkfifo(tmp_path / "model.onnx")  # opening it would wait for a writer forever
    with pytest.raises(ModelError, match="model.onnx is not a regular file"):
        load_model(tmp_path / "model.onnx")


def test_checker_failure(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.graph.node[0].op_type = "NoSuchOp"
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match="checker"):
        load_model(path)


def test_non_float_input_is_refused(tmp_path):
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    path = save(finish(graph), tmp_path / "int.onnx")
    with pytest.raises(ModelError, match="float32"):
        load_model(path)


def test_bad_batch(tiny_model_path):
    model = load_model(tiny_model_path)
    for batch in (0, -3):
        with pytest.raises(InputError, match="positive"):
            model.infer(batch)


def test_fixed_batch_must_match(tmp_path):
    proto = tiny_cnn()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    path = save(proto, tmp_path / "fixed.onnx")
    model = load_model(path)
    assert model.infer(1)["y"].shape == (1, 5)
    with pytest.raises(InputError, match="fixed batch of 1"):
        model.infer(4)


def test_shipped_models_resolve_by_name():
    for name in SHIPPED_MODELS:
        model = load_model(name)
        assert model.name == name
        assert len(model.sample_shape()) == 3


def _save_with_external_data(proto, folder):
    folder.mkdir()
    onnx.save_model(proto, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return folder / "model.onnx"


def test_external_data_loads_from_any_working_directory(tmp_path, monkeypatch):
    path = _save_with_external_data(tiny_cnn(), tmp_path / "tiny")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    model = load_model(path)
    # the weights are in the proto itself now: sub-models handed to onnxruntime carry them
    np.testing.assert_array_equal(model.initializers["w1"], onnx.numpy_helper.to_array(tiny_cnn().graph.initializer[0]))
    assert not any(t.data_location == TensorProto.EXTERNAL for t in model.proto.graph.initializer)


def test_missing_external_data_is_a_model_error(tmp_path):
    path = _save_with_external_data(tiny_cnn(), tmp_path / "tiny")
    (tmp_path / "tiny" / "weights.bin").unlink()
    with pytest.raises(ModelError, match="external data"):
        load_model(path)


def test_checker_message_names_the_node(tmp_path):
    proto = tiny_cnn()
    proto.graph.node[0].attribute.append(helper.make_attribute("bogus", 1))
    path = tmp_path / "bad.onnx"
    onnx.save(proto, str(path))
    with pytest.raises(ModelError) as info:
        load_model(path)
    message = str(info.value)
    assert "Unrecognized attribute: bogus" in message and "Name: conv1" in message and "\n" not in message


def test_unnamed_nodes_get_op_type_and_index(tmp_path):
    proto = tiny_cnn()
    for node in proto.graph.node:
        node.name = ""
    proto.graph.node[1].name = "Relu_3"  # a name already taken is not given twice
    model = load_model(save(proto, tmp_path / "tiny.onnx"))
    names = [node.name for node in model.nodes]
    assert names[:4] == ["Conv_0", "Relu_3", "MaxPool_2", "Conv_3"]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("file_name, graph_name, expected", [
    ("tiny.onnx", "tiny_cnn", "tiny"),
    ("model.onnx", "tiny_cnn", "tiny_cnn"),
    ("model.onnx", "main_graph", "zoo_net"),  # both generic: the folder's name
])
def test_display_name_comes_from_the_graph_when_the_file_name_says_nothing(tmp_path, file_name, graph_name, expected):
    proto = tiny_cnn()
    proto.graph.name = graph_name
    folder = tmp_path / "zoo_net"
    folder.mkdir()
    assert load_model(save(proto, folder / file_name)).name == expected


def test_fixed_batch_and_the_default_batch(tmp_path):
    from opplugin.gpu.device import CPU, Device
    from opplugin.graph.model import choose_batch, default_batch

    gpu = Device("cuda", "Test GPU", "9.0")
    dynamic = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    assert dynamic.fixed_batch is None
    assert (default_batch(dynamic, gpu), default_batch(dynamic, CPU)) == (32, 8)
    assert default_batch(load_model("lenet86"), CPU) == 10000
    proto = tiny_cnn()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    fixed = load_model(save(proto, tmp_path / "fixed.onnx"))
    assert fixed.fixed_batch == 3 and default_batch(fixed, gpu) == 3
    assert choose_batch(fixed, None, CPU, default=1) == 3 and choose_batch(fixed, 3, CPU) == 3
    assert choose_batch(dynamic, None, CPU, default=1) == 1 and choose_batch(dynamic, 5, CPU) == 5
    with pytest.raises(InputError, match=r"--batch 4: fixed has a fixed batch of 3 .*leave --batch out or give 3"):
        choose_batch(fixed, 4, CPU)


def test_the_batch_of_a_fixed_model_is_its_data_input_s_even_after_weight_inputs(tmp_path):
    from onnx_builders import single_conv

    proto = single_conv((2, 2, 7, 7), (3, 2, 3, 3), {}, bias=False, weights_as_input=True)
    proto.graph.input.insert(0, proto.graph.input.pop(1))  # the weights first: [w (3, ...), x (2, ...)]
    model = load_model(save(proto, tmp_path / "conv.onnx"))
    assert [v.name for v in model.inputs] == ["w", "x"] and model.weight_inputs() == ["w"]
    assert model.fixed_batch == 2 and model.batch_input.name == "x"
    assert model.infer(2)["y"].shape == (2, 3, 5, 5)
    with pytest.raises(InputError, match="input 'x' has a fixed batch of 2"):
        model.infer(3)


def test_shape_inference_runs_once_per_batch(monkeypatch):
    import onnx.shape_inference

    calls = []
    infer_shapes = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or infer_shapes(*a, **k))
    model = load_model("lenet86")
    first = model.infer(4)
    first.clear()  # the caller's copy
    assert model.infer(4) and len(calls) == 1
    model.infer(5)
    assert len(calls) == 2


def test_planning_never_copies_or_serialises_the_weights(tmp_path, monkeypatch):
    """Shape inference and the checker get the graph without its weights (graph/bare.py), and
    the whole simplified proto is never made: light_vgg19's plan went from 12 s and 4 GB to 2 s."""
    import onnx.checker
    import onnx.shape_inference

    from onnx_builders import conv_bn_relu
    import opplugin.graph.model as model_module
    from opplugin.gpu.device import select_device
    from opplugin.plan.partition import make_plan

    proto = conv_bn_relu(maps=64, size=10)  # a BatchNormalization to fold: the graph changes at load
    weights = sum(t.ByteSize() for t in proto.graph.initializer)
    seen, whole = [], []
    for module, name in ((onnx.shape_inference, "infer_shapes"), (onnx.checker, "check_model")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda m, *a, _real=real, **k: seen.append(m.ByteSize()) or _real(m, *a, **k))
    made = model_module.with_initializers
    monkeypatch.setattr(model_module, "with_initializers", lambda *a: whole.append(1) or made(*a))
    path = save(proto, tmp_path / "m.onnx")
    seen.clear()  # saving checked the whole model; from here on, opplugin's calls
    model = load_model(path)
    assert model.simplification.batchnorms_folded == 1
    make_plan(model, 2, select_device("cpu"))
    # the file's model is checked once as loaded; every later call gets the skeleton
    assert len(seen) > 1 and seen[0] > weights and max(seen[1:]) < weights / 4 and not whole
    assert model.proto.graph.initializer and whole  # made when asked for


def test_loading_a_model_imports_no_op_plan_or_runtime_module():
    """The graph layer stands alone: loading (and simplifying) a model needs none of the layers above it.
    A fresh interpreter, so that no other test's imports count."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import opplugin.graph.model as model\n"
            "model.load_model('lenet86')\n"
            "print(sorted(n for n in sys.modules if n.startswith(('opplugin.ops', 'opplugin.runtime', 'opplugin.plan'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
