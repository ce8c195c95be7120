"""MatMul of any rank on the GPU against float64 and onnxruntime, outputs poisoned with NaN first.

GPU tests (marker `gpu`, skipped without a CUDA device)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from matmul_cases import BIAS_CASES, CASES, fresh_inputs, matmul_model
from opplugin.gpu.device import current_cuda_device
from opplugin.ops.activation import Activation
from reduction_cases import planned

pytestmark = pytest.mark.gpu


def float64_oracle(a, b, activation, softmax, bias=None):
    y = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if activation:
        y = Activation.plain(activation).apply(y)
    if softmax:
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        y = e / e.sum(axis=-1, keepdims=True)
    return y


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 6])
def test_matmul_matches_float64_and_onnxruntime(case, batch):
    import cupy

    a_shape, b_shape, constant, act, softmax = CASES[case]
    model = matmul_model(a_shape, b_shape, constant, act, softmax)
    device = current_cuda_device()
    plan = planned(model, batch, device)
    [step] = plan.steps
    kernel = step.build(device)
    feeds = fresh_inputs(model, batch, batch + len(case))
    operands = [feeds[n] if n in feeds else plan.model.initializers[n] for n in step.inputs]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = cupy.full(theirs.shape, np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(x) for x in operands], None, out=out)
    got = cupy.asnumpy(y)
    assert y.data.ptr == out.data.ptr and not np.isnan(got).any()
    exact = float64_oracle(*operands, act, softmax)
    k = a_shape[-1]
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6 * k)
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=2e-6 * k)


@pytest.mark.parametrize("case", list(BIAS_CASES))
@pytest.mark.parametrize("batch", [1, 6])
def test_a_linear_layers_bias_add_fuses_as_the_gemm_bias(case, batch):
    import cupy

    a_shape, b_shape, bias, first, act = BIAS_CASES[case]
    model = matmul_model(a_shape, b_shape, activation=act, bias=bias, bias_first=first)
    device = current_cuda_device()
    plan = planned(model, batch, device)
    [step] = plan.steps
    assert step.ops == ["MatMul", "Add", *([act] if act else [])]
    kernel = step.build(device)
    feeds = fresh_inputs(model, batch, batch + len(case))
    weights, constant = plan.model.initializers["b"], plan.model.initializers["bias"]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    out = cupy.full(theirs.shape, np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(feeds["a"]), cupy.asarray(weights)], None, out=out)
    got = cupy.asnumpy(y)
    assert y.data.ptr == out.data.ptr and not np.isnan(got).any()
    k = a_shape[-1]
    np.testing.assert_allclose(got, float64_oracle(feeds["a"], weights, act, False, constant), rtol=1e-5, atol=1e-6 * k)
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=2e-6 * k)


def test_an_mlp_block_runs_whole_on_the_gpu_as_onnxruntime_does(tmp_path):
    from onnx_builders import save
    from opplugin.verify.check import check
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    from matmul_cases import mlp_block

    model = load_model(save(mlp_block(), tmp_path / "mlp.onnx"))
    runner = Runner(model, 8, "cuda")
    assert all(s.kind == "plugin" for s in runner.plan.steps)
    x = np.random.default_rng(5).uniform(-2, 2, (8, 5, 6, 32)).astype(np.float32)
    theirs = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], theirs, rtol=1e-5, atol=1e-5)
    assert check(runner.run, runner.plan_record(), {"x": x}).passed


BATCHED_CASES = [case for case in CASES if case.startswith(("batched", "attention"))]


@pytest.mark.parametrize("case", BATCHED_CASES)
def test_both_batched_kernels_match_float64_with_the_output_poisoned(case):
    import cupy

    a_shape, b_shape, constant, act, softmax = CASES[case]
    model = matmul_model(a_shape, b_shape, constant, act, softmax)
    device = current_cuda_device()
    plan = planned(model, 3, device)
    [step] = plan.steps
    feeds = fresh_inputs(model, 3, 11 + len(case))
    operands = [feeds[n] if n in feeds else plan.model.initializers[n] for n in step.inputs]
    exact = float64_oracle(*operands, act, softmax)
    for variant in ("batched", "batched_3xtf32"):
        kernel = step.build(device, variant)
        assert kernel.name.startswith(f"matmul.{variant}") and kernel.flags_nonfinite == (variant == "batched_3xtf32")
        out = cupy.full(exact.shape, np.nan, dtype=cupy.float32)
        [y] = kernel([cupy.asarray(x) for x in operands], None, out=out)
        np.testing.assert_allclose(cupy.asnumpy(y), exact, rtol=1e-5, atol=1e-6 * a_shape[-1])


def test_the_batched_tensor_core_kernel_flags_an_infinity_and_the_fma_kernel_keeps_it():
    import cupy

    a_shape, b_shape, constant, act, softmax = CASES["attention scores: (N, H, T, D) x (N, H, D, T)"]
    model = matmul_model(a_shape, b_shape, constant, act, softmax)
    device = current_cuda_device()
    [step] = planned(model, 2, device).steps
    feeds = fresh_inputs(model, 2, 5)
    feeds["a"][1, 2, 7, 3] = np.inf
    operands = [cupy.asarray(feeds[n]) for n in step.inputs]
    flag = cupy.zeros(3, dtype=cupy.bool_)
    [tensor] = step.build(device)(operands, None, nonfinite=flag[1:2].data.ptr)
    assert flag.get().tolist() == [False, True, False]
    assert np.isnan(cupy.asnumpy(tensor)[1, 2, 7]).any()  # inf - inf in the split: why the runner watches it
    [fma] = step.build(device, "batched")(operands)
    exact = float64_oracle(feeds["a"], feeds["b"], act, softmax)
    np.testing.assert_array_equal(np.isinf(cupy.asnumpy(fma)), np.isinf(exact))
