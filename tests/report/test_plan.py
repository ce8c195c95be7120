"""`plan --json`: one entry per step, as `run` reports it, with shapes and, for every
node left to onnxruntime, the reason."""
import dataclasses
import json

import pytest

from opplugin.report import plan
from opplugin.cli import main
from opplugin.graph.model import load_model
from opplugin.ops.conv import ConvPlugin
from opplugin.runtime import Runner


def plan_json(tmp_path, *argv):
    path = tmp_path / "plan.json"
    assert main(["plan", *argv, "--device", "cpu", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_plan_json_of_a_shipped_model(tmp_path, capsys):
    data = plan_json(tmp_path, "lenet86", "--batch", "5")
    assert data["schema"] == "opplugin-plan/7" and data["model"] == "lenet86" and data["batch"] == 5
    assert data["device"]["kind"] == "cpu" and data["onnxruntime_provider"] == "CPUExecutionProvider"
    steps = data["steps"]
    assert all(tuple(step) == plan.STEP_KEYS for step in steps)
    assert [s["kind"] for s in steps] == ["plugin"] * 4
    assert steps[2]["views"] == ["flatten_out = Flatten of pool2_out"]  # fc1 reads it as a view
    conv1 = steps[0]
    assert conv1["name"] == "conv1" and conv1["ops"] == ["Conv", "Relu", "MaxPool"]
    assert conv1["implementation"].startswith("conv.reference")
    assert conv1["inputs"] == [{"name": "input", "shape": [5, 1, 86, 86]}]
    assert [n["op"] for n in conv1["nodes"]] == conv1["ops"] and all(n["reason"] is None for n in conv1["nodes"])
    # `plan` builds no kernel, so it gives no cost: `run --json` does
    assert conv1["flops"] is None and conv1["bytes_moved"] is None and conv1["variants"] is None
    fc1, fc2 = steps[2], steps[3]
    assert fc1["implementation"] == "gemm.reference+relu" and fc1["inputs"] == [{"name": "pool2_out", "shape": [5, 16, 8, 8]}]
    assert fc2["ops"] == ["Gemm", "Softmax"] and fc2["implementation"] == "gemm.reference+softmax"
    assert [n["op"] for n in fc2["nodes"]] == fc2["ops"]
    assert data["fallbacks"] == {}


def test_plan_json_names_the_implementations_run_reports(tmp_path, capsys):
    plan = plan_json(tmp_path, "ece408_high", "--batch", "4")
    assert main(["run", "ece408_high", "--batch", "4", "--device", "cpu", "--repeat", "1", "--no-compare",
                 "--json", str(tmp_path / "run.json")]) == 0
    run = json.loads((tmp_path / "run.json").read_text())
    ran = {r["step"]: r for r in run["steps"] if r["kind"] != "copy"}
    assert {s["name"]: s["implementation"] for s in plan["steps"]} == {n: r["implementation"] for n, r in ran.items()}
    assert {s["name"]: [t["shape"] for t in s["inputs"]] for s in plan["steps"]} == {n: r["input_shapes"] for n, r in ran.items()}


def test_plan_json_leaves_the_text_as_it_was(tmp_path, capsys):
    assert main(["plan", "lenet86", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    plan_json(tmp_path, "lenet86")
    assert capsys.readouterr().out == text


class PickyConvPlugin(ConvPlugin):
    """The built-in Conv plugin, except that it will not run conv2."""

    def supports(self, node, device):
        return "conv2 is not for this test plugin" if node.name == "conv2" else super().supports(node, device)


def test_a_node_a_plugin_refuses_carries_the_plugins_reason():
    runner = Runner(load_model("lenet86"), 3, "cpu", registry={"Conv": PickyConvPlugin()})
    data = plan.build_plan_report(runner.plan_record(3))
    steps = {s["name"]: s for s in data["steps"]}
    assert steps["conv1"]["kind"] == "plugin"
    left = [n for s in data["steps"] if s["kind"] == "onnxruntime" for n in s["nodes"]]
    reasons = {n["name"]: n["reason"] for n in left}
    assert reasons["conv2"] == "conv2 is not for this test plugin"
    assert reasons["relu2"] == "no plugin for Relu"
    assert data["fallbacks"] == {"conv2": "conv2 is not for this test plugin"}
    assert data["batch"] == 3 and steps["conv1"]["inputs"][0]["shape"] == [3, 1, 86, 86]


def test_variant_notes_go_with_their_step():
    runner = Runner(load_model("lenet86"), 2, "cpu")
    notes = {"conv1": {"baseline": None, "const": "not on a Tuesday"}}
    data = plan.build_plan_report(dataclasses.replace(runner.plan_record(2), variant_notes=notes))
    assert data["steps"][0]["variants"] == notes["conv1"] and data["steps"][1]["variants"] is None


class UnbuildableConvPlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        raise AssertionError("plan must not build kernels")


def test_plan_text_and_json_build_no_kernel(tmp_path, capsys, monkeypatch):
    from opplugin import registry

    monkeypatch.setitem(registry._registry, "Conv", UnbuildableConvPlugin())
    data = plan_json(tmp_path, "lenet86", "--batch", "2")
    text = capsys.readouterr().out
    assert data["steps"][0]["implementation"].startswith("conv.reference+relu+maxpool2")
    assert "runs: conv.reference+relu+maxpool2" in text


@pytest.mark.parametrize("batch", ["0", "-2"])
def test_plan_json_with_a_bad_batch_writes_nothing(tmp_path, batch, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", "lenet86", "--batch", batch, "--device", "cpu", "--json", str(path)]) == 2
    assert not path.exists()
