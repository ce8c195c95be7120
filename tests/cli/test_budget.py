"""run and plan --precision mixed --budget (cli/budget.py): the nodes the budget keeps in FP32 are found on the run's own
inputs (at most PRECISION_IMAGES of them), the steps that compute them stay FP32 and say why, every other step runs as
under fp16; the run's JSON records the budget and the kept nodes; the flags come together or not at all, in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx_builders import save
from precision_cases import two_products_model

from opplugin.cli import main
from opplugin.cli.budget import PRECISION_IMAGES

OVERFLOWS = "kept in FP32 by the budget: fc2 (MatMul) overflows FP16 alone; fc2_bias (Add) overflows FP16 alone"


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    """fc1 > Relu, then fc2 > Add past FP16's range: a budget keeps the second step in FP32."""
    return save(two_products_model(scale=1e6), tmp_path_factory.mktemp("budget") / "two_products.onnx")


def test_plan_with_a_tight_budget_keeps_the_step_it_needs_in_fp32_and_runs_the_other_in_fp16(overflowing, tmp_path, capsys):
    assert main(["plan", overflowing, "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=1e-2",
                 "--json", str(tmp_path / "p.json")]) == 0
    captured = capsys.readouterr()
    # the plan measures the images a run measures: on the CPU a free batch runs 8 (the plan itself is at batch 1)
    assert "Finding which nodes stay FP32 for budget rel_l2=0.01 on 8 images" in captured.err
    first = captured.out.splitlines()[0]
    assert first.endswith(", precision mixed (budget rel_l2=0.01: 2 of 4 nodes kept in fp32; fp16 where a step has a kernel "
                          "in it, the rest fp32)")
    assert "precision: fp32: kept in FP32 by the budget: fc2 (MatMul) overflows FP16 alone" in captured.out.replace("\n", " ")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema"] == "opplugin-plan/7" and data["precision"] == "mixed"
    assert [(s["name"], s["precision"], s["precision_reason"]) for s in data["steps"]] == [("fc1", "fp16", None), ("fc2", "fp32", OVERFLOWS)]
    assert [k["name"] for k in data["budget"]["kept_in_fp32"]] == ["fc2", "fc2_bias"] and data["budget"]["images"] == 8


def test_a_loose_budget_keeps_no_node_and_every_step_with_a_kernel_runs_in_fp16(tmp_path, capsys):
    path = save(two_products_model(), tmp_path / "two_products.onnx")
    assert main(["plan", path, "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=0.1", "--json", str(tmp_path / "p.json")]) == 0
    assert "budget rel_l2=0.1: 0 of 4 nodes kept in fp32" in capsys.readouterr().out.splitlines()[0]
    data = json.loads((tmp_path / "p.json").read_text())
    assert [(s["name"], s["precision"], s["precision_reason"]) for s in data["steps"]] == [("fc1", "fp16", None), ("fc2", "fp16", None)]
    assert data["budget"]["kept_in_fp32"] == []


