"""The fused attention on the CPU: which chains after a batched MatMul fuse into one step (attention.py),
the float64 reference against onnxruntime, what stays unfused, the reference's emulation of the kernel's
plain TF32, and its CUDA kernel compiled by NVRTC in both precisions."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import compile_cache
from attention_cases import (attention_model, float64_operands, float64_result, random_feeds, scaled_operands_model,
                             tf32_bound)
from onnx_builders import save
from opplugin.core.number_formats import UNIT_ROUNDOFF, round_to
from opplugin.errors import PluginError
from opplugin.gpu.device import CPU, Device
from opplugin.graph.model import load_model
from opplugin.ops.gemm import attention
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from opplugin.verify.precision_cost import relative_l2

GPU = Device("cuda", "test GPU")
FP32_ROUNDING = 2.0 ** -24  # a float64 value rounded to float32 moves by at most this much of itself

FORMS = {  # name -> (attention_model's arguments, the fused step's ops)
    "scale and a constant bias (Swin)": ({}, ["MatMul", "Mul", "Add", "Softmax", "MatMul"]),
    "a bias computed at run time (a mask)": ({"bias": "input"}, ["MatMul", "Mul", "Add", "Softmax", "MatMul"]),
    "Div by sqrt(d), no bias": ({"bias": None, "div": True}, ["MatMul", "Div", "Softmax", "MatMul"]),
    "no scale (the dynamo export scales Q and K first)": ({"bias": None, "scale": None}, ["MatMul", "Softmax", "MatMul"]),
    "197 tokens, D 64 (ViT-S)": ({"t": 197, "d": 64, "dv": 64, "bias": None, "heads": 2}, ["MatMul", "Mul", "Softmax", "MatMul"]),
    "odd sizes, DV unlike D": ({"t": 37, "d": 24, "dv": 40}, ["MatMul", "Mul", "Add", "Softmax", "MatMul"]),
}


def onnxruntime_output(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("form", FORMS)
def test_an_attention_block_is_one_step_matching_onnxruntime(tmp_path, form):
    arguments, ops = FORMS[form]
    proto = attention_model(**arguments)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    runner = Runner(model, 3, "cpu")
    [step] = [s for s in runner.plan.steps if s.ops[0] == "MatMul"]
    assert step.ops == ops and runner.kernels[step.name].name == "attention.reference"
    assert step.kernel_name(GPU) == "attention.3xtf32"
    feeds = random_feeds(proto, 3, 7)
    # the reference is float64: the difference is onnxruntime's FP32 rounding, up to ~1e-6 over 197 keys
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_output(proto, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arguments, why", [
    ({"softmax_axis": 2}, "a Softmax over the queries"),
    ({"d": 80, "dv": 80}, "a head wider than the kernel's 64 values"),
    ({"opset": 11}, "Softmax before opset 13 flattens the axes from `axis` on"),
])
def test_what_is_not_one_attention_stays_a_batched_product(tmp_path, arguments, why):
    model = load_model(save(attention_model(**arguments), tmp_path / "attention.onnx"))
    plan = make_plan(model, 2, CPU)
    assert not any(s.ops[-1:] == ["MatMul"] and len(s.ops) > 1 for s in plan.plugin_steps), why


def test_the_spec_reads_broadcast_operands_and_refuses_what_does_not_multiply():
    spec = attention.AttentionSpec((8, 6, 49, 32), (8, 6, 32, 49), (8, 6, 49, 32), 0.17, (1, 6, 49, 49), frozenset({"bias"}))
    assert spec.reason_against() is None
    assert spec.strides("bias") == (0, 49 * 49) and spec.strides("q") == (6 * 49 * 32, 49 * 32)
    assert spec.output_shape(2) == (2, 6, 49, 32) and spec.matrices(2) == 12
    bad = attention.AttentionSpec((8, 6, 49, 32), (8, 6, 16, 49), (8, 6, 49, 32))
    assert "do not multiply" in bad.reason_against()
    rng = np.random.default_rng(0)
    q, kt, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((2, 3, 6, 7))
    scores = q @ kt * 0.5
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (expected / expected.sum(-1, keepdims=True)) @ v
    small = attention.AttentionSpec(q.shape, kt.shape, v.shape, 0.5)
    np.testing.assert_allclose(attention.reference(small, q, kt, v), expected, rtol=1e-12)


@pytest.mark.parametrize("precision", attention.PRECISIONS)
@pytest.mark.parametrize("arguments", [
    {"t": 197, "d": 64, "dv": 64, "bias": None, "heads": 6},  # ViT-S/16
    {"t": 49, "d": 32, "dv": 32, "heads": 3},  # Swin-T's windows, a relative position bias
    {"t": 37, "d": 24, "dv": 40, "bias": "input"},
])
def test_the_attention_kernel_compiles_without_spills(tmp_path, arguments, precision):
    model = load_model(save(attention_model(**arguments), tmp_path / "attention.onnx"))
    [step] = [s for s in make_plan(model, 32, GPU).plugin_steps if s.ops[0] == "MatMul"]
    spec = step.plugin._attention(step.node, GPU, None, step.fused)
    for arch in ("sm_90", "sm_80"):  # sm_80: NVRTC's fast compile, which shows that it compiles for Ampere
        usage = compile_cache.check_source(attention.SOURCE, attention.defines(spec, precision=precision), "attention_tc", arch)
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


VIT_S = {"t": 197, "d": 64, "dv": 64, "heads": 2, "bias": None, "scale": 0.125}
SWIN_WINDOW = {"t": 49, "d": 32, "dv": 32, "heads": 3}  # a relative position bias


@pytest.mark.parametrize("arguments", [VIT_S, SWIN_WINDOW], ids=["ViT-S/16", "Swin-T window"])
def test_the_tf32_reference_rounds_each_products_operands_and_keeps_within_tf32s_bound(tmp_path, arguments):
    """Under --precision fp16 the CPU runs attention.reference.tf32, the GPU kernel's plain TF32 emulated: Q, K^T,
    the probabilities and V rounded to TF32 before their products, the rest in float64. Its error is TF32's,
    far above an FP32 run's, and within the bound TF32's roundings allow (attention_cases.tf32_bound)."""
    batch = 3
    proto = attention_model(**arguments, seed=4)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    feeds = random_feeds(proto, batch, 6)
    reduced = Runner(model, batch, "cpu", precision="fp16")
    [step] = [s for s in reduced.plan.plugin_steps if "Softmax" in s.ops]
    assert reduced.kernels[step.name].name == "attention.reference.tf32"
    got = reduced.run(feeds).outputs["y"]
    fp32 = Runner(model, batch, "cpu").run(feeds).outputs["y"]
    spec = step.plugin._attention(step.node, CPU, None, step.fused)
    q, kt, v, bias = float64_operands(spec, model, feeds)
    exact, p = float64_result(spec, q, kt, v, bias)
    # P's pass through float32 before its rounding, and the output's cast, add FP32_ROUNDING of P |V| each
    assert np.all(np.abs(got - exact) <= tf32_bound(spec.scale, q, kt, v, p) + 2 * FP32_ROUNDING * (p @ np.abs(v)))
    # and it did round: its error is TF32's, far above FP32's, which a reference that rounds nothing would keep
    u = UNIT_ROUNDOFF["tf32"]
    assert relative_l2(got, exact) > u / 8 and relative_l2(got, exact) > 50 * relative_l2(fp32, exact)
    # every operand of both products rounded, nothing else: the same steps written out, up to the output's cast
    def tf32(x):
        return round_to(np.asarray(x, np.float32), "tf32").astype(np.float64)

    scores = tf32(q) @ tf32(kt) * spec.scale + (0.0 if bias is None else bias)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    emulated = tf32(e / e.sum(axis=-1, keepdims=True)) @ tf32(v)
    assert np.all(np.abs(got - emulated) <= FP32_ROUNDING * np.abs(emulated))


def test_an_infinity_under_a_reduced_precision_reruns_its_chunk_on_the_nodes_in_fp32(tmp_path):
    """The exact path builds the step's MatMul alone with the emulation's variant, which a lone batched product has
    not: it falls back to its plugin's own choice, and the chunk's NaN and Inf land where onnxruntime's do."""
    proto = attention_model()
    runner = Runner(load_model(save(proto, tmp_path / "attention.onnx")), 4, "cpu", chunk=2, streams=1, precision="fp16")
    feeds = random_feeds(proto, 4, 2)
    feeds["v"][2, 1, 5, 3] = np.inf
    result = runner.run(feeds)
    assert result.exact_reruns == 1
    reference = onnxruntime_output(proto, feeds)
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
    np.testing.assert_array_equal(np.isinf(result.outputs["y"]), np.isinf(reference))


