"""The Gemm plugin under a run's --precision, on the CPU: the reference of a step a GPU would run in FP16, BF16 or TF32
rounds A and W to the format (core/number_formats.py's rounding, as check --precision's) and sums in FP32, so a CPU
run gives that precision's numbers; its variants are named for it and may be asked for."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import numpy_helper
from onnx_builders import save
from precision_cases import mlp_block_model, product_model

from opplugin.core.number_formats import REDUCED, UNIT_ROUNDOFF, round_to
from opplugin.errors import PluginError
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner

FP32_SUMS = 2.0 ** -24  # a float32 sum of k terms is off by at most about k times this of the terms' magnitudes


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def weight_as_k_by_n(proto, op: str) -> np.ndarray:
    w = numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "w")).astype(np.float32)
    return w if op == "MatMul" else w.T  # the Gemm is built with transB


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("precision", REDUCED)
def test_the_reference_rounds_a_and_w_to_the_format_and_sums_in_fp32(tmp_path, op, precision):
    k, n, batch = 64, 48, 40
    proto = product_model(k, n, op, seed=2)
    model = load_model(save(proto, tmp_path / f"{op}.onnx"))
    w = weight_as_k_by_n(proto, op)
    x = np.random.default_rng(7).standard_normal((batch, k)).astype(np.float32)  # fresh values, never zeros
    exact = x.astype(np.float64) @ w.astype(np.float64)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))  # what a product's error scales with
    runner = Runner(model, batch, "cpu", precision=precision)
    assert runner.plan_record().steps[0].implementation == f"{op.lower()}.reference.{precision}"
    reduced = runner.run({"x": x}).outputs["y"]
    fp32 = Runner(model, batch, "cpu").run({"x": x}).outputs["y"]
    assert reduced.dtype == np.float32 and reduced.shape == (batch, n)  # the model's dtype in and out
    u = UNIT_ROUNDOFF[precision]
    # each operand moves by at most u of itself, so each product a * w by at most 2u + u^2 of |a||w|; FP32's sums add their own
    assert np.all(np.abs(reduced - exact) <= (2 * u + u * u + 2 * k * FP32_SUMS) * magnitude)
    # and it did round: its error is the format's, far above FP32's, which a reference that rounds nothing would keep
    assert relative_l2(reduced, exact) > u / 8 and relative_l2(reduced, exact) > 50 * relative_l2(fp32, exact)
    # exactly the product of the rounded operands, up to FP32's sums
    rounded = round_to(x, precision).astype(np.float64) @ round_to(w, precision).astype(np.float64)
    assert np.all(np.abs(reduced - rounded) <= 2 * k * FP32_SUMS * magnitude)


def gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def test_bias_activation_and_residual_stay_fp32_after_the_rounded_product(tmp_path):
    """An MLP block in FP16 (both products' steps fuse bias, GELU and the residual): the run agrees with float64 on the
    rounded products and everything else exact, far closer than it is to the exact block."""
    proto = mlp_block_model(tokens=9, width=32, hidden=64, seed=5)
    runner = Runner(load_model(save(proto, tmp_path / "mlp.onnx")), 3, "cpu", precision="fp16")
    assert [(s.implementation, s.precision) for s in runner.plan_record().steps] == [
        ("matmul.reference.fp16+gelu", "fp16"), ("matmul.reference.fp16+residual", "fp16")]
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in proto.graph.initializer}
    x = np.random.default_rng(8).standard_normal((3, 9, 32)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]

    def block(rounded):
        h = gelu64(rounded(x) @ rounded(weights["w1"]) + weights["b1"])
        return x + (rounded(h) @ rounded(weights["w2"]) + weights["b2"])

    emulated = block(lambda v: round_to(np.asarray(v, np.float32), "fp16").astype(np.float64))
    exact = block(lambda v: np.asarray(v, np.float64))
    u = UNIT_ROUNDOFF["fp16"]
    assert relative_l2(got, emulated) < u / 32 < u / 8 < relative_l2(got, exact) < 4 * u


def test_a_reference_variant_may_be_asked_for_and_a_gpu_variant_says_which_the_cpu_runs(tmp_path):
    model = load_model(save(product_model(), tmp_path / "product.onnx"))
    runner = Runner(model, 4, "cpu", {"MatMul": "reference.bf16"})
    [step] = runner.plan_record().steps
    assert (step.implementation, step.precision, step.precision_reason) == ("matmul.reference.bf16", "bf16", None)
    # the kernel names its emulation, so that the exact path's rerun of a chunk builds the same one
    assert runner.kernels[step.name].variant == "reference.bf16"
    [plan_step] = make_plan(model, 4, CPU).plugin_steps
    with pytest.raises(PluginError, match=r"needs a CUDA device; the CPU device runs the numpy reference \(reference, reference.tf32"):
        plan_step.build(CPU, "wg_fp16")
