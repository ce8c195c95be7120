"""The CUDA pool kernels against the float64 numpy reference, and a pooling CNN end to end.

GPU tests (marker `gpu`, skipped without a CUDA device). Every case draws a fresh random
input (never zeros) and poisons the output with NaN first, so an element the kernel never
writes fails. A max is exact, so it must equal the reference bit for bit; an average may
differ by the float32 rounding of its sum.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from onnx_builders import save
from opplugin.errors import PluginError
from opplugin.graph.model import load_model
from opplugin.ops.pool import reference
from opplugin.ops.pool.kernel import PoolKernel
from opplugin.ops.pool.spec import AVERAGE, MAX, PoolSpec
from opplugin.runtime import Runner
from pool_cases import node_info, pool_cnn, window_pools

pytestmark = pytest.mark.gpu

GPU_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run_poisoned(spec: PoolSpec, x: np.ndarray) -> np.ndarray:
    import cupy

    out = cupy.full(spec.output_shape(x.shape[0]), np.nan, dtype=cupy.float32)
    [y] = PoolKernel(spec)([cupy.asarray(x)], None, out=out)
    assert y is out
    return cupy.asnumpy(y)


def check(spec: PoolSpec, x: np.ndarray) -> None:
    got = run_poisoned(spec, x)
    exact = reference.expected(spec, x)
    if spec.mode == MAX:
        np.testing.assert_array_equal(got, exact.astype(np.float32))  # NaN where the reference has NaN, and equal elsewhere
    else:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
        np.testing.assert_allclose(got, exact, rtol=2e-6, atol=1e-6)


def fresh(shape, seed) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


@GPU_SETTINGS
@given(case=window_pools(), seed=st.integers(0, 2**31))
def test_window_pools_match_the_reference(case, seed):
    op, shape, attributes = case
    try:
        spec = PoolSpec.from_node(node_info(op, shape, attributes))
    except PluginError:
        assume(False)
    check(spec, fresh(shape, seed))


FIXED = {
    "resnet stem maxpool 3x3 s2 p1 at 112x112": ((4, 64, 112, 112), PoolSpec(MAX, False, 64, (112, 112), (3, 3), (2, 2), pads=(1, 1, 1, 1))),
    "average 3x3 p1 pads counted": ((3, 5, 17, 19), PoolSpec(AVERAGE, False, 5, (17, 19), (3, 3), pads=(1, 1, 1, 1), count_include_pad=True)),
    "average 3x2 s2x3 asymmetric pads ceil": ((2, 3, 17, 13), PoolSpec(AVERAGE, False, 3, (17, 13), (3, 2), (2, 3), pads=(0, 1, 2, 1),
                                                                      ceil_mode=True)),
    "max 3x3 dilated 2 asymmetric pads": ((2, 3, 19, 21), PoolSpec(MAX, False, 3, (19, 21), (3, 3), (1, 2), (2, 2), pads=(2, 1, 2, 1))),
    "global average 7x7, 512 maps": ((5, 512, 7, 7), PoolSpec(AVERAGE, True, 512, (7, 7), (7, 7))),
    "global average, planes not a multiple of 8": ((3, 3, 9, 11), PoolSpec(AVERAGE, True, 3, (9, 11), (9, 11))),
    "global max over a block-sized plane": ((2, 5, 112, 112), PoolSpec(MAX, True, 5, (112, 112), (112, 112))),
    "global average over a block-sized plane": ((2, 3, 50, 61), PoolSpec(AVERAGE, True, 3, (50, 61), (50, 61))),
    "global max 1x1 plane": ((7, 3, 1, 1), PoolSpec(MAX, True, 3, (1, 1), (1, 1))),
    "ReduceMean over H and W, keepdims=0 (the ResNet head as PyTorch exports it)": (
        (32, 512, 7, 7), PoolSpec(AVERAGE, True, 512, (7, 7), (7, 7), keep_dims=False)),
}


@pytest.mark.parametrize("case", list(FIXED))
def test_fixed_pools_match_the_reference(case):
    shape, spec = FIXED[case]
    check(spec, fresh(shape, len(case)))


@pytest.mark.parametrize("case", list(FIXED))
def test_nan_and_inf_pass_through_every_pool(case):
    """A max keeps a NaN from any place in its window and +inf wins; an average follows IEEE."""
    shape, spec = FIXED[case]
    x = fresh(shape, 7)
    flat = x.reshape(shape[0], shape[1], -1)
    plane = flat.shape[2]
    for place, value in ((0, np.nan), (plane // 2, np.inf), (plane - 1, -np.inf), (plane // 3, np.nan)):
        flat[place % shape[0], place % shape[1], place] = value
    flat[-1, -1, :] = np.inf  # a whole plane of +inf
    check(spec, x)


def test_the_batch_is_a_run_time_argument():
    shape, spec = FIXED["resnet stem maxpool 3x3 s2 p1 at 112x112"]
    for batch in (1, 3):
        check(spec, fresh((batch, *shape[1:]), batch))


def test_a_wrong_input_is_a_clear_error():
    import cupy

    _, spec = FIXED["global max 1x1 plane"]
    with pytest.raises(PluginError, match="float32 CuPy array of shape"):
        PoolKernel(spec)([cupy.zeros((2, 4, 1, 1), cupy.float32)])


# --- end to end ------------------------------------------------------------------------------

def _onnxruntime(model, x):
    return ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y", "g"], {"x": x})


@pytest.mark.parametrize("chunk", [None, 3])
def test_a_pooling_cnn_runs_on_the_gpu_as_onnxruntime_does(tmp_path, chunk):
    model = load_model(save(pool_cnn(size=31), tmp_path / "pool_cnn.onnx"))
    runner = Runner(model, 8, "cuda", chunk=chunk)
    assert {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"} <= {s.node.op_type for s in runner.plan.plugin_steps}
    implementations = {s.name: s.implementation for s in runner.plan_record().steps}
    assert [implementations[n] for n in ("maxpool", "avgpool", "globalmax", "globalavg")] == [
        "maxpool.cuda.3x3s2p1", "averagepool.cuda.3x3s1p1", "globalmaxpool.cuda.global", "globalaveragepool.cuda.global"]
    x = fresh((8, 3, 31, 31), 3)
    result = runner.run({"x": x})
    assert result.exact_reruns == 0
    for ours, theirs in zip((result.outputs["y"], result.outputs["g"]), _onnxruntime(model, x)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    x[1, 0, 5, 5], x[6, 2, 9, 9] = np.nan, np.inf
    result = runner.run({"x": x})
    assert result.exact_reruns == (1 if chunk is None else 2)
    for ours, theirs in zip((result.outputs["y"], result.outputs["g"]), _onnxruntime(model, x)):
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
