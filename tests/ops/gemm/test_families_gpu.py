"""The CUDA Gemm families against the float64 numpy reference.

GPU tests (marker `gpu`, skipped without a CUDA device). Every case draws fresh
random operands (never zeros) and poisons the output with NaN before the call, so an
element a kernel never writes fails. Shapes come from hypothesis too: odd sizes, K
not a multiple of any tile or of 4, batch 1, both trans flags, every C broadcast,
alpha and beta, and every activation of the shared table, with a row Softmax where
the family fuses one.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemm_cases import C_SHAPES, GemmProblem, error_scale, make_problem
from opplugin.ops.activation import KINDS, Activation
from opplugin.ops.gemm import families, reference
from opplugin.ops.gemm.epilogue import NONE, GemmEpilogue
from opplugin.ops.gemm.kernel import GemmKernel

pytestmark = pytest.mark.gpu
RTOL = 2e-6  # per unit of error_scale: float32 accumulation over K leaves ~K * 2^-24 at worst, far less in practice
ATOL = 1e-6
# the tensor cores: 3xTF32 loses small*small and small's truncation (~2^-21 a product) and truncates as
# it accumulates a slice; TF32 rounds each operand to 11 bits (2^-11 a product); FP16 and BF16 round each operand
# once to their unit roundoff u, so a product is off by at most 2u + u^2 of |a||b|
FAMILY_RTOL = {"tc_3xtf32": 1e-5, "wg_3xtf32": 1e-5, "tc_tf32": 4e-3, "wg_fp16": 2.1 * 2.0 ** -11, "wg_bf16": 2.1 * 2.0 ** -8}

GPU_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False)

# explicit configurations beyond the heuristic's, so that every code path of each source runs
CONFIGS = ["gemv_w1x1_k1", "gemv_w2x2_k4", "gemv_w4x1_k16", "gemv_w16x2_k1", "gemv_w8x4_k2", "gemv_w16x1_k16",
           "tiled_b128x128x8_t8x8", "tiled_b128x64x16_t8x4", "tiled_b64x64x16_t4x4", "tiled_b64x32x16_t4x4", "tiled_b32x32x16_t4x4",
           "rowwarp_r1", "rowwarp_r3", "rowwarp_r4",
           "tc_3xtf32_b128x128x32_w64x32_s3", "tc_3xtf32_b128x64x32_w64x32_s4", "tc_3xtf32_b64x128x32_w32x64_s2",
           "tc_3xtf32_b64x64x32_w32x32_s3", "tc_3xtf32_b32x64x32_w32x16_s4", "tc_tf32_b64x64x32_w32x32_s3",
           "wg_3xtf32_b128x128x32_s3", "wg_3xtf32_b128x64x32_s4", "wg_3xtf32_b64x128x32_s2", "wg_3xtf32_b64x64x32_s3",
           "wg_3xtf32_b64x64x32_s3_k2", "wg_3xtf32_b128x64x32_s2_k3", "wg_3xtf32_b64x128x32_s3_k7"]  # K split, summed by a second launch


def run_poisoned(kernel: GemmKernel, p: GemmProblem, constant: bool) -> np.ndarray:
    import cupy

    inputs = [cupy.asarray(p.a), cupy.asarray(p.b)] + ([cupy.asarray(p.c)] if p.c is not None else [])
    out = cupy.full(p.spec.output_shape(), np.nan, dtype=cupy.float32)
    [y] = kernel(inputs, None, out=out)
    assert y is out
    return cupy.asnumpy(y)


def check(p: GemmProblem, variant: str, epilogue: GemmEpilogue, constant: bool = True) -> None:
    config = families.configure(p.spec, variant)
    reason = families.unsupported_reason(p.spec, config, epilogue)
    if reason:
        pytest.skip(reason)
    kernel = GemmKernel(p.spec, config, epilogue, p.b if constant else None, p.c if constant and p.spec.bias == "column" else None)
    got = run_poisoned(kernel, p, constant)
    if constant:  # the runner's call (no `out`) takes the fast path where it can: the same numbers
        import cupy

        inputs = [cupy.asarray(p.a), cupy.asarray(p.b)] + ([cupy.asarray(p.c)] if p.c is not None else [])
        np.testing.assert_array_equal(cupy.asnumpy(kernel(inputs)[0]), got)
    exact = reference.expected(p.spec, epilogue, p.a, p.b, p.c)
    scale = error_scale(p)
    if epilogue.softmax:  # a probability moves by at most about twice the error of its row's logits
        scale = 2 * scale.max(axis=1, keepdims=True) * np.ones_like(scale)
    tolerance = FAMILY_RTOL.get(config.family, RTOL) * scale + ATOL
    bad = ~(np.abs(got - exact) <= tolerance)
    assert not bad.any(), (
        f"{kernel.name} on {p.spec}: {int(bad.sum())} of {bad.size} wrong, first at {np.argwhere(bad)[0].tolist()}: "
        f"{got[tuple(np.argwhere(bad)[0])]} vs {exact[tuple(np.argwhere(bad)[0])]}"
    )


SHIPPED = {  # (M, N, K, epilogue): the shipped models' Gemm steps, at small batches
    "lenet86.fc1": (5, 32, 1024, GemmEpilogue(Activation.plain("Relu"))),
    "lenet86.fc2": (37, 10, 32, GemmEpilogue(softmax=True)),
    "ece408_high.fc1": (300, 128, 7200, GemmEpilogue(Activation.plain("Tanh"))),
    "ece408_high.fc2": (1, 10, 128, GemmEpilogue(softmax=True)),
    "mlp_onehidden.fc1": (16, 128, 784, GemmEpilogue(Activation.plain("Sigmoid"))),
    "onehidden.fc1": (3, 128, 32754, NONE),
}


@pytest.mark.parametrize("variant", [*families.FAMILIES, *CONFIGS])
@pytest.mark.parametrize("case", SHIPPED)
def test_shipped_shapes(case, variant):
    m, n, k, epilogue = SHIPPED[case]
    check(make_problem(m, n, k, trans_b=True, seed=zlib.crc32(f"{case} {variant}".encode())), variant, epilogue)


@pytest.mark.parametrize("variant", list(families.FAMILIES))
def test_heuristic_picks_run_at_batch_one(variant):
    check(make_problem(1, 67, 131, seed=5), variant, NONE)


ACTIVATIONS = [None, *(Activation.plain(op) for op in KINDS), Activation("Clip", 0.0, 6.0), Activation("LeakyRelu", 0.3)]


@given(
    m=st.one_of(st.just(1), st.integers(1, 40), st.integers(41, 300)),
    n=st.one_of(st.integers(1, 33), st.integers(34, 150)),
    k=st.one_of(st.integers(1, 9), st.integers(10, 600)),
    trans_a=st.booleans(),
    trans_b=st.booleans(),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    beta=st.sampled_from([1.0, 0.0, 3.0]),
    c=st.sampled_from(sorted(C_SHAPES)),
    act=st.sampled_from(range(len(ACTIVATIONS))),
    softmax=st.booleans(),
    variant=st.sampled_from([*families.FAMILIES, *CONFIGS]),
    constant=st.booleans(),
    seed=st.integers(0, 2**31),
)
@GPU_SETTINGS
def test_drawn_shapes(m, n, k, trans_a, trans_b, alpha, beta, c, act, softmax, variant, constant, seed):
    p = make_problem(m, n, k, trans_a, trans_b, alpha, beta, c, seed)
    epilogue = GemmEpilogue(ACTIVATIONS[act], softmax and n <= families.MAX_ROWWARP_N)
    if families.unsupported_reason(p.spec, families.configure(p.spec, variant), epilogue):
        variant = families.heuristic_config(p.spec, epilogue).name()  # drawing again would waste the example: take the one that runs
    assert families.unsupported_reason(p.spec, families.configure(p.spec, variant), epilogue) is None
    check(p, variant, epilogue, constant)


def test_nan_and_inf_reach_the_outputs_as_in_the_reference():
    """A NaN or an infinity in A spreads through the fused epilogue (activation, row Softmax) as in float64 numpy,
    on every family that says it does (the tensor cores' split operands do not: the runner watches them)."""
    p = make_problem(40, 10, 64, trans_b=True, seed=9)
    p.a[3, 5] = np.nan
    p.a[7, 1] = np.inf
    p.a[11, 2] = -np.inf
    for epilogue in (GemmEpilogue(Activation.plain("Relu")), GemmEpilogue(Activation.plain("Sigmoid"), True), GemmEpilogue(softmax=True)):
        for variant in families.FAMILIES:
            config = families.configure(p.spec, variant)
            if families.unsupported_reason(p.spec, config, epilogue):
                continue
            if isinstance(config, (families.TensorConfig, families.WgmmaConfig)):
                continue
            got = run_poisoned(GemmKernel(p.spec, config, epilogue, p.b, p.c), p, True)
            exact = reference.expected(p.spec, epilogue, p.a, p.b, p.c)
            assert np.array_equal(np.isnan(got), np.isnan(exact)), (variant, epilogue)
            assert np.array_equal(np.isposinf(got), np.isposinf(exact)) and np.array_equal(np.isneginf(got), np.isneginf(exact))


def test_views_and_plugin_steps_stay_on_the_device():
    """lenet86 on the GPU: every step is a plugin step, the Flatten a view of the pooled map."""
    from opplugin.gpu.device import select_device
    from opplugin.graph.model import load_model
    from opplugin.plan.partition import PluginStep, make_plan

    for name in ("lenet86", "ece408_high", "mlp_onehidden"):
        plan = make_plan(load_model(name), 64, select_device("cuda"))
        assert all(isinstance(step, PluginStep) for step in plan.steps), name


@pytest.mark.parametrize("n", [96, 95])  # float2 stores and single ones
@pytest.mark.parametrize("family", ["tc_3xtf32", "wg_3xtf32"])
def test_a_tensor_core_kernel_raises_its_flag_exactly_when_an_output_is_nan_or_inf(family, n):
    import cupy

    p = make_problem(70, n, 200, trans_b=True, seed=11)
    config = families.configure(p.spec, family)
    if families.unsupported_reason(p.spec, config):
        pytest.skip(families.unsupported_reason(p.spec, config))
    kernel = GemmKernel(p.spec, config, NONE, p.b, p.c)
    assert kernel.flags_nonfinite and not kernel.nonfinite_exact
    flag = cupy.zeros(4, dtype=cupy.bool_)  # the flag in the middle: no neighbour is touched
    for poison, expected in ((None, False), (np.inf, True), (np.nan, True)):
        a = p.a.copy()
        if poison is not None:
            a[33, 150] = poison
        flag[...] = False
        [flagged] = kernel([cupy.asarray(a)], nonfinite=flag[1:2].data.ptr)
        [plain] = kernel([cupy.asarray(a)])
        assert flag.get().tolist() == [False, expected, False, False], poison
        np.testing.assert_array_equal(cupy.asnumpy(flagged), cupy.asnumpy(plain))


@pytest.mark.parametrize("variant", ["wg_3xtf32_b64x64x32_s3", "wg_3xtf32_b128x64x32_s3", "wg_3xtf32_b64x64x32_s3_k3",
                                     "wg_3xtf32_b64x128x32_s2_k5"])
@pytest.mark.parametrize("n", [96, 97])
def test_wgmma_adds_a_residual_as_it_stores(variant, n):
    """A transformer's x + Linear(h) in one kernel: the residual added after the bias and activation, split or not,
    an odd N too; the output poisoned first, the result against float64."""
    import cupy

    p = make_problem(197, n, 384, trans_b=True, c="row", seed=n)
    epilogue = GemmEpilogue(Activation("Relu"), residual=True)
    config = families.configure(p.spec, variant)
    reason = families.unsupported_reason(p.spec, config, epilogue)
    if reason:
        pytest.skip(reason)
    residual = np.random.default_rng(n + 1).standard_normal((197, n)).astype(np.float32)
    kernel = GemmKernel(p.spec, config, epilogue, p.b, p.c)
    out = cupy.full((197, n), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(p.a), cupy.asarray(p.b)], None, out=out, residual=cupy.asarray(residual))
    assert kernel.name.endswith("+relu+residual")
    exact = reference.expected(p.spec, GemmEpilogue(Activation("Relu")), p.a, p.b, p.c) + residual.astype(np.float64)
    tolerance = FAMILY_RTOL["wg_3xtf32"] * error_scale(p) + ATOL
    assert np.all(np.abs(cupy.asnumpy(y) - exact) <= tolerance + 2 ** -23 * np.abs(residual))
    with pytest.raises(Exception, match="residual"):
        kernel([cupy.asarray(p.a), cupy.asarray(p.b)])  # the epilogue adds one: a call without it is refused


