"""Flagging NaN and Inf in a device array: one byte per watched output, set on the device
with no host wait, so that it also works inside a captured CUDA graph (see exact.py)."""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from ..gpu import cuda, kernel_cache

FLAG_SOURCE = "nonfinite.cu"
FLAG_BLOCK = 256
FLAG_MAX_BLOCKS = 1024


def slot_runs(slots: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """Consecutive slots merged: (first slot, its place in `slots`, how many), one copy each."""
    runs, start = [], 0
    for end in range(1, len(slots) + 1):
        if end == len(slots) or slots[end] != slots[end - 1] + 1:
            runs.append((slots[start], start, end - start))
            start = end
    return tuple(runs)


def flag_job(arch: str) -> kernel_cache.CompileJob:
    """The compile of kernels/nonfinite.cu for `arch`: what _flag_float32_kernel loads."""
    return cuda.module_job(FLAG_SOURCE, {}, arch)


@functools.cache
def _flag_float32_kernel():
    """kernels/nonfinite.cu: one launch per watched float32 output."""
    return cuda.load(flag_job(cuda.device_arch())).get_function("opplugin_flag_nonfinite")


@functools.cache
def _any_nonfinite_kernel():
    """A CuPy reduction for any dtype: true when any element is NaN or +-inf (slower to launch)."""
    import cupy

    return cupy.ReductionKernel(
        "T x", "bool flag", "!isfinite(x)", "a || b", "flag = a", "false", "opplugin_any_nonfinite", reduce_type="bool"
    )


def set_flag(address: int, value: Any) -> None:
    """Set the device byte at `address` (already 0) if the C-contiguous float32 device array
    `value` holds a NaN or an Inf; on the current stream, with no host wait."""
    if value.size:
        blocks = min(-(-value.size // FLAG_BLOCK), FLAG_MAX_BLOCKS)
        _flag_float32_kernel()((blocks,), (FLAG_BLOCK,), (value, np.int64(value.size), np.uint64(address)))


def raise_flag(target: Any, value: Any) -> None:
    """Set `target` (one device bool, already zeroed: flags are reset once a run, or once a graph
    replay) if the device array `value` holds a NaN or an Inf; on the current stream, with no host
    wait, so that it can also be captured into a CUDA graph, as one launch."""
    if value.dtype == np.float32 and value.flags.c_contiguous or value.size == 0:
        set_flag(target.data.ptr, value)
    else:
        _any_nonfinite_kernel()(value, out=target)


def clear_flags(flags: Any) -> None:
    """Zero a device bool array on the current stream (captured into a graph as one memset node)."""
    import cupy

    cupy.cuda.runtime.memsetAsync(flags.data.ptr, 0, flags.nbytes, cupy.cuda.get_current_stream().ptr)
