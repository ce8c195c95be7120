"""The numpy reference of the reductions and normalisations: the CPU backend and, in float64,
the oracle every kernel is checked against. Written from ONNX's definitions on the whole
tensor (numpy's own reductions over the node's axes), not from the kernels' stages and rows."""
from __future__ import annotations

from typing import Any

import numpy as np

from .spec import MAX, MEAN, SUM, NormSpec, ReduceSpec, SoftmaxSpec


def reduce(spec: ReduceSpec, x: Any) -> np.ndarray:
    batch = x.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        if spec.op == MAX:
            y = np.max(x, axis=spec.axes, keepdims=True)
        elif spec.op == MEAN:
            y = np.mean(x, axis=spec.axes, keepdims=True)
        else:
            y = np.sum(x, axis=spec.axes, keepdims=True)
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

