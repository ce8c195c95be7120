"""`check` verdicts arbitrated by float64: a step that differs from onnxruntime beyond the
tolerance passes when, on the same inputs, it is no further from the float64 result than
onnxruntime is over the whole tensor; a wrong kernel still fails, on any CPU, and `check --json`
names the first bad node. A NaN weight that onnxruntime's Conv skips over the padding is told
apart from a wrong kernel, and the verdict says why once."""
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
from opplugin.verify.closeness import WORST_SLACK
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
    """A little wrong everywhere: 1e-2 more than the reference, on this net well within the FP32
    bound of the Conv's huge cancelling terms where its Sigmoid is steep, far beyond it where flat."""

    def __call__(self, inputs, stream=None):
        return [super().__call__(inputs)[0] + 1e-2]


class _OffByOnePlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _OffByOne(kernel.spec, kernel.epilogue)


class _SequentialConv(ReferenceConvKernel):
    """A correct FP32 Conv that sums in another order than onnxruntime and BLAS: one float32
    multiply and one float32 add per tap, channel by channel (stride 1, pads as given)."""

    def __call__(self, inputs, stream=None):
        x, w = (np.asarray(a, np.float32) for a in inputs[:2])
        (top, left), (taps_h, taps_w) = self.spec.pads[:2], w.shape[2:]
        padded = np.pad(x, [(0, 0), (0, 0), (top, top), (left, left)])
        n, channels, h, width = x.shape
        acc = np.zeros((n, w.shape[0], h, width), np.float32)
        for c in range(channels):
            for i in range(taps_h):
                for j in range(taps_w):
                    acc += padded[:, None, c, i:i + h, j:j + width] * w[None, :, c, i, j, None, None]
        return [self.epilogue.apply(acc, residual_operand(inputs, self.epilogue))]


class _SequentialConvPlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _SequentialConv(kernel.spec, kernel.epilogue)


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
    assert not conv0.own_passed and conv0.closeness is not None
    ours, theirs = conv0.closeness.max_abs["opplugin"], conv0.closeness.max_abs["onnxruntime"]
    assert ours < 1e-3 * theirs and theirs > 1e-3  # ...because onnxruntime is the less exact side, by far
    assert conv0.closer_to_exact and first_bad(verdicts) is None
    assert result.passed  # ...so the verdict is a pass, and says why
    arbitrated = [r for r in result.records if r.get("arbitration")]
    assert arbitrated and all(not r["passed_against_onnxruntime"] for r in arbitrated)
    record = next(r for r in result.records if r["step"] == "conv0")
    assert record["float64_max_abs_opplugin"] == ours and "float64" in record["arbitration"]


def test_a_correct_kernel_summing_in_another_order_passes_by_float64(tmp_path):
    # a worst element may well land further from float64 than onnxruntime's (the old rule's
    # coin toss); over the whole tensor it is no further, with room to spare
    before, result, verdicts = _judged(save(ill_conditioned(), tmp_path / "ill.onnx"), _SequentialConvPlugin())
    conv0 = next(v for v in verdicts if v.step == "conv0")
    assert not before and not conv0.own_passed  # it differs from onnxruntime beyond the tolerance
    c = conv0.closeness
    assert c.max_abs["opplugin"] > 1e-3 and not c.within_tolerance  # and from float64: only the comparison acquits it
    assert c.worst_excess < 0.5 and c.norm_ratio < 0.85 * c.norm_limit and c.worst_ratio < 0.6 * WORST_SLACK
    assert conv0.sound and first_bad(verdicts) is None and result.passed


def test_a_kernel_a_little_wrong_everywhere_fails_on_any_cpu(tmp_path):
    _, result, verdicts = _judged(save(ill_conditioned(), tmp_path / "ill.onnx"), _OffByOnePlugin())
    assert not result.passed
    bad = first_bad(verdicts)
    assert bad is not None and bad.step == "conv0" and bad.closeness is not None and not bad.closer_to_exact
    assert not any(r.get("arbitration") for r in result.records)
    # the margin: not a third digit of one element, but a quarter of the elements or more, each
    # a hundred times or more beyond onnxruntime's own error plus the FP32 bound
    c = bad.closeness
    assert c.beyond >= c.elements // 4 and c.worst_excess >= 100
    assert "beyond onnxruntime's error plus the FP32 bound" in c.why()


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
        bad = alone["first_bad_node"]
        assert bad["step"] == "conv0" and not bad["sound"] and not bad["acquitted_by_float64"]
        assert bad["float64"]["elements_beyond"] >= bad["float64"]["elements"] // 4 and bad["float64"]["worst_excess"] >= 100
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


