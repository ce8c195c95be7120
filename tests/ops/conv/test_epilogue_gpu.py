"""On the GPU: the fused residual epilogue (Add, activation, max pool) of every fusing family
against the float64 reference, with fresh random inputs and poisoned outputs; NaN and Inf
through it; ResNet blocks end to end against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx_builders import conv_spec as conv
from onnx_builders import save
from resnet_block import bottleneck_block, resnet_block

from opplugin.graph.model import load_model
from opplugin.ops.activation import KINDS, SILU, Activation
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu

MAX_RELATIVE_L2 = 1e-5
ACTIVATIONS = [*(Activation.plain(op) for op in KINDS), Activation("LeakyRelu", 0.3), Activation("Clip", 0.0, 6.0)]

CASES = {
    "small_pads": conv(3, 6, 16, (13, 15), (3, 3), pads=(1, 1, 1, 1)),
    "stride2_no_bias": conv(4, 5, 12, (17, 23), (3, 3), strides=(2, 2), pads=(1, 0, 2, 1), bias=False),
    "depthwise": conv(2, 8, 8, (14, 15), (3, 3), pads=(1, 1, 1, 1), group=8),
    "pointwise_vectors": conv(3, 16, 40, (8, 12), (1, 1)),  # float4 rows in const_tile, pixel groups in the GEMM
    "tile_tails_k333": conv(2, 37, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)),
    "deep_k_small_output": conv(1, 160, 96, (7, 7), (3, 3), pads=(1, 1, 1, 1)),  # the GEMM splits K
    "c64_tile_tails": conv(2, 64, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)),  # groups of 32 channels: wg_3xtf32 too
}
FUSING = [name for name, family in families.FAMILIES.items() if family.fuses]
VARIANTS = [*FUSING, "const_tile_t2x4_m8", "const_rb_t4x1_m4", "tc_3xtf32_b64x64x32_w32x32_s3_k4", "tc_3xtf32_b32x64x32_w32x16_s3_k2", "tc_tf32_b64x64x32_w32x32_s3_k4"]


def draw(spec, residual: bool):
    """(seed, x, w, b, r): standard-normal float32, never all zeros."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape(), dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    b = rng.standard_normal(spec.out_channels, dtype=np.float32) if spec.has_bias else None
    r = rng.standard_normal(spec.output_shape(), dtype=np.float32) * 4 if residual else None
    return seed, x, w, b, r


def run_poisoned(spec, variant, epilogue, x, w, b, r):
    """The kernel's output, written into a NaN-filled array; its name."""
    import cupy

    kernel = families.build_kernel(spec, variant, (w, b), epilogue)
    out = cupy.full(kernel.output_shape(spec.batch), cupy.nan, dtype=cupy.float32)
    inputs = [cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b)]
    if r is not None:
        inputs.append(cupy.asarray(r))
    [y] = kernel(inputs, None, out=out)
    assert y is out
    return cupy.asnumpy(y), kernel.name


def tolerance(variant: str) -> float:
    family = families.family_of(variant)
    return MAX_RELATIVE_L2 if family.exact else family.max_relative_error


def check(case_spec, variant, epilogue, context):
    seed, x, w, b, r = draw(case_spec, epilogue.residual)
    reason = families.unsupported_reason(case_spec, variant, (w, b), epilogue)
    if reason:
        pytest.skip(reason)
    got, name = run_poisoned(case_spec, variant, epilogue, x, w, b, r)
    expected = reference.expected(case_spec, epilogue, x, w, b, r)
    unwritten = int(np.isnan(got).sum())
    assert unwritten == 0, f"{name} on {context} (seed {seed}): {unwritten} of {got.size} elements never written"
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error <= tolerance(variant), f"{name} on {context} (seed {seed}): relative L2 error {error:.3g}"


