"""The fused attention kernel (kernels/attention_tc.cu) on the GPU: against float64 with its output
poisoned, in 3xTF32 and in plain TF32 (SPLIT 0), inside a run against onnxruntime (a run in FP16 too), and
its NaN/Inf flag with the run's exact rerun.

GPU tests (marker `gpu`, skipped without a CUDA device)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attention_cases import (attention_model, error_scale, float64_operands, float64_result, projected_attention_model, random_feeds,
                             tf32_bound)
from onnx_builders import save
from opplugin.core.number_formats import UNIT_ROUNDOFF
from opplugin.gpu.device import current_cuda_device
from opplugin.graph.model import load_model
from opplugin.ops.gemm import attention
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from opplugin.verify.check import default_tolerance
from opplugin.verify.precision_cost import relative_l2

pytestmark = pytest.mark.gpu
RTOL = 2e-6  # per unit of error_scale, as for the Gemm families
FP32_SUM = 2.0 ** -23  # a truncating FP32 add (the tensor cores' accumulator) moves a sum by at most this much of it

SHAPES = {  # name -> attention_model's arguments
    "ViT-S/16: 197 tokens, 6 heads of 64": {"t": 197, "d": 64, "dv": 64, "heads": 6, "bias": None, "scale": 0.125},
    "Swin-T window: 49 tokens, 3 heads of 32, relative position bias": {"t": 49, "d": 32, "dv": 32, "heads": 3},
    "odd sizes, DV unlike D, a mask at run time": {"t": 70, "d": 24, "dv": 40, "bias": "input"},
    "one key tile short of full, Div": {"t": 63, "d": 64, "dv": 64, "bias": None, "div": True},
    "no scale": {"t": 130, "d": 48, "dv": 48, "bias": None, "scale": None},
}


def fused_step(model, batch, device):
    [step] = [s for s in make_plan(model, batch, device).plugin_steps if s.ops[0] == "MatMul"]
    assert step.ops[-2:] == ["Softmax", "MatMul"]
    return step


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("batch", [1, 5])
def test_the_kernel_matches_float64_with_its_output_poisoned(tmp_path, shape, batch):
    proto = attention_model(**SHAPES[shape], seed=batch)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    device = current_cuda_device()
    step = fused_step(model, batch, device)
    kernel = step.build(device)
    assert kernel.name == "attention.3xtf32"
    feeds = random_feeds(proto, batch, 3)
    assert step.inputs[:2] == ["q", "k"]  # K^T read as a transposed view of K
    spec = step.plugin._attention(step.node, device, None, step.fused)
    y = poisoned_call(kernel, step, spec, feeds, batch)
    q, kt, v, bias = float64_operands(spec, model, feeds)
    exact, probabilities = float64_result(spec, q, kt, v, bias)
    error = np.abs(y - exact) / error_scale(spec.scale, q, kt, v, probabilities)
    assert error.max() <= RTOL, f"worst error {error.max():.2e} of the rounding scale"


def poisoned_call(kernel, step, spec, feeds, batch) -> np.ndarray:
    """The kernel's output for the step's feeds, written into an output of NaN."""
    import cupy

    out = cupy.full(spec.output_shape(batch), np.nan, dtype=cupy.float32)
    [y] = kernel([cupy.asarray(feeds[name]) for name in step.inputs], None, out=out)
    assert y is out
    return cupy.asnumpy(y)


@pytest.mark.parametrize("shape", ["ViT-S/16: 197 tokens, 6 heads of 64", "Swin-T window: 49 tokens, 3 heads of 32, relative position bias"])
def test_plain_tf32_keeps_within_tf32s_bound_and_differs_from_3xtf32(tmp_path, shape):
    """SPLIT 0 (attention.tf32, what --precision fp16 runs): within the bound TF32's roundings allow
    (attention_cases.tf32_bound), plus the kernel's FP32 arithmetic (3xTF32's own RTOL) and its MMAs' truncating
    sums, which plain TF32 does not gather per slice (D terms a score, TK an output); and off 3xTF32's result by
    TF32's error, so the split is really off."""
    batch = 5
    proto = attention_model(**SHAPES[shape], seed=batch)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    device = current_cuda_device()
    step = fused_step(model, batch, device)
    spec = step.plugin._attention(step.node, device, None, step.fused)
    plain, split = step.build(device, "tf32"), step.build(device)
    assert (plain.name, split.name) == ("attention.tf32", "attention.3xtf32")
    feeds = random_feeds(proto, batch, 3)
    y, y_split = poisoned_call(plain, step, spec, feeds, batch), poisoned_call(split, step, spec, feeds, batch)
    q, kt, v, bias = float64_operands(spec, model, feeds)
    exact, probabilities = float64_result(spec, q, kt, v, bias)
    fp32 = (RTOL + (spec.tk + 2 * spec.d) * FP32_SUM) * error_scale(spec.scale, q, kt, v, probabilities)
    excess = np.abs(y - exact) - tf32_bound(spec.scale, q, kt, v, probabilities) - fp32
    assert excess.max() <= 0, f"{np.count_nonzero(excess > 0)} outputs past the TF32 bound"
    assert relative_l2(y, y_split) > UNIT_ROUNDOFF["tf32"] / 8  # TF32's error, where 3xTF32's is FP32's (~3e-8)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_run_with_the_fused_attention_matches_onnxruntime(tmp_path, shape):
    proto = attention_model(**SHAPES[shape])
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    runner = Runner(model, 4, "cuda")
    assert any(runner.kernels[s.name].name == "attention.3xtf32" for s in runner.plan.plugin_steps)
    feeds = random_feeds(proto, 4, 9)
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for _ in range(2):  # eager, then replayed from a CUDA graph
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("start", [0, 1], ids=["on 16 bytes", "a float past"])
@pytest.mark.parametrize("out_perm", [None, (0, 2, 1, 3), (2, 0, 1, 3)])
def test_the_kernel_reads_strided_views_and_writes_through_a_transposed_one(out_perm, start):
    """Q, K^T and V as slices of one QKV tensor (K^T a transposed view), the output poisoned and written
    through the fused Transpose's view; the tensor starting on 16 bytes (tiles copied four floats at a
    time) or a float past (a float at a time)."""
    import cupy

    batch, heads, t, d = 3, 4, 83, 32
    qkv = np.random.default_rng(5).standard_normal((batch, t, 3, heads, d)).astype(np.float32)
    flat = cupy.full(qkv.size + 1, np.nan, dtype=cupy.float32)
    flat[start:start + qkv.size] = cupy.asarray(qkv).ravel()
    device_qkv = flat[start:start + qkv.size].reshape(qkv.shape).transpose(2, 0, 3, 1, 4)  # (3, N, H, T, D), a view
    q, k, v = device_qkv[0], device_qkv[1], device_qkv[2]
    assert attention.starts_aligned(q) == (start == 0)
    kt = k.transpose(0, 1, 3, 2)
    spec = attention.AttentionSpec((batch, heads, t, d), (batch, heads, d, t), (batch, heads, t, d), 0.2, out_perm=out_perm)
    kernel = attention.AttentionKernel(spec, "attention.3xtf32", {})
    out = cupy.full(spec.output_shape(batch), np.nan, dtype=cupy.float32)
    [y] = kernel([q, kt, v], None, out=out)
    assert y is out and len(kernel.functions) == 2  # the contiguous layout, built, and this one
    host = qkv.astype(np.float64).transpose(2, 0, 3, 1, 4)
    exact_q, exact_kt, exact_v = host[0], host[1].transpose(0, 1, 3, 2), host[2]
    plain = attention.AttentionSpec(spec.q_shape, spec.kt_shape, spec.v_shape, spec.scale)
    exact = attention.reference(plain, exact_q, exact_kt, exact_v)
    probabilities = attention.reference(plain, exact_q, exact_kt, np.broadcast_to(np.eye(t), (batch, heads, t, t)))
    scale = error_scale(spec.scale, exact_q, exact_kt, exact_v, probabilities)
    got = cupy.asnumpy(y) if out_perm is None else cupy.asnumpy(y).transpose(np.argsort(out_perm))
    assert (np.abs(got - exact) / scale).max() <= RTOL


