"""The fused attention on the CPU: which chains after a batched MatMul fuse into one step (attention.py),
the float64 reference against onnxruntime, what stays unfused, and its CUDA kernel compiled by NVRTC."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import compile_cache
from attention_cases import attention_model, random_feeds, scaled_operands_model
from onnx_builders import save
from opplugin.gpu.device import CPU, Device
from opplugin.graph.model import load_model
from opplugin.ops.gemm import attention
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner

GPU = Device("cuda", "test GPU")

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