# --- NaN and Inf: float64 sides with one of them, and the verdict says why, once ------------------

def _conv_with_a_nan_weight(tmp_path):
    """A padded 3x3 Conv whose weight at a corner tap is NaN: over the padding, ONNX's definition
    multiplies it by zero (NaN), onnxruntime's Conv skips the tap (a number)."""
    from onnx_builders import single_conv

    model = single_conv(("N", 2, 6, 6), (4, 2, 3, 3), {"pads": [1, 1, 1, 1]}, bias=False)
    w = numpy_helper.to_array(model.graph.initializer[0]).copy()
    w[1, 0, 0, 0] = np.nan
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w"))
    return save(model, tmp_path / "nan_weight.onnx")


def test_a_nan_weight_onnxruntime_skips_over_the_padding_passes_and_says_why_once(tmp_path, capsys):
    report = tmp_path / "check.json"
    assert main(["check", _conv_with_a_nan_weight(tmp_path), "--batch", "2", "--device", "cpu", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "PASS at" in out and "FAIL at" not in out and "No plugin step is wrong" in out
    assert out.count("skips the taps over its padding") == 1  # the reason, once
    data = json.loads(report.read_text())
    conv = next(r for r in data["records"] if r["step"] == "conv")
    assert conv["passed"] and not conv["passed_against_onnxruntime"] and conv["nan_ours"] > conv["nan_onnxruntime"] > 0
    [step] = data["steps_alone"]["steps"]
    assert step["sound"] and step["float64"]["nan_inf_as_float64"] == {"opplugin": True, "onnxruntime": False}
    assert "padding" in step["nan_inf_differ_because"]


class _NaNAtOneElement(ReferenceConvKernel):
    def __call__(self, inputs, stream=None):
        y = super().__call__(inputs)[0].copy()
        y[0, 0, 2, 2] = np.nan
        return [y]


class _NaNAtOneElementPlugin(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _NaNAtOneElement(kernel.spec, kernel.epilogue)


def test_a_nan_neither_onnxruntime_nor_float64_has_fails_and_names_its_step(tmp_path, monkeypatch, capsys):
    import opplugin.registry as registry
    from onnx_builders import single_conv

    monkeypatch.setitem(registry._registry, "Conv", _NaNAtOneElementPlugin())
    path = save(single_conv(("N", 2, 6, 6), (4, 2, 3, 3), {"pads": [1, 1, 1, 1]}, bias=False), tmp_path / "conv.onnx")
    assert main(["check", path, "--batch", "2", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAIL at" in out and "First bad node: conv" in out and "NaN or Inf where float64 has none" in out
    assert "its own NaN and Inf differ from onnxruntime's" in out
    assert "No plugin step is wrong" not in out and "sound alone" not in out


def test_the_verdict_never_says_no_step_is_wrong_beside_a_comparison_that_still_fails():
    from opplugin.verify.check import CheckResult
    from opplugin.verify.first_bad import StepVerdict, format_verdicts

    sound = StepVerdict("conv0", "conv.reference", {"passed": True, "max_abs_error": 0.0}, None)
    failing = CheckResult([{"tensor": "y", "step": "model output", "implementation": "whole model", "passed": False,
                            "max_abs_error": float("nan"), "nan_ours": 3, "nan_onnxruntime": 1}])
    head = format_verdicts([sound], 2, arbitrate(failing, [sound])).splitlines()[0]
    assert head.startswith("Every plugin step is sound alone, yet 1 comparison still fails: NaN or Inf out of place")
    assert "No plugin step" not in head


def test_nan_as_many_but_elsewhere_is_not_passed_as_a_difference_of_size():
    from opplugin.verify.check import CheckResult, ErrorStats
    from opplugin.verify.first_bad import StepVerdict

    ours, theirs = np.array([np.nan, 1.0, 2.0], np.float32), np.array([1.0, np.nan, 2.0], np.float32)
    record = {"tensor": "y", "step": "model output", "implementation": "whole model", **ErrorStats().add(ours, theirs).result(),
              "nan_ours": 1, "nan_onnxruntime": 1}
    assert record["same_specials"] is False and record["passed"] is False
    sound = StepVerdict("conv0", "conv.reference", {"passed": True, "max_abs_error": 0.0}, None)
    [judged] = arbitrate(CheckResult([record]), [sound]).records
    assert judged["passed"] is False and "arbitration" not in judged
