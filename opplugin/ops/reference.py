"""numpy reference implementations: the CPU backend and the test oracle.

`conv` follows ONNX Conv exactly (N-D, pads begin+end, strides, dilations,
group, optional bias). It gathers one strided view per kernel tap and
accumulates with tensordot, so memory stays at one output-sized buffer and the
arithmetic runs in the dtype of the inputs (pass float64 for an oracle).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np


def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    strides: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    group: int = 1,
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
    out_size = tuple(
        (padded.shape[2 + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(rank)
    )
    dtype = np.result_type(x.dtype, w.dtype)
    y = np.zeros((n, m, *out_size), dtype=dtype)

    for tap in itertools.product(*(range(k) for k in kernel)):
        window = tuple(
            slice(tap[i] * dilations[i], tap[i] * dilations[i] + (out_size[i] - 1) * strides[i] + 1, strides[i])
            for i in range(rank)
        )
        patch = padded[(slice(None), slice(None), *window)]  # N, C, *out
        for g in range(group):
            xs = patch[:, g * c_per_group : (g + 1) * c_per_group]
            ws = w[(slice(g * m_per_group, (g + 1) * m_per_group), slice(None), *tap)]  # Mg, Cg
            # (Mg, Cg) x (N, Cg, *out) over Cg -> (Mg, N, *out)
            contribution = np.tensordot(ws, xs, axes=([1], [1]))
            y[:, g * m_per_group : (g + 1) * m_per_group] += np.moveaxis(contribution, 0, 1)
    if b is not None:
        y += b.reshape((1, m) + (1,) * rank)
    return y
