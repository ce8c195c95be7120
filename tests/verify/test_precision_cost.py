"""check --precision tf32|fp16|bf16 (verify/precision_cost.py): rounding to the formats, each node's own error and the
error as it arrives against float64, the outputs' error and top-1 agreement, overflow counted, and what is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import save, tiny_cnn
from precision_cases import feeds_for, overflowing_model

from opplugin.cli import main
from opplugin.errors import InputError
from opplugin.verify.precision_cost import UNIT_ROUNDOFF, measure, round_to


def test_each_node_is_measured_and_bf16_costs_more_than_fp16():
    model = tiny_cnn()
    feeds = feeds_for(model)
    costs = {p: measure(model, feeds, p) for p in ("fp16", "bf16")}
    names = [n.name for n in model.graph.node]
    for precision, cost in costs.items():
        assert [n.name for n in cost.nodes] == names  # each node once, by its name in the file
        # every node's own error is at least about the format's rounding and within a few times of it
        assert all(0 < n.own < 8 * UNIT_ROUNDOFF[precision] for n in cost.nodes), [(n.name, n.own) for n in cost.nodes]
        [output] = cost.outputs.values()
        assert 0 < output["rel_l2"] < 8 * UNIT_ROUNDOFF[precision] and 0.5 <= output["top1_agreement"] <= 1
    assert np.median([n.own for n in costs["bf16"].nodes]) > 4 * np.median([n.own for n in costs["fp16"].nodes])
    assert [n["rank"] for n in costs["fp16"].as_json()["nodes"]] == list(range(1, len(names) + 1))


def test_tf32_rounds_the_operands_of_products_alone():
    cost = measure(tiny_cnn(), feeds_for(tiny_cnn()), "tf32")
    products = {"Conv", "Gemm"}
    assert all(0 < n.own < 8 * UNIT_ROUNDOFF["tf32"] for n in cost.nodes if n.op in products)
    assert all(n.own < 1e-6 for n in cost.nodes if n.op not in products)  # FP32 against float64 alone
    assert cost.ranking()[0].op in products


def test_values_past_the_format_are_counted_not_hidden():
    model = overflowing_model()
    feeds = {"x": 100 * feeds_for(model, 32)["x"]}
    # the infinities Relu keeps: FP16's x (3 significant digits) times 1000, past 65504 once rounded
    expected = int(np.count_nonzero(round_to(round_to(feeds["x"], "fp16") * 1000, "fp16") > 65504))
    half = measure(model, feeds, "fp16")
    assert half.outputs["y"]["nonfinite"] == expected > 0 and half.nodes[0].nonfinite > 0
    assert measure(model, feeds, "bf16").outputs["y"]["nonfinite"] == 0


def test_a_graph_that_cannot_run_node_by_node_is_refused_in_one_line():
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="my.ops", name="swish")], "custom",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])
    with pytest.raises(InputError, match="swish.*my.ops::Swish"):
        measure(model, {"x": np.ones((2, 4), np.float32)}, "fp16")


def test_check_precision_prints_the_cost_and_writes_its_json(tmp_path, capsys):
    report = tmp_path / "cost.json"
    assert main(["check", save(tiny_cnn(), tmp_path / "cnn.onnx"), "--precision", "bf16", "--batch", "8", "--data", "random",
                 "--json", str(report)]) == 0
    text = capsys.readouterr().out
    assert "BF16 cost of" in text and "on 8 images" in text and "top-1 agreement" in text
    payload = json.loads(report.read_text())
    assert payload["schema"] == "opplugin-precision-cost/1" and payload["emulated"] and payload["batch"] == 8
    assert payload["nodes"][0]["rank"] == 1 and payload["nodes"][0]["own"] >= payload["nodes"][-1]["own"]


@pytest.mark.parametrize("flags", [["--report", "page.html"], ["--save-outputs", "o.npz", "--keep", "conv1_out"], ["--atol", "0.1", "--variant", "const"]])
def test_check_precision_refuses_the_flags_of_the_comparison_with_onnxruntime(tmp_path, capsys, monkeypatch, flags):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "lenet86", "--precision", "fp16", *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and flags[0] in error and "against float64" in error and not (tmp_path / "page.html").exists()


def test_a_constant_of_shape_without_a_value_is_a_float64_zero_in_the_exact_result():
    """ONNX's default ConstantOfShape value is a float32 zero: the float64 reference made it float64 too, or an op
    mixing it with a float64 tensor (Swin-T's mask built from a ConstantOfShape) failed on the types."""
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["shape"], name="shape"),
                               helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros"),
                               helper.make_node("Add", ["x", "zeros"], ["y"], name="add")], "zeros",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    from onnx_builders import finish

    cost = measure(finish(graph), {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)}, "bf16")
    assert [n.name for n in cost.nodes] == ["zeros", "add"] and cost.outputs["y"]["rel_l2"] < UNIT_ROUNDOFF["bf16"]
