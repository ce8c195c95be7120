"""Text output that fits a terminal on networks with long names and long op chains,
and --wide for everything in full."""
from opplugin.texttable import elide_middle, summarise_ops, text_table


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
