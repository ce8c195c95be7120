"""The numpy reference of the reductions and normalisations: the CPU backend and, in float64,
the oracle every kernel is checked against. Written from ONNX's definitions on the whole
tensor (numpy's own reductions over the node's axes), not from the kernels' stages and rows."""
from __future__ import annotations

from typing import Any

import numpy as np

from .spec import L1, L2, LOG_SUM, MAX, MEAN, MIN, PROD, SUM, SUM_SQUARE, NormSpec, ReduceSpec, SoftmaxSpec


# ONNX's definition of each Reduce op on the whole tensor
REDUCTIONS = {
    SUM: lambda x, axes: np.sum(x, axis=axes, keepdims=True),
    MEAN: lambda x, axes: np.mean(x, axis=axes, keepdims=True),
    MAX: lambda x, axes: np.max(x, axis=axes, keepdims=True),
    MIN: lambda x, axes: np.min(x, axis=axes, keepdims=True),
    PROD: lambda x, axes: np.prod(x, axis=axes, keepdims=True),
    L1: lambda x, axes: np.sum(np.abs(x), axis=axes, keepdims=True),
    L2: lambda x, axes: np.sqrt(np.sum(x * x, axis=axes, keepdims=True)),
    SUM_SQUARE: lambda x, axes: np.sum(x * x, axis=axes, keepdims=True),
    LOG_SUM: lambda x, axes: np.log(np.sum(x, axis=axes, keepdims=True)),
}


def reduce(spec: ReduceSpec, x: Any) -> np.ndarray:
    batch = x.shape[0]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        y = REDUCTIONS[spec.op](x, spec.axes)
    return y.reshape(spec.output_shape(batch))


def softmax(spec: SoftmaxSpec, x: Any) -> np.ndarray:
    axes = tuple(range(spec.first, spec.end))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shifted = x - np.max(x, axis=axes, keepdims=True)
        total = np.sum(np.exp(shifted), axis=axes, keepdims=True)
        return shifted - np.log(total) if spec.log else np.exp(shifted) / total


def normalize(spec: NormSpec, x: Any, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    batch = x.shape[0]
    rows = spec.rows.view(x, batch)  # (outer, extent, inner)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        mean = rows.mean(axis=1, keepdims=True)
        centred = rows - mean
        variance = (centred * centred).mean(axis=1, keepdims=True)
        normalised = centred / np.sqrt(variance + x.dtype.type(spec.epsilon))
        channel = spec.channel_of(np.arange(rows.shape[0])[:, None], np.arange(spec.rows.extent)[None, :])[:, :, None]
        y = normalised * scale.astype(x.dtype)[channel] + bias.astype(x.dtype)[channel]
    return y.reshape(x.shape)

