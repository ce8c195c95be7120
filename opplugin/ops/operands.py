"""What a CUDA op kernel checks of the arrays it is handed, with one wording for every op: a
float32 CuPy array on the GPU, of the batch's shape, and an `out` it may write into."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PluginError

FLOAT32 = np.dtype(np.float32)  # CuPy arrays' dtypes are NumPy's: `is` tells float32 from the rest


def checked_array(cupy: Any, array: Any, what: str, kernel: str) -> Any:
    """`array` when it is a float32 CuPy array; else a PluginError naming `what` and the kernel."""
    if not isinstance(array, cupy.ndarray):
        raise PluginError(f"{kernel}: {what} must be a CuPy array on the GPU, got {type(array).__name__}")
    if array.dtype is not FLOAT32 and array.dtype != cupy.float32:
        raise PluginError(f"{kernel}: {what} must be float32, got {array.dtype}")
    return array


def batched_input(cupy: Any, x: Any, sample: tuple[int, ...], what: str, kernel: str) -> Any:
    """`x` when it is a float32 CuPy array of shape (batch, *sample); else a PluginError saying what came."""
    if not isinstance(x, cupy.ndarray) or x.dtype != np.float32 or tuple(x.shape[1:]) != tuple(sample):
        got = f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}"
        raise PluginError(f"{kernel}: {what} must be a float32 CuPy array of shape (batch, {', '.join(map(str, sample))}), not {got}")
    return x


def contiguous_out(cupy: Any, out: Any, shape: tuple[int, ...], kernel: str) -> Any:
    """`out` (None, or a C-contiguous float32 CuPy array of `shape`, to be written in full); else a PluginError."""
    if out is not None and (not isinstance(out, cupy.ndarray) or out.dtype != np.float32 or tuple(out.shape) != tuple(shape)
                            or not out.flags.c_contiguous):
        raise PluginError(f"{kernel}: out must be a C-contiguous float32 CuPy array of shape {shape}")
    return out