def test_a_run_in_fp16_runs_the_attention_in_plain_tf32_and_matches_onnxruntime_within_fp16s_rule(tmp_path):
    proto = projected_attention_model(heads=6, t=197, d=64)
    runner = Runner(load_model(save(proto, tmp_path / "attention.onnx")), 5, "cuda", chunk=3, precision="fp16")
    [attention_step] = [s for s in runner.plan.plugin_steps if "Softmax" in s.ops]
    assert runner.kernels[attention_step.name].name == "attention.tf32"
    assert {s.name: s.precision for s in runner.plan_record().steps}[attention_step.name] == "tf32"
    feeds = random_feeds(proto, 5, 2)
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    atol, rtol = default_tolerance("fp16")
    for _ in range(2):  # eager, then replayed from a CUDA graph
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], reference, rtol=rtol, atol=atol)


@pytest.mark.parametrize("split", [False, True], ids=["Slice", "Split"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_a_run_through_views_matches_onnxruntime(tmp_path, split, chunk):
    proto = projected_attention_model(heads=6, t=197, d=64, split=split)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    runner = Runner(model, 5, "cuda", chunk=chunk)
    [attention_step] = [s for s in runner.plan.plugin_steps if s.views and "Softmax" in s.ops]
    assert runner.kernels[attention_step.name].name == "attention.3xtf32"
    feeds = random_feeds(proto, 5, 2)
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for _ in range(2):  # eager, then replayed from a CUDA graph
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], reference, rtol=1e-5, atol=2e-5)


