"""`check` verdicts arbitrated by float64: a step that differs from onnxruntime beyond the
tolerance passes when, on the same inputs, it is no further from the float64 result than
onnxruntime is; a wrong kernel still fails, and `check --json` names the first bad node."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish, save
from opplugin.verify.check import check
from opplugin.cli import main
from opplugin.verify.first_bad import arbitrate, first_bad, isolate_steps
from opplugin.graph.model import load_model
from opplugin.ops.conv import reference
from opplugin.ops.conv.plugin import ConvPlugin, ReferenceConvKernel, residual_operand
from opplugin.runtime import Runner


def ill_conditioned(layers: int = 3, channels: int = 32, size: int = 8, seed: int = 0):
    """x * 0.01 + 1e4, then `layers` of Conv > Sigmoid with random zero-sum filters: each
    first-layer output sums 288 terms near 1e4 that cancel to about 0.1, where float32
    accumulation loses about 1e-2 before the Sigmoid."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Mul", ["x", "hundredth"], ["small"], name="scale"),
             helper.make_node("Add", ["small", "offset"], ["x0"], name="shift")]
    constants = [numpy_helper.from_array(np.array(0.01, np.float32), "hundredth"),
                 numpy_helper.from_array(np.array(1e4, np.float32), "offset")]
    for layer in range(layers):
        w = rng.standard_normal((channels, channels, 3, 3))
        w -= w.mean(axis=(1, 2, 3), keepdims=True)
        constants.append(numpy_helper.from_array(w.astype(np.float32), f"w{layer}"))
        out = "y" if layer == layers - 1 else f"s{layer}"
        nodes += [helper.make_node("Conv", [f"x{layer}", f"w{layer}"], [f"c{layer}"], name=f"conv{layer}", pads=[1, 1, 1, 1]),
                  helper.make_node("Sigmoid", [f"c{layer}"], [out], name=f"sigmoid{layer}")]
        if layer < layers - 1:
            nodes.append(helper.make_node("Identity", [out], [f"x{layer + 1}"], name=f"next{layer}"))
    graph = helper.make_graph(nodes, "ill_conditioned",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, size, size])],
                              initializer=constants)
    return finish(graph)


class _Float64Conv(ReferenceConvKernel):
    """A Conv more exact than onnxruntime's: float64 arithmetic, rounded once to float32."""

    def __call__(self, inputs, stream=None):
        x, w = (np.asarray(a, np.float64) for a in inputs[:2])
        b = None if len(inputs) < 3 or inputs[2] is None else np.asarray(inputs[2], np.float64)
        spec = self.spec
        y = reference.conv(x, w, b, spec.strides, spec.pads, spec.dilations, spec.group)
        return [self.epilogue.apply(y, residual_operand(inputs, self.epilogue)).astype(np.float32)]


class _Float64ConvPlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _Float64Conv(kernel.spec, kernel.epilogue)


class _OffByOne(ReferenceConvKernel):
    def __call__(self, inputs, stream=None):
        return [super().__call__(inputs)[0] + 1e-2]


class _OffByOnePlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _OffByOne(kernel.spec, kernel.epilogue)


def _judged(path, plugin, batch=4):
    runner = Runner(load_model(path), batch, "cpu", registry={"Conv": plugin})
    feeds = {"x": np.random.default_rng(7).standard_normal((batch, 32, 8, 8)).astype(np.float32)}
    result = check(runner.run, runner.plan_record(batch), feeds)
    before = result.passed
    verdicts = isolate_steps(runner, feeds, result, 1e-4, 1e-3)
    judged = arbitrate(result, verdicts)
    assert result.passed == before and not result.arbitrated  # the result checked is left as it was
    return before, judged, verdicts


def test_a_step_more_exact_than_onnxruntime_passes_by_float64(tmp_path):
    before, result, verdicts = _judged(save(ill_conditioned(), tmp_path / "ill.onnx"), _Float64ConvPlugin())
    assert not before  # beyond the tolerance of onnxruntime...
    conv0 = next(v for v in verdicts if v.step == "conv0")
    assert not conv0.own_passed and conv0.exact is not None
    ours, theirs = conv0.exact["opplugin"]["max_abs_error"], conv0.exact["onnxruntime"]["max_abs_error"]
    assert ours < theirs and theirs > 1e-3  # ...because onnxruntime is the less exact side
    assert conv0.closer_to_exact and first_bad(verdicts) is None
    assert result.passed  # ...so the verdict is a pass, and says why
    arbitrated = [r for r in result.records if r.get("arbitration")]
    assert arbitrated and all(not r["passed_against_onnxruntime"] for r in arbitrated)
    record = next(r for r in result.records if r["step"] == "conv0")
    assert record["float64_max_abs_opplugin"] == ours and "float64" in record["arbitration"]


def test_a_wrong_kernel_still_fails_after_float64_arbitration(tmp_path):
    _, result, verdicts = _judged(save(ill_conditioned(), tmp_path / "ill.onnx"), _OffByOnePlugin())
    assert not result.passed
    bad = first_bad(verdicts)
    assert bad is not None and bad.step == "conv0" and bad.exact is not None and not bad.closer_to_exact
    assert not any(r.get("arbitration") for r in result.records)


@pytest.mark.parametrize("wrong", [False, True])
def test_check_json_carries_the_first_bad_node_and_the_arbitration(tmp_path, monkeypatch, capsys, wrong):
    import opplugin.registry as registry

    monkeypatch.setitem(registry._registry, "Conv", _OffByOnePlugin() if wrong else _Float64ConvPlugin())
    path, report = save(ill_conditioned(), tmp_path / "ill.onnx"), tmp_path / "check.json"
    assert main(["check", path, "--batch", "4", "--device", "cpu", "--json", str(report)]) == (1 if wrong else 0)
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["arbitrated_by_float64"] and data["passed"] == (not wrong)
    alone = data["steps_alone"]
    assert [s["step"] for s in alone["steps"]] == ["scale", "conv0", "conv1", "conv2"]  # scale: the Mul > Add group
    if wrong:
        assert alone["first_bad_node"]["step"] == "conv0" and not alone["first_bad_node"]["sound"]
        assert "First bad node: conv0" in out
    else:
        assert alone["first_bad_node"] is None and alone["steps"][1]["acquitted_by_float64"]
        assert "passed by float64 arbitration (*)" in out and "PASS" in out
        assert any(r["arbitration"] for r in data["records"])


def test_a_passing_check_has_no_steps_alone(tmp_path, tiny_model_path):
    report = tmp_path / "check.json"
    assert main(["check", tiny_model_path, "--batch", "2", "--device", "cpu", "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["steps_alone"] is None and not data["arbitrated_by_float64"]
    assert all(r["arbitration"] is None for r in data["records"])
