"""This device's roofline: its measured copy bandwidth and FP32 rate, and the
floor they put under a kernel that must move `bytes` and compute `flops`.

Both ceilings are measured, not taken from a data sheet, so the floor is one the
device demonstrably reaches: a device-to-device copy of at least 1 GiB (bytes read
plus bytes written, over the elapsed time) and a large float32 matrix product
with TF32 off (CuPy's cuBLAS call in plain FP32; CUPY_TF32 is cleared first).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from ..gpu import cuda

COPY_BYTES = 1 << 30  # one GiB copied: long enough that launch costs vanish
MATMUL_N = 8192  # n^3 multiply-adds: tens of ms in FP32 on a Hopper chip
TF32_SUSPECT_ERROR = 1e-4  # a plain FP32 product errs ~1e-6; TF32 rounds inputs to 10 bits (~1e-3)


@dataclass(frozen=True)
class Roofline:
    copy_bytes: int  # bytes read + written by the measured copy
    copy_ms: float
    matmul_n: int
    matmul_ms: float
    matmul_rel_error: float  # of a small product in the same mode, against float64: shows TF32 was off

    @property
    def bytes_per_s(self) -> float:
        return self.copy_bytes / (self.copy_ms * 1e-3)

    @property
    def flops_per_s(self) -> float:
        return 2 * self.matmul_n**3 / (self.matmul_ms * 1e-3)

    def floor_ms(self, flops: int, nbytes: int) -> float:
        return floor_ms(flops, nbytes, self.bytes_per_s, self.flops_per_s)

    def record(self) -> dict[str, Any]:
        return asdict(self) | {
            "copy_gb_per_s": self.bytes_per_s / 1e9,
            "fp32_tflop_per_s": self.flops_per_s / 1e12,
            "tf32_suspected": self.matmul_rel_error > TF32_SUSPECT_ERROR,
        }


def floor_ms(flops: int, nbytes: int, bytes_per_s: float, flops_per_s: float) -> float:
    """The least time a kernel can take: the larger of its memory and its arithmetic time."""
    return 1e3 * max(nbytes / bytes_per_s, flops / flops_per_s)


def bound_by(flops: int, nbytes: int, bytes_per_s: float, flops_per_s: float) -> str:
    """"memory" or "compute": which ceiling sets the floor."""
    return "memory" if nbytes / bytes_per_s >= flops / flops_per_s else "compute"


def _median_event_ms(fn, warmup: int, repeat: int) -> float:
    return statistics.median(cuda.time_ms(fn, warmup=warmup, repeat=repeat))


def fp32_matmul_mode() -> None:
    """Make CuPy's float32 products plain FP32: CUPY_TF32 is read at the first float32
    matmul, so clearing it here (and resetting the cached choice when CuPy exposes it)
    keeps cuBLAS off the tensor cores' TF32 path."""
    os.environ.pop("CUPY_TF32", None)
    try:
        import numpy as np
        from cupy._core import _routines_linalg as linalg

        linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_DEFAULT)
    except Exception:  # a CuPy without this private hook reads the cleared variable instead
        pass


def copy_ms(nbytes: int, warmup: int, repeat: int) -> float:
    """Median ms of a device-to-device copy of `nbytes` (CuPy's copy kernel: one read, one write)."""
    import cupy

    src = cupy.ones(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    return _median_event_ms(lambda: dst.__setitem__(Ellipsis, src), warmup, repeat)


def matmul_ms(n: int, warmup: int, repeat: int) -> float:
    """Median ms of an n x n x n float32 matrix product."""
    import cupy

    a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    b = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    return _median_event_ms(lambda: cupy.matmul(a, b), warmup, repeat)


def matmul_error() -> float:
    """Relative error of a small float32 product in the current mode against float64:
    ~1e-6 in FP32, ~1e-3 if TF32 rounded the inputs."""
    import cupy
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float32)
    got = cupy.asnumpy(cupy.matmul(cupy.asarray(a), cupy.asarray(b))).astype(np.float64)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def measure(warmup: int = 2, repeat: int = 10, copy_bytes: int = COPY_BYTES, matmul_n: int = MATMUL_N) -> Roofline:
    """Measure this device's copy bandwidth and FP32 rate (about a second on a Hopper chip)."""
    import cupy

    fp32_matmul_mode()
    words_bytes = copy_bytes // 4 * 4
    copy = copy_ms(words_bytes, warmup, repeat)
    error = matmul_error()
    product = matmul_ms(matmul_n, warmup, max(3, repeat // 2))
    cupy.get_default_memory_pool().free_all_blocks()
    return Roofline(2 * words_bytes, copy, matmul_n, product, error)
