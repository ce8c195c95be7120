"""check --precision mixed --budget (verify/mixed_precision.py): the fewest nodes along the FP16 ranking kept in FP32
to meet a budget against float64, nothing kept where FP16 meets it, no assignment where even FP32 misses it, and the
budget's own refusals."""
from __future__ import annotations

import json

import pytest
from onnx_builders import save, tiny_cnn
from precision_cases import feeds_for, overflowing_model

from opplugin.cli import main
from opplugin.errors import InputError
from opplugin.verify.mixed_precision import Budget, plan_mixed


@pytest.mark.parametrize("text", ["rel_l2", "rel_l2=-1", "top1=1.5", "l2=1e-3", "rel_l2=nan"])
def test_a_budget_that_means_nothing_is_refused(text):
    with pytest.raises(InputError, match="rel_l2=E"):
        Budget.parse(text)


def test_where_fp16_meets_the_budget_nothing_is_kept():
    plan = plan_mixed(tiny_cnn(), feeds_for(tiny_cnn()), Budget.parse("rel_l2=1e-2"))
    assert plan.met and plan.kept == [] and plan.passes == 1 and plan.outputs == plan.low_outputs


def test_a_tight_budget_keeps_the_dearest_nodes_and_is_met():
    model, feeds = tiny_cnn(), feeds_for(tiny_cnn())
    [all_fp16] = plan_mixed(model, feeds, Budget.parse("rel_l2=1e-2")).low_outputs.values()
    budget = Budget("rel_l2", all_fp16["rel_l2"] / 3)
    plan = plan_mixed(model, feeds, budget)
    [kept_some] = plan.outputs.values()
    assert plan.met and 0 < len(plan.kept) < plan.nodes and kept_some["rel_l2"] <= budget.value < all_fp16["rel_l2"]
    assert [k.own for k in plan.kept] == sorted((k.own for k in plan.kept), reverse=True)  # along the ranking


def test_the_text_names_the_first_kept_nodes_and_counts_the_rest_by_op():
    from opplugin.verify.mixed_precision import LISTED, Kept, MixedPlan, format_text

    error = {"rel_l2": 1e-3, "nonfinite": 0, "top1_agreement": None}
    kept = [Kept(f"mm{i}", "MatMul", 1e-3) for i in range(LISTED + 3)] + [Kept("ln", "LayerNormalization", 5e-4)]
    text = format_text(MixedPlan("m", 2, Budget.parse("rel_l2=1e-3"), {"y": error}, {"y": error}, kept, 100, 7))
    assert "mm0 " in text and f"mm{LISTED - 1} " in text and f"mm{LISTED} " not in text
    assert text.rstrip().endswith("... and 4 more (3 MatMul, 1 LayerNormalization; all in --json)")


def test_overflow_is_kept_in_fp32_until_the_outputs_are_finite():
    model = overflowing_model()
    plan = plan_mixed(model, {"x": 100 * feeds_for(model, 32)["x"]}, Budget.parse("rel_l2=1e-2"))
    assert plan.low_outputs["y"]["nonfinite"] > 0 and plan.outputs["y"]["nonfinite"] == 0 and plan.kept


def test_a_budget_below_fp32s_own_error_is_met_by_no_assignment(tmp_path, capsys):
    path = save(tiny_cnn(), tmp_path / "cnn.onnx")
    report = tmp_path / "mixed.json"
    assert main(["check", path, "--precision", "mixed", "--budget", "rel_l2=1e-14", "--batch", "4", "--data", "random",
                 "--json", str(report)]) == 1
    assert "No assignment meets the budget" in capsys.readouterr().out
    payload = json.loads(report.read_text())
    assert payload["schema"] == "opplugin-mixed-precision/1" and payload["met"] is False


@pytest.mark.parametrize("flags, says", [(["--precision", "mixed"], "needs --budget"), (["--budget", "rel_l2=1e-3"], "needs --budget"),
                                         (["--precision", "fp16", "--budget", "top1=0.99"], "needs --budget")])
def test_mixed_and_its_budget_come_together(flags, says, capsys):
    assert main(["check", "lenet86", *flags]) == 2
    assert says in capsys.readouterr().err


def test_a_top1_budget_needs_a_classifier_output(tmp_path, capsys):
    from onnx import TensorProto, helper
    from onnx_builders import finish

    maps = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "maps",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 4])])
    path = save(finish(maps), tmp_path / "maps.onnx")
    assert main(["check", path, "--precision", "mixed", "--budget", "top1=0.99", "--batch", "2", "--data", "random"]) == 2
    assert "no (images, classes) output" in capsys.readouterr().err


def test_the_kept_nodes_are_what_a_mixed_runner_keeps_in_fp32_each_with_why():
    model, feeds = tiny_cnn(), feeds_for(tiny_cnn())
    [all_fp16] = plan_mixed(model, feeds, Budget.parse("rel_l2=1e-2")).low_outputs.values()
    plan = plan_mixed(model, feeds, Budget("rel_l2", all_fp16["rel_l2"] / 3))
    first = plan.kept[0]
    assert list(plan.keep_fp32()) == [k.name for k in plan.kept]
    assert plan.keep_fp32()[first.name] == f"{first.name} ({first.op}) errs {first.own:.1e} alone in FP16, {first.own / 2 ** -11:.1f}x its rounding"
    assert Budget.parse("top1=0.990").as_flag() == "top1=0.99" and Budget.parse("rel_l2=1e-3").as_flag() == "rel_l2=0.001"
