"""The numpy reference of the pools: the CPU backend and, in float64, the oracle every
pool kernel is checked against.

A window pool is written as a sum (or max) over the kernel's offsets of strided views of
the input, padded on every side as far as any window reaches: -inf for a max (a pad is
never the maximum), 0 for an average, whose divisor is the same sum over a mask of the
elements that count (the input's, or with count_include_pad the pads' too; never the
overhang that ceil_mode adds past the end pads).

NaN propagates: a window holding a NaN pools to NaN (np.maximum keeps it). onnxruntime's
MaxPool keeps or drops a NaN by its place in the window, so a max pool's output that holds
NaN or Inf makes the runner rerun its chunk on onnxruntime (runtime/exact.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .spec import MAX, PoolSpec


def pool(spec: PoolSpec, x: Any, xp: Any = np) -> Any:
    """The pool of an (N, C, H, W) array in its dtype (float64 in, float64 arithmetic out)."""
    if spec.is_global:
        pooled = x.max(axis=(2, 3), keepdims=True) if spec.mode == MAX else x.sum(axis=(2, 3), keepdims=True) / x.dtype.type(spec.window)
        return pooled if spec.keep_dims else pooled.reshape(pooled.shape[:2])
    (height, width), (out_h, out_w) = spec.size, spec.output_size
    top, left, bottom, right = spec.pads
    reach_h = max((out_h - 1) * spec.strides[0] + (spec.kernel[0] - 1) * spec.dilations[0] + 1, top + height)
    reach_w = max((out_w - 1) * spec.strides[1] + (spec.kernel[1] - 1) * spec.dilations[1] + 1, left + width)
    fill = -np.inf if spec.mode == MAX else 0.0
    padded = xp.full((x.shape[0], x.shape[1], reach_h, reach_w), fill, dtype=x.dtype)
    padded[:, :, top:top + height, left:left + width] = x
    if spec.mode == MAX:
        result = None
        for view in _windows(spec, padded):
            result = view if result is None else xp.maximum(result, view)
        return result
    with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf is NaN, as in onnxruntime: a result, not a warning
        total = sum(_windows(spec, padded))
    counted = xp.zeros((1, 1, reach_h, reach_w), dtype=x.dtype)
    if spec.count_include_pad:
        counted[:, :, :top + height + bottom, :left + width + right] = 1
    else:
        counted[:, :, top:top + height, left:left + width] = 1
    return total / sum(_windows(spec, counted))


def _windows(spec: PoolSpec, padded: Any) -> list[Any]:
    """One strided view per kernel offset (i, j): element [.., r, c] is the window of output (r, c) at that offset."""
    (out_h, out_w), (sh, sw), (dh, dw) = spec.output_size, spec.strides, spec.dilations
    return [padded[:, :, i * dh:i * dh + (out_h - 1) * sh + 1:sh, j * dw:j * dw + (out_w - 1) * sw + 1:sw]
            for i in range(spec.kernel[0]) for j in range(spec.kernel[1])]


def expected(spec: PoolSpec, x: Any) -> np.ndarray:
    """The oracle: the pool computed in float64 from float32 inputs."""
    return pool(spec, np.asarray(x, np.float64))
