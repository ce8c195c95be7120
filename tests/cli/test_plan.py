"""opplugin plan: the steps a model splits into."""
from opplugin.cli import main


def test_plan_command(tiny_model_path, capsys):
    assert main(["plan", tiny_model_path, "--device", "cpu"]) == 0
    assert "conv1" in capsys.readouterr().out


# Bad flags and output paths: each is refused before the model is even loaded.


def test_unnamed_nodes_show_as_op_type_and_index(tmp_path, capsys):
    from onnx_builders import save, tiny_cnn

    proto = tiny_cnn()
    for node in proto.graph.node:
        node.name = ""
    assert main(["plan", save(proto, tmp_path / "tiny.onnx"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Conv_0" in out and "Conv_3" in out