def test_the_plain_tf32_attention_may_be_asked_for_by_name_and_builds_its_kernel_without_the_split(tmp_path):
    model = load_model(save(attention_model(), tmp_path / "attention.onnx"))
    runner = Runner(model, 2, "cpu", {"MatMul": "reference.tf32"})
    [record] = [s for s in runner.plan_record().steps if "Softmax" in s.ops]
    assert (record.implementation, record.precision, record.precision_reason) == ("attention.reference.tf32", "tf32", None)
    # the kernel names its emulation, so that the exact path's rerun of a chunk asks for the same precision
    assert runner.kernels[record.name].variant == "reference.tf32"
    [step] = [s for s in make_plan(model, 2, GPU).plugin_steps if "Softmax" in s.ops]
    assert (step.kernel_name(GPU), step.kernel_name(GPU, "tf32")) == ("attention.3xtf32", "attention.tf32")
    hopper = Device("cuda", "test H200", "9.0")  # compile jobs need an architecture
    [split], [plain] = step.compile_jobs(hopper), step.compile_jobs(hopper, "tf32")
    assert "-DSPLIT=1" in split.options and "-DSPLIT=0" in plain.options
    with pytest.raises(PluginError, match=r"whose kernels are the tensor cores' in 3xTF32 or plain TF32 \('reference', "
                                          r"'batched_3xtf32', 'tf32', 'reference.tf32'\); 'tc_fp16' runs the product alone"):
        step.kernel_name(GPU, "tc_fp16")
    assert attention.shared_bytes("tf32") == attention.shared_bytes() - 64 * 68 * 4  # no small parts of Q's tile


