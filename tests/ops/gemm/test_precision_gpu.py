"""A run's --precision on a GPU: a Runner in FP16 or BF16 runs a transformer's MLP block (LayerNorm > Linear > GELU >
Linear, + x) on the half-precision wgmma families, the LayerNorm as the first product's prologue, each step within its
format's bound of float64.

GPU tests (marker `gpu`, skipped without a CUDA device; the families need Hopper's wgmma). As in
test_families_gpu.py: fresh random inputs (never zeros), each step's output poisoned with NaN before its call, so an
element its kernel never writes fails, and float64 as the reference.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import numpy_helper
from onnx_builders import save
from precision_cases import LN_EPSILON, mlp_block_model

from opplugin.core.number_formats import UNIT_ROUNDOFF
from opplugin.graph.model import load_model
from opplugin.ops.gemm import families
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu
FP32_SUMS = 2.0 ** -24  # a float32 sum of k terms is off by at most about k times this of the terms' magnitudes
GELU_SLOPE = 1.13  # GELU's steepest slope (1.129 near x = 2.4): how far an error in its input moves its output at most
BATCH, TOKENS, WIDTH, HIDDEN = 8, 50, 64, 256


def gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def layernorm64(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + LN_EPSILON) * scale + bias


def product_bound(a: np.ndarray, w: np.ndarray, precision: str) -> np.ndarray:
    """How far a product of a and w in `precision` may be from float64's: each operand rounded once (2u + u^2 of |a||w|),
    then FP32 sums over K, with slack."""
    u, k = UNIT_ROUNDOFF[precision], a.shape[-1]
    return (2.1 * u + 2 * k * FP32_SUMS) * (np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64)))


def poisoned(cupy, shape):
    return cupy.full(shape, np.nan, dtype=cupy.float32)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_runner_in_a_half_precision_runs_an_mlp_block_on_its_wgmma_family_within_its_bound(tmp_path, precision):
    import cupy

    if not families.wgmma_runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    family = families.PRECISION_FAMILIES[precision]
    proto = mlp_block_model(TOKENS, WIDTH, HIDDEN, layernorm=True)
    runner = Runner(load_model(save(proto, tmp_path / "mlp.onnx")), BATCH, "cuda", precision=precision)
    record = runner.plan_record()
    assert [(s.ops, s.precision, s.precision_reason) for s in record.steps] == [
        (("LayerNormalization", "MatMul", "Add", "Gelu"), precision, None), (("MatMul", "Add", "Add"), precision, None)]
    names = [s.implementation for s in record.steps]
    assert names[0].startswith(f"matmul.ln*{family}_") and names[1].startswith(f"matmul.{family}_"), names
    fc1, fc2 = runner.plan.plugin_steps
    assert runner.kernels[fc1.name].variant.startswith(family) and runner.kernels[fc2.name].variant.startswith(family)
    w = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in proto.graph.initializer}
    rng = np.random.default_rng()  # fresh values each run

    # the first step alone: the LayerNorm (FP32, then rounded with A), MatMul, its bias and GELU, on fresh inputs, its output poisoned
    x = rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)
    [h] = runner.kernels[fc1.name]([cupy.asarray(x), cupy.asarray(w["w1"])], None, out=poisoned(cupy, (BATCH, TOKENS, HIDDEN)))
    h = cupy.asnumpy(h)
    normed = layernorm64(x, w["ln_scale"], w["ln_bias"])
    exact = gelu64(normed @ w["w1"].astype(np.float64) + w["b1"])
    assert np.all(np.abs(h - exact) <= GELU_SLOPE * product_bound(normed, w["w1"], precision) + 1e-5 * (np.abs(exact) + 1))

    # the second alone: MatMul, its bias and the residual, on fresh inputs of its own
    hidden = rng.standard_normal((BATCH, TOKENS, HIDDEN)).astype(np.float32)
    residual = rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)
    [y] = runner.kernels[fc2.name]([cupy.asarray(hidden), cupy.asarray(w["w2"]), cupy.asarray(residual)], None,
                                   out=poisoned(cupy, (BATCH, TOKENS, WIDTH)))
    y = cupy.asnumpy(y)
    exact = residual + (hidden.astype(np.float64) @ w["w2"].astype(np.float64) + w["b2"])
    assert np.all(np.abs(y - exact) <= product_bound(hidden, w["w2"], precision) + 1e-6 * (np.abs(exact) + 1))

    # the whole block through the runner: the format's error, inputs and outputs in the model's dtype
    x = rng.standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    assert got.dtype == np.float32 and got.shape == x.shape
    h64 = gelu64(layernorm64(x, w["ln_scale"], w["ln_bias"]) @ w["w1"] + w["b1"])
    exact = x + (h64 @ w["w2"] + w["b2"])
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    u = UNIT_ROUNDOFF[precision]
    assert u / 16 < error < 4 * u, error  # it rounded, and no more than two products' worth
