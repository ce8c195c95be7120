"""`opplugin bench --suite attention`: the fused attention kernel (kernels/attention_tc.cu) on the
attention shapes of ViT-B/16, ViT-S/16 and Swin-T, beside PyTorch's scaled_dot_product_attention (which
picks FlashAttention or the memory-efficient kernel where it can) and its plain three-op form, all in FP32
(TF32 off), in the same run.

Per shape and batch: each candidate's output is checked against float64 on the host first (the
largest |error| over the largest |value|), then timed as a runner launches it by default: back-to-back
calls replayed from one CUDA graph (graphed.py; PyTorch's through torch.cuda.CUDAGraph), the median of
the CUDA events' time per call after warm-up. Launched eagerly from Python, a batch-1 call would be timed
as the host's launch: 15 to 25 us on an H200's host, more than either kernel takes."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import InputError
from ..gpu import cuda
from ..gpu.device import current_cuda_device
from ..ops.gemm import attention
from ..report.jsonout import header
from .graphed import cupy_replay, torch_replay
from .trial import BENCH_REPEAT, BENCH_WARMUP, time_call

# (label, heads, tokens, head size, windows per image, has a bias): the attention of each block
SHAPES = (
    ("vit_b_16", 12, 197, 64, 1, False),
    ("vit_small_patch16_224", 6, 197, 64, 1, False),
    ("swin_t stage 1 (7x7 windows)", 3, 49, 32, 64, True),
    ("swin_t stage 3 (7x7 windows)", 12, 49, 32, 4, True),
)
BATCHES = (1, 32)
SCHEMA = "opplugin-bench-attention/2"  # /2: replayed from CUDA graphs; rows say their timer
TOLERANCE = 1e-5  # max |ours - exact| / max |exact|: an FP32-exact kernel's


def spec_of(heads: int, tokens: int, size: int, windows: int, biased: bool) -> attention.AttentionSpec:
    """Q, K^T and V of (images x windows, heads, tokens, size), as the graph has them at batch 1 of images."""
    lead = (windows, heads)
    return attention.AttentionSpec((*lead, tokens, size), (*lead, size, tokens), (*lead, tokens, size), size ** -0.5,
                                   (1, heads, tokens, tokens) if biased else None, frozenset({"bias"}) if biased else frozenset())


def checked_error(output: Any, exact: np.ndarray) -> float:
    import cupy

    got = cupy.asnumpy(cupy.asarray(output)).astype(np.float64)
    return float(np.abs(got - exact).max() / max(1e-30, np.abs(exact).max()))


def bench_shape(label: str, heads: int, tokens: int, size: int, windows: int, biased: bool, batch: int, torch: Any,
                warmup: int, repeat: int) -> list[dict[str, Any]]:
    import cupy

    spec = spec_of(heads, tokens, size, windows, biased)
    rng = np.random.default_rng(batch * 131 + tokens)
    shape = (batch * windows, heads, tokens, size)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    kt = np.ascontiguousarray(np.swapaxes(k, -1, -2))
    bias = rng.standard_normal((1, heads, tokens, tokens)).astype(np.float32) if biased else None
    exact = attention.reference(spec, q.astype(np.float64), kt.astype(np.float64), v.astype(np.float64),
                                None if bias is None else bias.astype(np.float64))
    ours = attention.AttentionKernel(spec, "attention.3xtf32", {"bias": bias} if biased else {})
    device_q, device_k, device_v = (cupy.asarray(x) for x in (q, k, v))
    device_kt = cupy.swapaxes(device_k, -1, -2)  # K^T as exporters write it, a Transpose of K: the runner's view
    candidates: list[tuple[str, Callable[[], Any], Any]] = [
        ("opplugin attention.3xtf32", lambda: ours([device_q, device_kt, device_v])[0], cupy_replay)]
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
        mask = torch.from_numpy(bias).cuda() if biased else None
        sdpa = torch.nn.functional.scaled_dot_product_attention
        def torch_capture(run: Callable[[], Any], calls: int) -> Callable[[], Any]:
            return torch_replay(torch, run, calls)

        candidates.append(("PyTorch scaled_dot_product_attention", lambda: sdpa(tq, tk, tv, attn_mask=mask, scale=spec.scale),
                           torch_capture))

        def three_ops():
            scores = torch.matmul(tq, tk.transpose(-1, -2)) * spec.scale
            return torch.matmul(torch.softmax(scores + mask if biased else scores, dim=-1), tv)

        candidates.append(("PyTorch matmul > softmax > matmul", three_ops, torch_capture))
    rows = []
    for name, run, capture in candidates:
        error = checked_error(run(), exact)
        timing = time_call(run, warmup, repeat, capture) if error <= TOLERANCE else None
        ms = timing and timing.ms
        rows.append({"shape": label, "batch": batch, "name": name, "ms": ms, "rel_error": error,
                     "timer": timing and timing.timer, "note": timing and timing.note,
                     "gflop_per_s": spec.flops(batch * windows) / (ms * 1e-3) / 1e9 if ms else None})
    sdpa_ms = next((r["ms"] for r in rows if "scaled_dot" in r["name"]), None)
    for row in rows:
        row["vs_sdpa"] = sdpa_ms / row["ms"] if sdpa_ms and row["ms"] else None
    return rows


def run_attention_bench(batches: Sequence[int] = BATCHES, warmup: int = BENCH_WARMUP, repeat: int = BENCH_REPEAT,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    if not cuda.is_available():
        raise InputError("bench --suite attention needs a CUDA device")
    from .peers import torch_or_reason

    torch, why = torch_or_reason()
    rows = []
    for label, heads, tokens, size, windows, biased in SHAPES:
        for batch in batches:
            if progress:
                progress(f"bench attention: {label} at batch {batch}")
            rows += bench_shape(label, heads, tokens, size, windows, biased, batch, torch, warmup, repeat)
    return header(SCHEMA, current_cuda_device(), [s[0] for s in SHAPES], list(batches)) | {
        "peers": "torch.nn.functional.scaled_dot_product_attention, FP32, TF32 off" if torch is not None else f"unavailable: {why}",
        "rows": rows}


TABLE_HEADER = ["shape", "batch", "implementation", "device ms", "GFLOP/s", "error vs float64", "vs SDPA"]
TABLE_NUMBERS = (1, 3, 4, 5, 6)


def format_text(payload: dict[str, Any]) -> str:
    from ..core.texttable import text_table

    return (f"Attention on {payload['device']['name']}, FP32 (TF32 off); peers: {payload['peers']}\n"
            "device ms: per call, replayed from a CUDA graph of back-to-back calls; vs SDPA: PyTorch's\n"
            "scaled_dot_product_attention device ms / the row's (above 1: faster)\n"
            + "\n".join(text_table(TABLE_HEADER, table_cells(payload), right=TABLE_NUMBERS)) + "\n"
            + "".join(f"- {r['name']} ({r['shape']}, batch {r['batch']}): {r['note']}\n" for r in payload["rows"] if r.get("note")))


def table_cells(payload: dict[str, Any]) -> list[list[str]]:
    """A line of TABLE_HEADER per row, for the text table and the HTML page (lab/bench_page.py)."""
    def figure(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    return [[r["shape"], str(r["batch"]), r["name"], figure(r["ms"], ".4f"), figure(r["gflop_per_s"], ".0f"),
             figure(r["rel_error"], ".1e"), figure(r["vs_sdpa"], ".2f")] for r in payload["rows"]]
