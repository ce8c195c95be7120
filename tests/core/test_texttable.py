"""Text output that fits a terminal on networks with long names and long op chains,
and --wide for everything in full."""
import json

import pytest

from onnx_builders import long_named_chain, save
from opplugin.cli import main
from opplugin.core.texttable import LINE_WIDTH, elide_middle, summarise_ops, text_table


def test_a_run_of_one_op_is_counted():
    assert summarise_ops(["ConstantOfShape"] * 836) == "ConstantOfShape x836"
    assert summarise_ops(["Conv", "Relu", "MaxPool"]) == "Conv > Relu > MaxPool"


def test_a_long_mixed_chain_keeps_its_first_and_last_ops_and_counts_the_rest():
    ops = ["Flatten", *["Neg", "Abs"] * 100, "Softmax"]
    text = summarise_ops(ops, width=50)
    assert len(text) <= 50
    assert text.startswith("Flatten > ") and text.endswith(" > Softmax")
    shown = text.count("Neg") + text.count("Abs") + 2
    assert f"... {len(ops) - shown} more" in text
    assert summarise_ops(ops, width=None) == " > ".join(ops)


def test_elide_middle_keeps_both_ends():
    name = "features/denseblock4/denselayer16/" + "x" * 100 + "/conv2/Conv"
    short = elide_middle(name, 40)
    assert len(short) == 40 and short.startswith("features/dense") and short.endswith("conv2/Conv") and "..." in short
    assert elide_middle("conv1", 40) == "conv1" and elide_middle(name, None) == name


def test_a_table_narrows_its_text_columns_to_fit_and_keeps_numbers_whole():
    rows = [["n" * 300, "y" * 80, "12345.678"], ["short", "ok", "1.0"]]
    lines = text_table(["name", "what", "ms"], rows, right=[2], width=60)
    assert max(len(line) for line in lines) <= 60
    assert lines[2].endswith("12345.678") and lines[3].startswith("short ")
    assert text_table(["name", "what", "ms"], rows, right=[2])[2].startswith("n" * 300)


@pytest.fixture
def long_model(tmp_path):
    return save(long_named_chain(), tmp_path / "long.onnx")


COMMANDS = {
    "plan": ["plan"],
    "run": ["run", "--repeat", "1"],
    "check": ["check"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_no_line_is_wider_than_a_terminal_by_default(command, long_model, capsys):
    assert main([*COMMANDS[command], long_model, "--batch", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    widest = max(out.splitlines(), key=len)
    assert len(widest) <= LINE_WIDTH, widest
    assert "..." in out  # the names were long enough to be cut
    if command != "check":  # check's table shows tensors, not op chains
        assert "Softsign x" in out
    if command == "run":  # the output is a feature map, no classifier's: no top-1 figure
        assert "Against onnxruntime CPU: PASS at atol 0.0001, rtol 0.001  max abs error" in out and "top-1" not in out


@pytest.mark.parametrize("command", COMMANDS)
def test_wide_prints_every_name_and_op_in_full(command, long_model, capsys):
    model = long_named_chain()
    assert main([*COMMANDS[command], long_model, "--batch", "2", "--device", "cpu", "--wide"]) == 0
    out = capsys.readouterr().out
    assert model.graph.node[0].name in out and model.graph.node[-1].name in out
    # the plan lists the last Conv's input; check compares the first Conv's fused step at its Relu's output
    tensor = {"plan": model.graph.node[-1].input[0], "check": model.graph.node[1].output[0]}.get(command)
    assert tensor is None or tensor in out
    if command != "check":
        assert " > ".join(["Softsign"] * 199) in out


def test_json_carries_full_names_and_chains(long_model, tmp_path, capsys):
    assert main(["run", long_model, "--batch", "2", "--device", "cpu", "--repeat", "1", "--json", str(tmp_path / "r.json")]) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["steps"]
    model = long_named_chain()
    assert rows[0]["step"] == model.graph.node[0].name
    assert rows[1]["ops"] == " > ".join(["Softsign"] * 199 + ["Sign", "Ceil"] * 100)


def test_a_step_reading_many_long_named_tensors_lists_those_that_fit_and_counts_the_rest(tmp_path, capsys):
    from onnx import TensorProto, helper

    from onnx_builders import finish

    names = [f"input_{i}_" + "very_long_activation_name_" * 4 for i in range(12)]
    graph = helper.make_graph(
        [helper.make_node("Sum", names, ["y"], name="sum")],
        "many_inputs",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 4]) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    path = save(finish(graph), tmp_path / "many.onnx")
    assert main(["plan", path, "--device", "cpu"]) == 0
    inputs_line = next(line for line in capsys.readouterr().out.splitlines() if "in: " in line)
    assert len(inputs_line) <= LINE_WIDTH and inputs_line.endswith("more") and "input_0_" in inputs_line
    assert main(["plan", path, "--device", "cpu", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert all(n in wide for n in names)
