"""A run's --precision, step by step (plan/precision.py): FP32 changes nothing; under a reduced precision each step
whose plugin has a kernel in it runs in it, every other step stays FP32 with the reason, and a fused attention runs in
plain TF32 (its one reduced precision) and says why; --variant wins for its op type; mixed is FP16 but for the steps that compute a node of keep_fp32 (a budget's, found by
verify/mixed_precision.py); a precision no run takes is one line. Real runners and plans on the CPU, and plans for a GPU (nothing built)."""
from __future__ import annotations

import numpy as np
import pytest
from attention_cases import projected_attention_model
from onnx_builders import save
from precision_cases import attention_scores_model, conv_mlp_model, product_model, two_products_model

from opplugin.core.number_formats import REDUCED
from opplugin.errors import InputError
from opplugin.gpu.device import CPU, Device
from opplugin.graph.model import load_model
from opplugin.ops.gemm import families
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import KEPT_BY_BUDGET, PRECISIONS, step_precisions
from opplugin.report.plan import format_plan
from opplugin.runtime import Runner
from opplugin.runtime.plan_record import record_plan_alone

GPU = Device("cuda", "test GPU")  # plans only: kernel_name and the precision choice build nothing
# the Conv makes 4 maps, fewer than the half-precision Conv families take (whole 8-map blocks under 32)
CONV_WHY = "wg_fp16 takes fewer than 32 maps a group only in whole 8-map blocks (a tile of exactly its maps); this Conv has 4 a group"
CONV_TF32_WHY = "no tf32 kernel picked for Conv; --variant Conv=tc_tf32 runs TF32 on mma.sync"
SOFTMAX_WHY = "wg_fp16 does not fuse a row Softmax (rowwarp does, for N <= 32)"


@pytest.fixture(scope="module")
def conv_mlp(tmp_path_factory):
    return load_model(save(conv_mlp_model(), tmp_path_factory.mktemp("precision") / "conv_mlp.onnx"))


def steps(record) -> dict[str, tuple[str, str, str | None]]:
    return {s.name: (s.implementation, s.precision, s.precision_reason) for s in record.steps}


def test_fp32_is_the_default_and_changes_no_kernel_and_no_number(conv_mlp):
    x = np.random.default_rng(3).standard_normal((6, 3, 8, 8)).astype(np.float32)
    default, fp32 = Runner(conv_mlp, 6, "cpu"), Runner(conv_mlp, 6, "cpu", precision="fp32")
    assert default.precision == "fp32" and default.plan_record().precision == "fp32"
    expected = {"conv": ("conv.reference+relu", "fp32", None), "fc1": ("matmul.reference+relu", "fp32", None),
                "fc2": ("gemm.reference+softmax", "fp32", None)}
    assert steps(default.plan_record()) == steps(fp32.plan_record()) == expected
    assert np.array_equal(default.run({"x": x}).outputs["y"], fp32.run({"x": x}).outputs["y"])
    # on a GPU, the plan names the kernels it always did: the heuristic's, each exact
    plan = make_plan(conv_mlp, 6, GPU)
    planned = [s.implementation for s in record_plan_alone(plan).steps]
    assert planned == [s.implementation for s in record_plan_alone(plan, None, "fp32").steps]
    assert planned[1].startswith("matmul.gemv_") and planned[2].startswith("gemm.rowwarp_")


def test_fp16_runs_the_flat_product_in_fp16_and_keeps_the_conv_and_the_fused_softmax_in_fp32(conv_mlp):
    record = Runner(conv_mlp, 6, "cpu", precision="fp16").plan_record()
    assert record.precision == "fp16"
    assert steps(record) == {"conv": ("conv.reference+relu", "fp32", CONV_WHY), "fc1": ("matmul.reference.fp16+relu", "fp16", None),
                             "fc2": ("gemm.reference+softmax", "fp32", SOFTMAX_WHY)}


@pytest.mark.parametrize("precision, family", sorted(families.PRECISION_FAMILIES.items()))
def test_on_a_gpu_the_product_gets_its_familys_configuration_of_the_heuristics_shape(conv_mlp, precision, family):
    plan = make_plan(conv_mlp, 32, GPU)
    fc1 = next(s for s in plan.plugin_steps if s.name == "fc1")
    config = families.DEFAULTS[family](fc1.plugin.gemm_spec(fc1.node))
    planned = steps(record_plan_alone(plan, None, precision))
    assert planned["fc1"] == (f"matmul.{config.name()}+relu", precision, None)
    assert planned["conv"][1:] == ("fp32", CONV_TF32_WHY if precision == "tf32" else CONV_WHY.replace("fp16", precision))
    assert step_precisions(plan, precision)["fc1"].variant == config.name()  # what the runner's build is given


