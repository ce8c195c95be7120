"""`opplugin bench --suite gemm`: the seeds' fully connected layers, each Gemm family against
cuBLAS (PyTorch's `torch.nn.functional.linear`, FP32 with TF32 off) in the same run.

Per layer and batch: the median device time per call over CUDA events after warm-up
(the host enqueues ten calls behind a 2 GiB fill, so that Python's launch overhead,
~20 us a call for opplugin and PyTorch alike, hides behind the GPU's work and the
events time the kernels), the median time of one call alone (that overhead included:
what a lone batch-1 call costs from Python), GB/s (the fewest bytes
over the time), the memory floor (the weight bytes over this device's measured copy
bandwidth: what a batch-1 layer cannot beat), and each candidate's ratio to cuBLAS
(cuBLAS ms / ours: above 1 is faster). Every candidate's output is checked first: a
few rows against float64 on the host, with the output poisoned (NaN) before the call.
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..gpu import cuda
from ..gpu.device import current_cuda_device
from ..report.jsonout import header
from ..errors import InputError
from ..ops.gemm import families
from ..ops.gemm.epilogue import NONE
from ..ops.gemm.kernel import GemmKernel
from ..ops.gemm.spec import BIAS_COLUMN, GemmSpec
from ..core.texttable import text_table
from . import roofline
from .device_time import HOST_BOUND_MS, device_ms, make_ballast
from .trial import BENCH_REPEAT, BENCH_WARMUP

# (label, K, N): the CS259 classifier, the one-hidden-layer report's network, lenet86's and ece408_high's
# first Gemm, then a ViT-S/16 block's projections (QKV, MLP in and out) and ViT-B/16's MLP, whose rows are
# tokens (197 an image: batch 10,000 is about 50 images)
LAYERS = (
    ("cs259 fc1", 25088, 4096),
    ("cs259 fc2", 4096, 1024),
    ("onehidden fc1", 32754, 128),
    ("onehidden fc2", 128, 4),
    ("lenet86 fc1", 1024, 32),
    ("ece408_high fc1", 7200, 128),
    ("vit_s qkv", 384, 1152),
    ("vit_s mlp1", 384, 1536),
    ("vit_s mlp2", 1536, 384),
    ("vit_b mlp1", 768, 3072),
    ("vit_b mlp2", 3072, 768),
)
BATCHES = (1, 16, 10000)
SCHEMA = "opplugin-bench-gemm/1"
FIT_SHARE = 0.5  # a layer runs at a batch when its operands take at most this share of the free device memory
CHECKED_ROWS = 4  # rows per candidate compared with float64 on the host
TOLERANCE = 1e-4  # max |ours - exact| / max |exact| over the checked rows


@dataclass
class Candidate:
    name: str
    run: Callable[[], Any]  # the layer's output on the device


def layer_spec(k: int, n: int, batch: int) -> GemmSpec:
    return GemmSpec(batch, n, k, trans_b=True, bias=BIAS_COLUMN, bias_shape=(n,))


def candidates(spec: GemmSpec, a: Any, w: np.ndarray, b: np.ndarray, all_configs: bool = False) -> list[Candidate]:
    """The heuristic's choice first, then every other exact family's default configuration that runs the
    layer (gemv only up to its batch of 16), and with `all_configs` every tile of the tiled, tc_3xtf32 and
    wg_3xtf32 families, wg_3xtf32's default tile with K split in 1, 2, 4 and 8 runs, and, for batches gemv serves, its configurations with the default rows per block (and a
    quarter of them)."""
    chosen = families.heuristic_config(spec)
    configs = [chosen] + [families.DEFAULTS[name](spec) for name in families.EXACT_FAMILIES]
    if all_configs:
        configs += families.TILES + [families.TensorConfig("tc_3xtf32", (*tile, families.TENSOR_DEPTH), warp, stages)
                                     for tile, warp in families.TENSOR_TILES.items() for stages in (2, 3, 4)]
        configs += [families.WgmmaConfig("wg_3xtf32", (*tile, families.TENSOR_DEPTH), stages)
                    for tile in families.WGMMA_TILES for stages in (2, 3, 4)]
        configs += [dataclasses.replace(families.wgmma_default(spec), splits=splits) for splits in (1, 2, 4, 8)]
        if spec.m <= families.MAX_GEMV_BATCH:
            rows = {families.gemv_default(spec).mb, max(1, families.gemv_default(spec).mb // 4)}
            configs += [families.GemvConfig("gemv", (mb, opw), wpr) for mb in sorted(rows) for opw in (1, 2) for wpr in (1, 2, 4, 8, 16)]
    found = []
    for config in dict.fromkeys(configs):
        if config.family == "gemv" and spec.m > families.MAX_GEMV_BATCH:
            continue  # built for batch <= 16: at 10,000 it would reread the weights 625 times
        if families.unsupported_reason(spec, config) is None:
            kernel = GemmKernel(spec, config, NONE, w, b)
            found.append(Candidate(kernel.name + (" (heuristic)" if config == chosen else ""), lambda k=kernel: k([a])[0]))
    return found


def cublas_candidate(torch: Any, a: Any, w: np.ndarray, b: np.ndarray) -> Candidate:
    torch.backends.cuda.matmul.allow_tf32 = False
    ta = torch.from_dlpack(a)
    tw, tb = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()
    return Candidate("cuBLAS (torch linear, FP32)", lambda: torch.nn.functional.linear(ta, tw, tb))


def checked_error(output: Any, a_rows: np.ndarray, rows: np.ndarray, w: np.ndarray, b: np.ndarray) -> float:
    import cupy

    got = cupy.asnumpy(cupy.asarray(output)[cupy.asarray(rows)]).astype(np.float64)
    exact = a_rows.astype(np.float64) @ w.astype(np.float64).T + b
    return float(np.abs(got - exact).max() / max(1e-30, np.abs(exact).max()))


def bench_layer(label: str, k: int, n: int, batch: int, bandwidth: float, torch: Any, warmup: int, repeat: int,
                ballast: Any, all_configs: bool = False) -> list[dict]:
    import cupy

    rng = np.random.default_rng(batch * 7 + k)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a = cupy.random.standard_normal((batch, k), dtype=cupy.float32)
    rows = np.unique(np.array([0, batch // 2, batch - 1, rng.integers(batch)]))[:CHECKED_ROWS]
    a_rows = cupy.asnumpy(a[cupy.asarray(rows)])
    spec = layer_spec(k, n, batch)
    weight_floor = 1e3 * 4 * (n * k + n) / bandwidth
    found = candidates(spec, a, w, b, all_configs) + ([cublas_candidate(torch, a, w, b)] if torch is not None else [])
    results = []
    for candidate in found:
        error = checked_error(candidate.run(), a_rows, rows, w, b)
        ms = device_ms(candidate.run, warmup, repeat, ballast) if error <= TOLERANCE else None
        call_ms = statistics.median(cuda.time_ms(candidate.run, warmup=0, repeat=repeat)) if ms is not None and ms < HOST_BOUND_MS else ms
        results.append({"layer": label, "k": k, "n": n, "batch": batch, "name": candidate.name, "ms": ms, "call_ms": call_ms,
                        "rel_error": error,
                        "gb_per_s": spec.bytes_moved() / (ms * 1e-3) / 1e9 if ms else None,
                        "weight_floor_ms": weight_floor, "x_floor": ms / weight_floor if ms else None})
    cublas = next((r["ms"] for r in results if r["name"].startswith("cuBLAS")), None)
    for r in results:
        r["vs_cublas"] = cublas / r["ms"] if cublas and r["ms"] else None
    del a
    cupy.get_default_memory_pool().free_all_blocks()
    return results


def fits(k: int, n: int, batch: int) -> bool:
    import cupy

    free, _ = cupy.cuda.runtime.memGetInfo()
    return 4 * (batch * k + n * k + batch * n) * 3 <= FIT_SHARE * free  # ours, cuBLAS's and a spare output


def run_gemm_bench(batches: Sequence[int] = BATCHES, warmup: int = BENCH_WARMUP, repeat: int = BENCH_REPEAT, all_configs: bool = False,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    if not cuda.is_available():
        raise InputError("bench --suite gemm needs a CUDA device")
    from .peers import torch_or_reason

    torch, why = torch_or_reason()
    roof = roofline.measure()
    ballast = make_ballast()
    rows = []
    for label, k, n in LAYERS:
        for batch in batches:
            if not fits(k, n, batch):
                rows.append({"layer": label, "k": k, "n": n, "batch": batch, "name": "-", "ms": None, "reason": "does not fit"})
                continue
            if progress:
                progress(f"bench gemm: {label} ({k} -> {n}) at batch {batch}")
            rows += bench_layer(label, k, n, batch, roof.bytes_per_s, torch, warmup, repeat, ballast, all_configs)
    device = current_cuda_device()
    return header(SCHEMA, device, [label for label, _, _ in LAYERS], list(batches)) | {"roofline": roof.record(),
            "cublas": "torch.nn.functional.linear, FP32, TF32 off" if torch is not None else f"unavailable: {why}", "rows": rows}


TABLE_HEADER = ["layer", "shape", "batch", "implementation", "device ms", "one call ms", "GB/s", "floor ms", "x floor", "vs cuBLAS"]
TABLE_NUMBERS = (2, 4, 5, 6, 7, 8, 9)


def table_cells(payload: dict[str, Any]) -> list[list[str]]:
    """A line of TABLE_HEADER per row, for the text table and the HTML page (lab/bench_page.py)."""
    def figure(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return [[r["layer"], f"{r['k']}->{r['n']}", str(r["batch"]), r["name"], figure(r["ms"], 4), figure(r.get("call_ms"), 4),
             figure(r.get("gb_per_s"), 0),
             figure(r.get("weight_floor_ms"), 4), figure(r.get("x_floor"), 2), figure(r.get("vs_cublas"), 2)]
            for r in payload["rows"]]


def format_text(payload: dict[str, Any]) -> str:
    roof = payload["roofline"]
    head = (f"Gemm layers on {payload['device']['name']}; copy bandwidth {roof['copy_gb_per_s']:.0f} GB/s, FP32 {roof['fp32_tflop_per_s']:.1f} "
            f"TFLOP/s; cuBLAS: {payload['cublas']}\n"
            "device ms: median per call, launch overhead hidden; one call ms: a call alone, host overhead included;\n"
            "floor: weight bytes / copy bandwidth; x floor: device ms / floor; vs cuBLAS: cuBLAS device ms / device ms (above 1: faster)\n\n")
    return head + "\n".join(text_table(TABLE_HEADER, table_cells(payload), right=TABLE_NUMBERS)) + "\n"