@pytest.mark.parametrize("variant", ["const_rb", "const_tile", "tc_3xtf32", "tc_3xtf32_b32x64x32_w32x16_s3_k2"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda a: a.suffix)
def test_every_activation_after_a_residual_matches_float64(activation, variant):
    check(CASES["small_pads"], variant, Epilogue(activation, residual=True), "small_pads")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_fusing_family_adds_the_residual_on_every_shape(case, variant):
    check(CASES[case], variant, Epilogue("Relu", residual=True), case)


POOLED = {  # a residual before the pool, and activations that do not commute with max
    "add_relu_pool2x4": (conv(3, 3, 8, (17, 23), (3, 3), pads=(1, 2, 0, 1), bias=False), Epilogue("Relu", (2, 4), residual=True)),
    "add_silu_pool2_ragged": (conv(5, 4, 6, (15, 15), (3, 3), group=2), Epilogue(Activation(SILU), (2, 2), residual=True)),
    "hardswish_pool4": (conv(3, 4, 16, (40, 40), (7, 7)), Epilogue("HardSwish", (4, 4))),
    "add_pool2": (conv(2, 1, 4, (30, 30), (7, 7)), Epilogue(None, (2, 2), residual=True)),
}


@pytest.mark.parametrize("variant", ["const_rb", "const_tile", "const_tile_t4x4_m4", "const_tile_t2x2_m4", "const_tile_t1x4_m2"])
@pytest.mark.parametrize("case", list(POOLED))
def test_a_pool_after_a_residual_or_a_non_monotone_activation_matches_float64(case, variant):
    spec, epilogue = POOLED[case]
    check(spec, variant, epilogue, case)


@pytest.mark.parametrize("variant", ["const_rb", "const_tile_t2x4_m8", "tc_3xtf32", "tc_3xtf32_b64x64x32_w32x32_s3_k4"])
@pytest.mark.parametrize("epilogue", [Epilogue("Relu", residual=True), Epilogue(Activation(SILU), residual=True),
                                      Epilogue("Relu", (2, 2), residual=True)], ids=lambda e: e.suffix)
def test_nan_and_inf_in_the_residual_reach_the_output_as_in_float64(epilogue, variant):
    spec = CASES["pointwise_vectors"] if variant.startswith("tc") else conv(2, 3, 8, (16, 16), (3, 3), pads=(1, 1, 1, 1))
    seed, x, w, b, r = draw(spec, True)
    if families.unsupported_reason(spec, variant, (w, b), epilogue):
        pytest.skip(families.unsupported_reason(spec, variant, (w, b), epilogue))
    r[0, 1, 2, 3], r[0, 2, 5, 4], r[1, 0, 7, 7], r[1, 3, 0, 1] = np.nan, np.inf, -np.inf, np.inf
    x[1, 0, 4, 4] = np.nan
    got, name = run_poisoned(spec, variant, epilogue, x, w, b, r)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = reference.expected(spec, epilogue, x, w, b, r)
    assert np.isnan(expected).any() and np.isinf(expected).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=f"{name} (seed {seed})")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expected), err_msg=f"{name} (seed {seed})")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected), err_msg=f"{name} (seed {seed})")
    finite = np.isfinite(expected)
    assert np.linalg.norm(got[finite] - expected[finite]) <= tolerance(variant) * np.linalg.norm(expected[finite])


@pytest.mark.parametrize("block", [resnet_block, bottleneck_block])
@pytest.mark.parametrize("variant", [None, "baseline"])  # baseline cannot fuse: its epilogue runs as CuPy after it
def test_resnet_blocks_end_to_end_match_onnxruntime(block, variant, tmp_path):
    model_proto = block()
    model = load_model(save(model_proto, tmp_path / "block.onnx"))
    runner = Runner(model, 6, "cuda", variants={"Conv": variant} if variant else None)
    residual_steps = [s for s in runner.plan.plugin_steps if {"Add", "Sum"} & set(s.ops)]
    assert len(residual_steps) == 1
    name = runner.kernels[residual_steps[0].name].name
    assert "+add+relu" in name and (", then cupy" in name) == (variant == "baseline"), name
    x = np.random.default_rng().standard_normal((6, 3 if block is resnet_block else 8, 12, 12)).astype(np.float32)
    ours = runner.run({"x": x}).outputs
    theirs = ort.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for output, expected in zip(model.outputs, theirs):
        np.testing.assert_allclose(ours[output], expected, rtol=1e-4, atol=1e-4)