def test_a_step_its_familys_kernel_cannot_run_stays_fp32_and_says_why(tmp_path):
    odd = load_model(save(product_model(k=30, op="Gemm"), tmp_path / "odd.onnx"))  # wgmma copies 8 halves at a time
    for device in (CPU, GPU):
        half = steps(record_plan_alone(make_plan(odd, 32, device), None, "fp16"))["product"]
        assert half[1:] == ("fp32", "wg_fp16 copies A's rows in 16-byte quads: K must be a multiple of 8, not 30")
        assert steps(record_plan_alone(make_plan(odd, 32, device), None, "tf32"))["product"][1] == "tf32"  # tc_tf32 pads K


def test_a_batched_product_a_layout_step_and_an_onnxruntime_step_stay_fp32(tmp_path):
    scores = load_model(save(attention_scores_model(), tmp_path / "scores.onnx"))
    planned = steps(Runner(scores, 2, "cpu", precision="bf16").plan_record())
    assert planned == {"transpose": ("transpose.reference.perm021", "fp32", "no bf16 kernel for Transpose"),
                       "scores": ("matmul.reference", "fp32", "no bf16 kernel for a batched product")}
    alone = load_model(save(product_model(), tmp_path / "product.onnx"))
    left = Runner(alone, 2, "cpu", registry={}, precision="fp16").plan_record()  # no plugins: onnxruntime runs the model
    assert [(s.kind, s.precision, s.precision_reason) for s in left.steps] == [("onnxruntime", "fp32", "onnxruntime runs in fp32")]


def test_a_variant_for_the_op_type_wins_over_the_precision(conv_mlp):
    x = np.random.default_rng(4).standard_normal((5, 3, 8, 8)).astype(np.float32)
    chosen = Runner(conv_mlp, 5, "cpu", {"MatMul": "reference"}, precision="fp16")
    assert steps(chosen.plan_record())["fc1"] == ("matmul.reference+relu", "fp32", "--variant MatMul=reference")
    assert np.array_equal(chosen.run({"x": x}).outputs["y"], Runner(conv_mlp, 5, "cpu").run({"x": x}).outputs["y"])
    # on a GPU: FP32 FMAs asked for stay FP32; a half-precision family asked for runs in its own format, with or without --precision
    plan = make_plan(conv_mlp, 32, GPU)
    assert steps(record_plan_alone(plan, {"MatMul": "tiled"}, "fp16"))["fc1"][1:] == ("fp32", "--variant MatMul=tiled")
    assert steps(record_plan_alone(plan, {"MatMul": "wg_bf16"}, "fp16"))["fc1"][1:] == ("bf16", "--variant MatMul=wg_bf16")
    assert steps(record_plan_alone(plan, {"MatMul": "wg_fp16"}))["fc1"][1:] == ("fp16", None)
    assert steps(record_plan_alone(plan, {"Conv": "tc_bf16"}))["conv"][1:] == ("bf16", None)  # the Conv's opt-in families say theirs


@pytest.fixture(scope="module")
def attention_block(tmp_path_factory):
    """A transformer's attention: the QKV projection (a flat product), the fused attention reading Q, K and V as views of
    its output, the heads merged."""
    return load_model(save(projected_attention_model(heads=2, t=24, d=16), tmp_path_factory.mktemp("block") / "attention.onnx"))


@pytest.mark.parametrize("precision", REDUCED)
def test_a_fused_attention_runs_in_plain_tf32_under_every_reduced_precision_and_says_why(attention_block, precision):
    """It has no FP16 or BF16 kernel; plain TF32 rounds as finely as FP16 (BF16 more coarsely) with FP32's range. The
    step's precision is what its kernel computes in, tf32, not the run's."""
    why = None if precision == "tf32" else f"no {precision} kernel for a fused attention; plain TF32 instead"
    runner = Runner(attention_block, 2, "cpu", precision=precision)
    planned = steps(runner.plan_record())
    assert planned["qkv_projection"] == (f"matmul.reference.{precision}", precision, None)
    assert planned["qk"] == ("attention.reference.tf32", "tf32", why)
    assert f"precision: tf32{f': {why}' if why else ''}" in format_plan(runner.plan_record(), wide=True)
    on_gpu = steps(record_plan_alone(make_plan(attention_block, 32, GPU), None, precision))
    assert on_gpu["qk"] == ("attention.tf32", "tf32", why)
    assert step_precisions(make_plan(attention_block, 32, GPU), precision)["qk"].variant == "tf32"  # what the build is given


