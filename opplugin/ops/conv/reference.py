"""The numpy reference of Conv: the CPU backend and, in float64, the oracle every
kernel is checked against.

`conv` follows ONNX Conv exactly (N-D, pads begin+end, strides, dilations,
group, optional bias). It lowers each chunk of images to a matrix of input
patches (im2col) and multiplies the filters by it, so the work runs in BLAS
while memory stays bounded by `chunk_bytes`. The patch matrix is tap-major,
(channels x taps, pixels) per image: each tap's rows are contiguous slices of
the padded input, so building it is a few large copies rather than a gather,
and the product lands in NCHW order with no transpose after it. Each image gets
its own matrix product of a fixed shape: BLAS picks its blocking, and so its
rounding, by the matrix size, and an image's result must not depend on how
many others share its call. The arithmetic runs in the dtype of the inputs:
pass float64 arrays for an oracle.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

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
    chunk_bytes: int = 8 << 20,
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
    out_size = tuple((padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(rank))
    pixels, taps = int(np.prod(out_size)), int(np.prod(kernel))
    # the input each tap reads: a strided window of the padded image, one slice per axis
    tap_windows = [
        tuple(slice(k[i] * dilations[i], k[i] * dilations[i] + (out_size[i] - 1) * strides[i] + 1, strides[i]) for i in range(rank))
        for k in np.ndindex(*kernel)
    ]

    dtype = np.result_type(x.dtype, w.dtype)
    y = np.empty((n, m, *out_size), dtype)
    images_per_chunk = max(1, chunk_bytes // max(1, c_per_group * taps * pixels * dtype.itemsize))
    for g in range(group):
        channels, maps = slice(g * c_per_group, (g + 1) * c_per_group), slice(g * m_per_group, (g + 1) * m_per_group)
        filters = w[maps].reshape(m_per_group, c_per_group * taps).astype(dtype, copy=False)
        for start in range(0, n, images_per_chunk):
            source = padded[start : start + images_per_chunk, channels]
            count = source.shape[0]
            patches = np.empty((count, c_per_group, taps, *out_size), dtype)
            for tap, window in enumerate(tap_windows):
                patches[:, :, tap] = source[(slice(None), slice(None), *window)]
            # a stack of per-image products: (maps, C*K) @ (C*K, pixels)
            product = np.matmul(filters, patches.reshape(count, c_per_group * taps, pixels))
            y[start : start + count, maps] = product.reshape(count, m_per_group, *out_size)
    if b is not None:
        y += b.reshape((1, m) + (1,) * rank).astype(dtype, copy=False)
    return y


def expected(spec: "ConvSpec", epilogue: "Epilogue", x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
             residual: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """The oracle: the step's output (the epilogue's prologue on x, with its scale operand; conv;
    then the epilogue with its residual operand) computed in float64 from float32 inputs, for
    checking a kernel that runs `spec` with `epilogue`."""
    as64 = None if b is None else np.asarray(b, np.float64)
    x = np.asarray(x, np.float64)
    if epilogue.prologue:
        x = epilogue.prologue.apply(x, None if scale is None else np.asarray(scale, np.float64))
    y = conv(x, np.asarray(w, np.float64), as64, spec.strides, spec.pads, spec.dilations, spec.group)
    return epilogue.apply(y, None if residual is None else np.asarray(residual, np.float64))
