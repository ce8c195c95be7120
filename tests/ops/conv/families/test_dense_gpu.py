"""On the GPU: the dense families (a Conv whose filter covers its whole input map, run on the
Gemm kernels) against the float64 reference, output poisoned with NaN first, on fresh random
inputs; every configuration they offer, their fused activations, weights given at run time;
and a squeeze-and-excitation block planned by the runner against onnxruntime CPU."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from family_gpu_checks import MAX_RELATIVE_L2, draw, run_and_compare
from onnx_builders import conv_spec as conv
from onnx_builders import se_block

from opplugin.verify.check import check
from opplugin.graph.model import Model
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families.dense import FAMILIES as DENSE
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu

# (batch, C, M, map): SE squeeze and excite shapes, a 3x3 filter on a 3x3 map, odd K and M, and
# batches past gemv's 16 rows a block and past one tiled block of rows
SHAPES = [(1, 480, 20, 1), (1, 20, 480, 1), (3, 37, 5, 3), (32, 1152, 48, 1), (40, 96, 1000, 1), (17, 6, 144, 1), (130, 64, 30, 2)]
CASES = [(shape, config) for shape in SHAPES for family in DENSE
         for config in family.configs(conv(shape[0], shape[1], shape[2], (shape[3],) * 2, (shape[3],) * 2))]


def dense(batch, c, m, size, bias=True):
    return conv(batch, c, m, (size, size), (size, size), bias=bias)


@pytest.mark.parametrize(("shape", "config"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_every_offered_configuration_matches_float64(shape, config):
    spec = dense(*shape)
    reason = families.unsupported_reason(spec, config, None)
    if reason:
        pytest.skip(reason)  # rowwarp past 32 outputs
    seed, x, w, b, _ = draw(spec)
    run_and_compare(spec, config, NONE, x, w, b, None, f"{config} on {shape} (seed {seed})")


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "HardSigmoid", "HardSwish", "Silu"])
@pytest.mark.parametrize("family", [f.name for f in DENSE])
def test_fused_activations_without_bias(family, activation):
    import cupy

    spec, epilogue = dense(20, 72, 24, 1, bias=False), Epilogue(activation)
    seed, x, w, _, _ = draw(spec)
    kernel = families.build_kernel(spec, family, (w, None), epilogue)
    out = cupy.full(spec.output_shape(), cupy.nan, dtype=cupy.float32)
    kernel([cupy.asarray(x)], None, out=out)
    expected = reference.expected(spec, epilogue, x, w, None, None)
    error = np.linalg.norm(cupy.asnumpy(out) - expected) / np.linalg.norm(expected)
    assert error <= MAX_RELATIVE_L2, f"{kernel.name}: relative L2 error {error:.3g} (seed {seed})"


def test_weights_given_at_run_time():
    import cupy

    spec = dense(2, 33, 7, 3)
    kernel = families.build_kernel(spec, "dense_gemv", None, Epilogue("Relu"))
    assert kernel.reads_weights
    for _ in range(2):  # new weights on each call are used
        seed, x, w, b, _ = draw(spec)
        out = cupy.full(spec.output_shape(), cupy.nan, dtype=cupy.float32)
        kernel([cupy.asarray(a) for a in (x, w, b)], None, out=out)
        expected = reference.expected(spec, Epilogue("Relu"), x, w, b, None)
        assert np.linalg.norm(cupy.asnumpy(out) - expected) / np.linalg.norm(expected) <= MAX_RELATIVE_L2, f"seed {seed}"


@pytest.mark.parametrize("batch", [1, 32])
def test_se_block_runs_its_convs_on_the_gemm_kernels_and_matches_onnxruntime(batch, tmp_path, monkeypatch):
    from opplugin.core.paths import CACHE_DIR_ENV

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))  # the heuristic's pick, not a tuned one
    rng = np.random.default_rng()
    proto = se_block(240, 60, 7, rng)
    runner = Runner(Model(proto, "se"), batch, "cuda")
    names = {step: k.name for step, k in runner.kernels.items() if k.name.startswith("conv.")}
    assert len(names) == 2 and all(n.startswith("conv.dense_") for n in names.values()), names
    x = rng.standard_normal((batch, 240, 7, 7), dtype=np.float32)
    result = check(runner.run, runner.plan_record(batch), {"x": x})
    assert result.passed, result.records
    [expected] = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = runner.run({"x": x}).outputs["y"]
    assert np.allclose(got, expected, rtol=1e-4, atol=1e-5)
