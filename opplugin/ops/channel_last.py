"""A tensor kept channel-last in a 16-bit format between two steps (plan/channel_last.py), as every op's kernels
see it: uint16 [N][H][W][C] holding the format's bits, where the model has FP32 [N][C][H][W]. What a kernel of
any op needs of it: the shape, the check of what it is handed, the numbering of the formats in the CUDA sources
(half_bits.cuh's FORMAT), and the bits of a configuration's links (its name's `_h` field) that every op shares.
"""
from __future__ import annotations

from typing import Any

INPUT, OUTPUT = 1, 2  # a configuration's links: X comes, Y goes channel-last in the format (a Conv adds its residual, 4)
FORMAT_CODES = {"fp16": 1, "bf16": 2}  # half_bits.cuh's FORMAT, gemm_wgmma's HALF_OPERANDS


def channel_last_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """(N, H, W, C) of an NCHW shape."""
    n, c, *spatial = shape
    return (n, *spatial, c)


def checked_linked(cupy: Any, array: Any, nchw: tuple[int, ...], what: str, kernel: str) -> Any:
    """`array` as a contiguous channel-last tensor of the format's bits (uint16) whose NCHW shape is `nchw`;
    a PluginError naming what came instead (an FP32 tensor where the plan linked this one: a plan out of step)."""
    from ..errors import PluginError

    expected = channel_last_shape(nchw)
    if not isinstance(array, cupy.ndarray) or array.dtype != cupy.uint16 or tuple(array.shape) != expected:
        got = f"{type(array).__name__} {getattr(array, 'dtype', '')} {tuple(getattr(array, 'shape', ()))}"
        raise PluginError(f"{kernel}: {what} is linked channel-last in 16 bits: expected a uint16 array of shape {expected}, got {got}")
    return cupy.ascontiguousarray(array)