@pytest.mark.parametrize("variant", ["wg_3xtf32", "wg_3xtf32_b64x64x32_s3_k3", "tc_3xtf32", "tiled", "wg_fp16", "wg_bf16"])
@pytest.mark.parametrize("norm, gather", [(True, False), (False, True), (True, True)], ids=["layernorm", "rows", "layernorm+rows"])
def test_a_row_prologue_normalises_and_gathers_a_rows_before_the_product(variant, norm, gather):
    """A transformer's LN > Linear, Swin's shifted windows > Linear, or both, in one step: wg_3xtf32's pass
    for A's small parts normalises and gathers the rows as it goes, wg_fp16's and wg_bf16's writes them in
    their format; the other families take the rows from the same pass. Rows far from mean 0 and variance 1,
    so that a skipped normalisation shows; a table that drops, repeats and reorders rows of each of two images
    and adds zero rows (padding); the output poisoned first, against float64; a call into a given output and
    one without (the common call's own path) alike."""
    import cupy

    from opplugin.ops.gemm.row_prologue import RowPrologue, RowTable

    rng = np.random.default_rng(8)
    rows_in = 101
    table = np.concatenate([rng.permutation(rows_in)[:94], [5, 5, -1, -1]]) if gather else None  # -1: a padded row of zeros
    m = 2 * (len(table) if gather else rows_in)
    p = make_problem(m, 96, 384, trans_b=True, c="row", seed=7)
    x = (3 * rng.standard_normal((2 * rows_in, 384)) + 1.5).astype(np.float32)
    scale, bias = (1 + 0.2 * rng.standard_normal(384)).astype(np.float32), rng.standard_normal(384).astype(np.float32)
    config = families.configure(p.spec, variant)
    prologue = RowPrologue(384, (1e-6, scale, bias) if norm else None, RowTable(rows_in, tuple(map(int, table))) if gather else None)
    kernel = GemmKernel(p.spec, config, NONE, p.b, p.c, "matmul", prologue)
    assert kernel.name.startswith("matmul." + ("ln*" if norm else "") + ("rows*" if gather else ""))
    out = cupy.full((m, 96), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(x)], None, out=out)
    rows = x.astype(np.float64)
    if norm:
        centred = rows - rows.mean(axis=1, keepdims=True)
        rows = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-6) * scale + bias
    if gather:
        with_zero_row = np.concatenate([rows.reshape(2, rows_in, 384), np.zeros((2, 1, 384))], axis=1)
        rows = with_zero_row[:, np.where(table < 0, rows_in, table)].reshape(-1, 384)
    exact = reference.expected(p.spec, NONE, rows, p.b, p.c)
    # the normalised rows carry FP32's rounding (a few units of 2^-24 each) into the product as well
    scale_of_y = np.abs(rows) @ np.abs(p.b.T.astype(np.float64)) + np.abs(p.c.astype(np.float64))
    tolerance = {"wg_fp16": 2.1 * 2.0 ** -11, "wg_bf16": 2.1 * 2.0 ** -8}.get(variant, 2e-5)
    assert np.all(np.abs(cupy.asnumpy(y) - exact) <= tolerance * scale_of_y + ATOL)
    [again] = kernel([cupy.asarray(x)])
    assert np.array_equal(cupy.asnumpy(again), cupy.asnumpy(y))


