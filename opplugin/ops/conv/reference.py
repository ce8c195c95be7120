"""The numpy reference of Conv: the CPU backend and, in float64, the oracle every
kernel is checked against.

`conv` follows ONNX Conv exactly (N-D, pads begin+end, strides, dilations,
group, optional bias). It lowers each batch chunk to a matrix of input patches
(im2col) and multiplies by the filters, so the work runs in BLAS while memory
stays bounded by `chunk_bytes`. Each image gets its own matrix product of a
fixed shape: BLAS picks its blocking, and so its rounding, by the matrix size,
and an image's result must not depend on how many others share its call. The
arithmetic runs in the dtype of the inputs: pass float64 arrays for an oracle.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if TYPE_CHECKING:
    from .epilogue import Epilogue
    from .spec import ConvSpec


def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    strides: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    group: int = 1,
    chunk_bytes: int = 32 << 20,
) -> np.ndarray:
    rank = x.ndim - 2
    strides = tuple(strides or (1,) * rank)
    dilations = tuple(dilations or (1,) * rank)
    pads = tuple(pads or (0,) * (2 * rank))
    kernel = w.shape[2:]
    n, c = x.shape[:2]
    m = w.shape[0]
    c_per_group, m_per_group = c // group, m // group

    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)])
    span = tuple(dilations[i] * (kernel[i] - 1) + 1 for i in range(rank))
    spatial = tuple(range(2, 2 + rank))
    # windows[n, c, *out, *k]: a view, nothing copied yet
    windows = sliding_window_view(padded, span, axis=spatial)
    windows = windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilations))]
    out_size = windows.shape[2 : 2 + rank]
    pixels, taps = int(np.prod(out_size)), int(np.prod(kernel))

    dtype = np.result_type(x.dtype, w.dtype)
    y = np.empty((n, m, *out_size), dtype)
    patch_order = (0, *range(2, 2 + rank), 1, *range(2 + rank, 2 + 2 * rank))  # n, *out, c, *k
    images_per_chunk = max(1, chunk_bytes // max(1, c_per_group * taps * pixels * dtype.itemsize))
    for g in range(group):
        channels, maps = slice(g * c_per_group, (g + 1) * c_per_group), slice(g * m_per_group, (g + 1) * m_per_group)
        filters = w[maps].reshape(m_per_group, c_per_group * taps).astype(dtype, copy=False)
        for start in range(0, n, images_per_chunk):
            chunk = windows[start : start + images_per_chunk, channels]
            count = chunk.shape[0]
            patches = np.ascontiguousarray(chunk.transpose(patch_order)).reshape(count, pixels, c_per_group * taps)
            product = patches @ filters.T  # a stack of per-image products: (count, pixels, maps)
            y[start : start + count, maps] = product.transpose(0, 2, 1).reshape(count, m_per_group, *out_size)
    if b is not None:
        y += b.reshape((1, m) + (1,) * rank).astype(dtype, copy=False)
    return y


def expected(spec: "ConvSpec", epilogue: "Epilogue", x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The oracle: the step's output (conv, then the epilogue) computed in float64
    from float32 inputs, for checking a kernel that runs `spec` with `epilogue`."""
    as64 = None if b is None else np.asarray(b, np.float64)
    y = conv(np.asarray(x, np.float64), np.asarray(w, np.float64), as64, spec.strides, spec.pads, spec.dilations, spec.group)
    return epilogue.apply(y)