def test_an_fp32_run_keeps_the_fused_attention_in_3xtf32(attention_block):
    assert steps(Runner(attention_block, 2, "cpu").plan_record())["qk"] == ("attention.reference", "fp32", None)
    assert steps(record_plan_alone(make_plan(attention_block, 32, GPU)))["qk"] == ("attention.3xtf32", "fp32", None)


@pytest.mark.parametrize("precision", ["fp8", "FP16", "half", "Mixed", ""])
def test_a_precision_no_run_takes_is_one_line(conv_mlp, precision):
    with pytest.raises(InputError) as caught:
        Runner(conv_mlp, 2, "cpu", precision=precision)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")


@pytest.fixture(scope="module")
def two_products(tmp_path_factory):
    return load_model(save(two_products_model(scale=1e6), tmp_path_factory.mktemp("mixed") / "two_products.onnx"))


def test_mixed_keeps_the_steps_a_budget_keeps_in_fp32_and_runs_the_others_in_fp16(two_products):
    from opplugin.verify.mixed_precision import Budget, plan_mixed

    x = np.random.default_rng(5).random((8, 32)).astype(np.float32)
    found = plan_mixed(two_products.original, {"x": x}, Budget.parse("rel_l2=1e-2"))
    # fc2's outputs pass FP16's range: it and the bias it fuses are kept, fc1 is not
    assert found.keep_fp32() == {"fc2": "fc2 (MatMul) overflows FP16 alone", "fc2_bias": "fc2_bias (Add) overflows FP16 alone"}
    mixed = Runner(two_products, 8, "cpu", precision="mixed", keep_fp32=found.keep_fp32())
    record = mixed.plan_record()
    assert record.precision == "mixed"
    assert steps(record) == {"fc1": ("matmul.reference.fp16+relu", "fp16", None),
                             "fc2": ("matmul.reference", "fp32", f"{KEPT_BY_BUDGET}: fc2 (MatMul) overflows FP16 alone; "
                                                                 "fc2_bias (Add) overflows FP16 alone")}
    # FP16 throughout cannot hold fc2's weights and outputs; the mixed run keeps within FP16's error of FP32
    exact, half = (Runner(two_products, 8, "cpu", precision=p).run({"x": x}).outputs["y"] for p in ("fp32", "fp16"))
    got = mixed.run({"x": x}).outputs["y"]
    assert np.abs(exact).max() > 65504 and not np.all(np.isfinite(half))
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 2 ** -9


def test_mixed_with_nothing_kept_is_fp16(conv_mlp):
    x = np.random.default_rng(6).standard_normal((4, 3, 8, 8)).astype(np.float32)
    mixed, half = Runner(conv_mlp, 4, "cpu", precision="mixed", keep_fp32={}), Runner(conv_mlp, 4, "cpu", precision="fp16")
    assert steps(mixed.plan_record()) == steps(half.plan_record())
    assert np.array_equal(mixed.run({"x": x}).outputs["y"], half.run({"x": x}).outputs["y"])


def test_a_variant_for_the_op_type_wins_over_what_the_budget_keeps(conv_mlp):
    kept = steps(Runner(conv_mlp, 2, "cpu", {"MatMul": "reference"}, precision="mixed", keep_fp32={"fc1": "why"}).plan_record())
    assert kept["fc1"] == ("matmul.reference+relu", "fp32", "--variant MatMul=reference")
    assert steps(Runner(conv_mlp, 2, "cpu", precision="mixed", keep_fp32={"fc1_relu": ""}).plan_record())["fc1"][1:] == (
        "fp32", f"{KEPT_BY_BUDGET}: fc1_relu")  # without a why, the node's name


@pytest.mark.parametrize("precision, keep_fp32, says", [
    ("mixed", None, "precision 'mixed' needs keep_fp32: ONNX node name -> why it stays FP32"),
    ("fp16", {"fc1": "why"}, "keep_fp32 names the nodes a precision 'mixed' run keeps in FP32; this run's precision is 'fp16'"),
    ("mixed", ["fc1"], "keep_fp32 must map ONNX node names to why each stays FP32 (str -> str), got list"),
    ("mixed", {"fc9": "why"}, "keep_fp32 names 'fc9', which is no node of conv_mlp"),
])
def test_keep_fp32_comes_with_mixed_alone_and_names_nodes_of_the_model(conv_mlp, precision, keep_fp32, says):
    with pytest.raises(InputError) as caught:
        Runner(conv_mlp, 2, "cpu", precision=precision, keep_fp32=keep_fp32)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(says)