def test_an_infinity_read_through_views_reruns_the_views_then_the_nodes(tmp_path):
    proto = projected_attention_model(heads=2, t=40, d=16)
    runner = Runner(load_model(save(proto, tmp_path / "attention.onnx")), 4, "cuda", chunk=2, streams=1)
    feeds = random_feeds(proto, 4, 3)
    feeds["x"][3, 7, 5] = np.inf
    result = runner.run(feeds)
    assert result.exact_reruns == 1
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
    finite = np.isfinite(reference)
    np.testing.assert_allclose(result.outputs["y"][finite], reference[finite], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])  # attention.3xtf32, attention.tf32
def test_an_infinity_is_flagged_and_the_chunk_reruns_node_by_node(tmp_path, precision):
    proto = attention_model(t=49, d=32, dv=32)
    model = load_model(save(proto, tmp_path / "attention.onnx"))
    runner = Runner(model, 4, "cuda", chunk=4, streams=1, precision=precision)
    feeds = random_feeds(proto, 4, 2)
    feeds["v"][2, 1, 5, 3] = np.inf
    result = runner.run(feeds)
    assert result.exact_reruns == 1
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
    np.testing.assert_array_equal(np.isinf(result.outputs["y"]), np.isinf(reference))


def test_the_attention_bench_checks_and_times_every_candidate():
    from opplugin.lab import attention_bench

    payload = attention_bench.run_attention_bench([1], warmup=1, repeat=3)
    assert {row["shape"] for row in payload["rows"]} == {shape[0] for shape in attention_bench.SHAPES}
    ours = [row for row in payload["rows"] if row["name"].startswith("opplugin")]
    assert ours and all(row["rel_error"] <= attention_bench.TOLERANCE and row["ms"] > 0 for row in ours)
    assert all(row["timer"] == "cuda-graph" for row in payload["rows"] if row["ms"] is not None)  # the host's launch left out


@pytest.mark.parametrize("windows, heads, t, d", [(4, 3, 49, 32), (16, 6, 49, 32)])
def test_a_shifted_window_attention_matches_onnxruntime(tmp_path, windows, heads, t, d):
    from attention_cases import shifted_window_model

    proto = shifted_window_model(windows, heads, t, d)
    runner = Runner(load_model(save(proto, tmp_path / "shifted.onnx")), 3, "cuda")
    [step] = [s for s in runner.plan.plugin_steps if "Softmax" in s.ops]
    assert runner.kernels[step.name].name == "attention.3xtf32"
    feeds = random_feeds(proto, 3, 5)
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for _ in range(2):  # eager, then replayed from a CUDA graph
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], reference, rtol=1e-5, atol=2e-5)
