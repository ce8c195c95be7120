"""The CUDA reduction and normalisation kernels against the float64 reference and onnxruntime.

GPU tests (marker `gpu`, skipped without a CUDA device). Every case draws a fresh random input
(never zeros) and poisons the output with NaN first, so an element the kernel never writes fails.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opplugin.gpu.device import current_cuda_device
from opplugin.errors import PluginError
from opplugin.ops.pool import reference as pool_reference
from opplugin.ops.pool.spec import PoolSpec
from opplugin.ops.reduction.kernel import RowKernel, expected
from opplugin.ops.reduction.spec import NormSpec, affine
from reduction_cases import CASES, fresh, onnxruntime_output, planned, random_case

pytestmark = pytest.mark.gpu


def built(case: str, batch: int):
    model, _ = CASES[case]
    step = planned(model, batch, current_cuda_device()).steps[0]
    return model, step, step.build(current_cuda_device())


def run_poisoned(kernel, x: np.ndarray) -> np.ndarray:
    import cupy

    out = cupy.full(kernel.spec.output_shape(x.shape[0]), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(x)], None, out=out)
    assert y is out
    return cupy.asnumpy(y)


def oracle(step, kernel, x):
    spec = kernel.spec
    if isinstance(spec, PoolSpec):  # a ReduceMean over H and W runs the global pool kernel
        return pool_reference.expected(spec, x)
    scale, bias = affine(spec, step.node) if isinstance(spec, NormSpec) else (None, None)
    return expected(spec, x, scale, bias)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 5])
def test_kernels_match_float64_and_onnxruntime(case, batch):
    model, step, kernel = built(case, batch)
    x = fresh((batch, *CASES[case][1][1:]), batch + len(case))
    got = run_poisoned(kernel, x)
    exact = oracle(step, kernel, x)
    assert not np.isnan(got).any()
    scale = max(1.0, float(np.abs(exact).max()))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(got, onnxruntime_output(model, x), rtol=2e-5, atol=2e-5 * scale)


def test_the_batch_is_a_run_time_argument():
    _, step, kernel = built("LayerNormalization over NHWC's channels", 4)
    for batch in (1, 7):
        x = fresh((batch, 7, 7, 96), batch)
        np.testing.assert_allclose(run_poisoned(kernel, x), oracle(step, kernel, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["Softmax over C of NCHW", "ReduceMax over axes 1 and 3 (two stages)", "LogSoftmax a long row"])
def test_nan_and_inf_spread_as_in_the_reference(case):
    _, step, kernel = built(case, 2)
    x = fresh((2, *CASES[case][1][1:]), 9)
    flat = x.reshape(-1)
    flat[3], flat[flat.size // 2] = np.nan, np.inf
    got, exact = run_poisoned(kernel, x), oracle(step, kernel, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    finite = np.isfinite(exact)
    np.testing.assert_allclose(got[finite], exact[finite], rtol=1e-5, atol=1e-5)


def test_a_wrong_input_is_a_clear_error():
    import cupy

    _, _, kernel = built("Softmax over classes", 2)
    assert isinstance(kernel, RowKernel)
    with pytest.raises(PluginError, match="float32 CuPy array of shape"):
        kernel([cupy.zeros((2, 11), cupy.float32)])


@pytest.mark.parametrize("channels_first", [True, False])
def test_a_decomposed_layernorm_runs_as_one_kernel_on_the_gpu(tmp_path, channels_first):
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner
    from layernorm_models import decomposed_layernorm

    shape, axes, opset, affine_shape = ((4, 64, 9, 9), [1], 13, (64, 1, 1)) if channels_first else ((4, 9, 9, 64), [-1], 17, (64,))
    model = load_model(save(decomposed_layernorm(shape, axes, opset, "Pow", affine_shape), tmp_path / "ln.onnx"))
    runner = Runner(model, 4, "cuda")
    assert [s.ops for s in runner.plan.steps][0] == ["LayerNormalization"] and all(s.kind == "plugin" for s in runner.plan.steps)
    x = fresh(shape, 8)
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], onnxruntime_output(model.original, x), rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_random_axes_and_shapes_match_float64(data, seed):
    model, shape = random_case(data.draw)
    device = current_cuda_device()
    step = planned(model, shape[0], device).steps[0]
    kernel = step.build(device)
    x = fresh(shape, seed)
    got, exact = run_poisoned(kernel, x), oracle(step, kernel, x)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(exact).max())))