def test_bench_attention_without_a_gpu_is_a_clear_error(capsys):
    from opplugin.cli import main
    from opplugin.gpu import cuda

    if cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["bench", "--suite", "attention"]) == 2
    assert "bench --suite attention needs a CUDA device" in capsys.readouterr().err


def test_the_attention_bench_page_and_table_show_every_row():
    from opplugin.lab import attention_bench, bench_page

    rows = [{"shape": "vit_b_16", "batch": 32, "name": "opplugin attention.3xtf32", "ms": 0.21, "rel_error": 3e-7,
             "gflop_per_s": 41000.0, "vs_sdpa": 1.2},
            {"shape": "vit_b_16", "batch": 32, "name": "PyTorch scaled_dot_product_attention", "ms": 0.25, "rel_error": 2e-7,
             "gflop_per_s": 34000.0, "vs_sdpa": 1.0},
            {"shape": "vit_b_16", "batch": 32, "name": "broken", "ms": None, "rel_error": 0.3, "gflop_per_s": None, "vs_sdpa": None}]
    payload = {"schema": attention_bench.SCHEMA, "opplugin_version": "0", "device": {"kind": "cuda", "name": "test GPU"},
               "model": ["vit_b_16"], "batch": [32], "peers": "torch", "rows": rows}
    text = attention_bench.format_text(payload)
    assert "opplugin attention.3xtf32" in text and "1.20" in text and "3.0e-01" in text
    page = bench_page.bench_page("attention", payload)
    assert "vit_b_16, batch 32" in page and "not timed: relative error 0.3" in page


def test_the_scales_of_q_and_k_move_after_their_product_into_the_attention(tmp_path):
    """torch's dynamo export scales Q and K^T each by d^-1/4: at load the two Muls become one after the
    product (graph/passes/matmul_scales.py), which the fused attention takes as its scale."""
    proto = scaled_operands_model()
    model = load_model(save(proto, tmp_path / "sdpa.onnx"))
    assert model.simplification.constants_folded.get("MatMul operand scale") == 2
    runner = Runner(model, 2, "cpu")
    [step] = [s for s in runner.plan.plugin_steps if s.ops[0] == "MatMul"]
    assert step.ops == ["MatMul", "Mul", "Softmax", "MatMul"] and runner.kernels[step.name].name == "attention.reference"
    feeds = random_feeds(proto, 2, 4)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_output(proto, feeds), rtol=1e-5, atol=1e-6)
    kept = load_model(save(proto, tmp_path / "sdpa.onnx"), keep=["q_scaled"])  # --keep leaves the pass out
    assert "MatMul operand scale" not in kept.simplification.constants_folded


@pytest.mark.parametrize("batch, chunk", [(2, None), (5, 2)])
def test_a_shifted_window_attention_with_its_mask_is_one_step(tmp_path, batch, chunk):
    """Swin's shifted windows: the mask added between Reshapes to (N, windows, ..) and back joins the step,
    summed with the bias into one constant over (windows, heads)."""
    from attention_cases import shifted_window_model

    proto = shifted_window_model()
    runner = Runner(load_model(save(proto, tmp_path / "shifted.onnx")), batch, "cpu", chunk=chunk)
    [step] = [s for s in runner.plan.plugin_steps if s.ops[0] == "MatMul"]
    assert step.ops == ["MatMul", "Mul", "Add", "Reshape", "Add", "Reshape", "Softmax", "MatMul", "Transpose"]
    spec = step.plugin._attention(step.node, CPU, None, step.fused)
    assert spec.windows == 4 and spec.bias_shape == (1, 4, 3, 16, 16) and spec.q_shape[1:] == (4, 3, 16, 8)
    assert spec.flops(2) == 2 * (2 * 4 * 3) * 16 * 16 * (8 + 8)  # two images: 4 windows x 3 heads each
    assert step.kernel_name(GPU) == "attention.3xtf32"
    feeds = random_feeds(proto, batch, 1)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_output(proto, feeds), rtol=1e-5, atol=1e-5)


def test_a_mask_computed_at_run_time_keeps_the_shifted_windows_apart(tmp_path):
    from attention_cases import shifted_window_model

    proto = shifted_window_model()
    mask = next(i for i in proto.graph.initializer if i.name == "mask")
    proto.graph.initializer.remove(mask)
    proto.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 4, 1, 16, 16]))
    plan = make_plan(load_model(save(proto, tmp_path / "shifted.onnx")), 2, CPU)
    assert not any("Softmax" in s.ops and s.ops[0] == "MatMul" for s in plan.plugin_steps)
