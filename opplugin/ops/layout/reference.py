"""The layout ops in numpy, as the ONNX operators define them: the kernels of the CPU
device and what the CUDA kernels are checked against. Copies are exact; a linear
resize interpolates in float64 and rounds once."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .spec import ConcatSpec, GatherSpec, PadSpec, ResizeSpec, SliceSpec, SplitSpec, TransposeSpec


def concat(spec: ConcatSpec, inputs: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(x) for x in inputs], axis=spec.axis)


def transpose(spec: TransposeSpec, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(x, spec.perm))


def slice_(spec: SliceSpec, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x[spec.slices(x.shape)])


def gather(spec: GatherSpec, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.take(x, spec.indices(), axis=spec.axis))


def split(spec: SplitSpec, x: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(x[index]) for index in spec.slices(x.shape)]


def pad(spec: PadSpec, x: np.ndarray) -> np.ndarray:
    """np.pad after cropping the negative pads (a constant pad may crop)."""
    crop = tuple(slice(max(0, -b), d - max(0, -e)) for b, e, d in zip(spec.begins, spec.ends, x.shape))
    widths = [(max(0, b), max(0, e)) for b, e in zip(spec.begins, spec.ends)]
    x = x[crop]
    if spec.mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.float32(spec.value))
    return np.pad(x, widths, mode=spec.mode)


def source_coordinates(spec: ResizeSpec, axis: int, extent: int, size: int) -> np.ndarray:
    """Where each output position along `axis` falls in the input, in input coordinates (float32,
    as onnxruntime computes them)."""
    x = np.arange(size, dtype=np.float32)
    scale = np.float32(spec.scales[axis])
    if spec.coordinates == "asymmetric":
        return x / scale
    if spec.coordinates == "align_corners":
        return np.zeros(size, np.float32) if size == 1 else x * np.float32(extent - 1) / np.float32(size - 1)
    if spec.coordinates == "pytorch_half_pixel" and size == 1:
        return np.zeros(size, np.float32)
    return (x + np.float32(0.5)) / scale - np.float32(0.5)


def nearest_index(spec: ResizeSpec, coordinates: np.ndarray, extent: int) -> np.ndarray:
    x = coordinates.astype(np.float64)
    tie = x == np.floor(x) + 0.5
    rounded = {
        "round_prefer_floor": np.where(tie, np.floor(x), np.round(x)),
        "round_prefer_ceil": np.where(tie, np.ceil(x), np.round(x)),
        "floor": np.floor(x),
        "ceil": np.ceil(x),
    }[spec.nearest]
    return np.clip(rounded, 0, extent - 1).astype(np.int64)


def resize(spec: ResizeSpec, x: np.ndarray) -> np.ndarray:
    """Nearest or (multi)linear along each resized axis in turn (separable: the same as all at once)."""
    y = np.asarray(x, np.float64)
    for axis in spec.resized_axes:
        extent, size = x.shape[axis], spec.sizes[axis]
        where = source_coordinates(spec, axis, extent, size)
        if spec.mode == "nearest":
            y = np.take(y, nearest_index(spec, where, extent), axis=axis)
            continue
        where = np.clip(where.astype(np.float64), 0, extent - 1)
        low = np.floor(where).astype(np.int64)
        high = np.minimum(low + 1, extent - 1)
        weight = (where - low).reshape([-1 if a == axis else 1 for a in range(y.ndim)])
        y = np.take(y, low, axis=axis) * (1 - weight) + np.take(y, high, axis=axis) * weight
    return y.astype(np.float32)
