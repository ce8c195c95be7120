"""Comparison with onnxruntime: figures, pass/fail, and that a wrong kernel is caught."""
import numpy as np

from opplugin.check import check, compare
from opplugin.model import load_model
from opplugin.ops.conv import ConvPlugin, ReferenceConvKernel
from opplugin.runner import Runner


def _feeds(batch):
    return {"x": np.random.default_rng(5).uniform(-1, 1, (batch, 3, 12, 12)).astype(np.float32)}


def test_compare_figures():
    expected = np.array([1.0, -2.0, 4.0], np.float32)
    good = compare(expected + 1e-6, expected)
    assert good["passed"] and good["max_abs_error"] < 2e-6 and good["rel_l2"] < 1e-6
    bad = compare(expected * 1.1, expected)
    assert not bad["passed"]
    assert abs(bad["max_rel_error"] - 0.1) < 1e-6
    assert abs(bad["max_abs_error"] - 0.4) < 1e-6
    assert bad["mismatches"] == 3


def test_compare_nan_and_inf_must_sit_where_onnxruntime_has_them():
    expected = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare(expected.copy(), expected)["passed"]
    assert not compare(np.array([0.0, np.inf, 1.0], np.float32), expected)["passed"]
    assert not compare(np.array([np.nan, -np.inf, 1.0], np.float32), expected)["passed"]
    assert not compare(np.array([np.nan, np.inf, np.nan], np.float32), expected)["passed"]


def test_compare_shape_mismatch():
    result = compare(np.zeros((2, 3)), np.zeros((3, 2)))
    assert not result["passed"] and "shape" in result["error"]


def test_check_passes_each_plugin_step_and_the_output(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 8, "cpu")
    labels = np.arange(8) % 5
    result = check(runner, _feeds(8), labels)
    assert result.passed
    # conv1's step runs Conv > Relu > MaxPool: it is compared at the pool's output
    assert [r["tensor"] for r in result.records] == ["p1", "r2", "y"]
    assert result.top1_agreement == 1.0
    assert result.accuracy == result.reference_accuracy


class _OffByOne(ReferenceConvKernel):
    def __call__(self, inputs, stream=None):
        return [super().__call__(inputs)[0] + 1.0]


class _BrokenConv(ConvPlugin):
    def build(self, node, device, variant=None, fused=()):
        kernel = super().build(node, device, fused=fused)
        return _OffByOne(kernel.spec, kernel.epilogue)


def test_check_catches_a_wrong_kernel(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cpu", registry={"Conv": _BrokenConv()})
    result = check(runner, _feeds(4))
    assert not result.passed
    failing = {r["tensor"] for r in result.records if not r["passed"]}
    assert {"p1", "r2"} <= failing