def test_run_records_the_budget_and_the_kept_nodes_and_holds_the_run_to_fp16s_rule(overflowing, tmp_path, capsys):
    x = np.random.default_rng(2).random((PRECISION_IMAGES + 8, 32)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert main(["run", overflowing, "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=1e-2",
                 "--load-inputs", str(tmp_path / "x.npz"), "--json", str(tmp_path / "r.json")]) == 0
    captured = capsys.readouterr()
    # the search measures the first PRECISION_IMAGES of the run's own inputs; the run takes them all
    assert f"Finding which nodes stay FP32 for budget rel_l2=0.01 on {PRECISION_IMAGES} images" in captured.err
    assert captured.out.splitlines()[0].endswith(", precision mixed (budget rel_l2=0.01: 2 of 4 nodes kept in fp32; fp16 where a "
                                                 "step has a kernel in it)")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "opplugin-run/8" and data["precision"] == "mixed" and data["batch"] == PRECISION_IMAGES + 8
    budget = data["budget"]
    assert (budget["flag"], budget["kind"], budget["value"], budget["images"]) == ("rel_l2=0.01", "rel_l2", 0.01, PRECISION_IMAGES)
    assert [(k["name"], k["op"], k["why"]) for k in budget["kept_in_fp32"]] == [
        ("fc2", "MatMul", "fc2 (MatMul) overflows FP16 alone"), ("fc2_bias", "Add", "fc2_bias (Add) overflows FP16 alone")]
    assert budget["outputs"]["y"]["rel_l2"] <= 0.01 and budget["outputs_all_fp16"]["y"]["nonfinite"] > 0
    assert [row["implementation"] for row in data["steps"]] == ["matmul.reference.fp16+relu", "matmul.reference"]
    agreement = data["agreement"]
    assert agreement["passed"] and (agreement["atol"], agreement["rtol"], agreement["widened_for"]) == (2 ** -7, 2 ** -7, "fp16")


def test_a_budget_even_fp32_misses_stops_the_run_in_one_line(overflowing, capsys):
    assert main(["run", overflowing, "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=1e-14"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("opplugin: error: --budget rel_l2=1e-14: no assignment meets it on these 8 images, FP32 throughout "
                              "gives y relative L2 ") and err[-1].endswith("; give a wider budget")


@pytest.mark.parametrize("command", ["run", "plan"])
@pytest.mark.parametrize("flags, says", [
    (["--precision", "mixed"], "--precision mixed needs --budget rel_l2=E or top1=A: what the outputs must meet against float64"),
    (["--budget", "rel_l2=1e-3"], "--budget rel_l2=1e-3: applies to --precision mixed, not fp32"),
    (["--precision", "fp16", "--budget", "top1=0.99"], "--budget top1=0.99: applies to --precision mixed, not fp16"),
    (["--precision", "mixed", "--budget", "top1=2"], "--budget top1=2: rel_l2=E (a relative L2 error above 0) or top1=A"),
])
def test_mixed_and_its_budget_come_together_in_one_line(command, flags, says, capsys):
    assert main([command, "lenet86", "--device", "cpu", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"opplugin: error: {says}") and err.count("\n") == 1


def test_the_search_chooses_among_the_nodes_the_run_lowers_so_a_budget_its_fp16_meets_keeps_nothing(tmp_path, capsys):
    """lenet86 under fp16 lowers conv2's step (16 maps: wg_fp16's 16-map tile) and fc1's (conv1's 4 maps and fc2's fused
    Softmax have no FP16 kernel). A budget that this run's FP16 meets keeps no node, where check's search, every node
    in FP16, keeps most of them for it."""
    assert main(["check", "lenet86", "--precision", "mixed", "--budget", "rel_l2=3e-4", "--json", str(tmp_path / "c.json")]) == 0
    assert len(json.loads((tmp_path / "c.json").read_text())["kept_in_fp32"]) > 0
    capsys.readouterr()
    assert main(["plan", "lenet86", "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=3e-4", "--json", str(tmp_path / "p.json")]) == 0
    assert "budget rel_l2=0.0003: 0 of 6 nodes kept in fp32, 5 more without an fp16 kernel" in capsys.readouterr().out.splitlines()[0]
    budget = json.loads((tmp_path / "p.json").read_text())["budget"]
    assert budget["kept_in_fp32"] == [] and budget["in_fp32_anyway"] == 5 and budget["outputs"]["probabilities"]["rel_l2"] <= 3e-4
    # a tighter budget keeps among those six alone: conv2's and fc1's steps, whose reasons say the budget
    assert main(["plan", "lenet86", "--device", "cpu", "--precision", "mixed", "--budget", "rel_l2=1e-4", "--json", str(tmp_path / "t.json")]) == 0
    kept = {k["name"] for k in json.loads((tmp_path / "t.json").read_text())["budget"]["kept_in_fp32"]}
    assert kept and kept <= {"conv2", "relu2", "pool2", "flatten", "fc1", "relu3"} and not kept & {"conv1", "fc2"}