@pytest.mark.parametrize("variant, unit_roundoff", [("wg_fp16", 2.0 ** -11), ("wg_fp16_b64x64x64_s3_k3", 2.0 ** -11),
                                                    ("wg_fp16_b128x64x64_s3", 2.0 ** -11), ("wg_bf16", 2.0 ** -8)])
@pytest.mark.parametrize("n", [96, 97])
def test_the_half_precision_wgmma_families_are_within_their_formats_rounding(variant, unit_roundoff, n):
    """wg_fp16 and wg_bf16 (opt-in): each operand rounded to the format once, products summed in FP32, the epilogue
    as wg_3xtf32's (a residual too). Against float64, each output within two roundings of the sum of |a| |b| it
    adds; and further than FP32's tolerance somewhere, or the operands were never rounded. Output poisoned first."""
    import cupy

    p = make_problem(197, n, 384, trans_b=True, c="row", seed=n + 3)
    epilogue = GemmEpilogue(Activation("Relu"), residual=True)
    config = families.configure(p.spec, variant)
    reason = families.unsupported_reason(p.spec, config, epilogue)
    if reason:
        pytest.skip(reason)
    residual = np.random.default_rng(n).standard_normal((197, n)).astype(np.float32)
    kernel = GemmKernel(p.spec, config, epilogue, p.b, p.c)
    out = cupy.full((197, n), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(p.a)], None, out=out, residual=cupy.asarray(residual))
    got = cupy.asnumpy(y)
    exact = reference.expected(p.spec, GemmEpilogue(Activation("Relu")), p.a, p.b, p.c) + residual.astype(np.float64)
    error = np.abs(got - exact)
    assert np.all(error <= 2 * unit_roundoff * error_scale(p) + ATOL + 2 ** -23 * np.abs(residual))
    assert np.any(error > FAMILY_RTOL["wg_3xtf32"] * error_scale(p) + ATOL)
