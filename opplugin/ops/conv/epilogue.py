"""What may follow a Conv inside its kernel: an activation, then a max pool.

A plan fuses Conv -> Relu|Tanh -> MaxPool when the intermediate tensors have no
other reader; the kernel then writes only the pooled map. Both ops commute with
the bias add and with each other (max of a monotone function is the function of
the max), so a kernel may pool first and apply the activation once per pooled
value, which is the point: a quarter of the activations and of the stores.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..activation import Activation

# the activations the Conv kernels compile in (kernels/conv_epilogue.cuh); their meaning is ops/activation.py's
ACTIVATIONS = ("Relu", "Tanh")


@dataclass(frozen=True)
class Epilogue:
    """What a Conv kernel applies to its output before storing it: an activation, then a
    non-overlapping max pool (window = stride); the empty one (NONE) does nothing."""

    activation: str | None = None  # "Relu" or "Tanh"
    pool: tuple[int, int] | None = None  # max pool window = stride (kh, kw), no pads

    def __post_init__(self):
        if self.activation not in (None, *ACTIVATIONS):
            raise ValueError(f"unsupported activation {self.activation!r}")

    @property
    def suffix(self) -> str:
        """For kernel names: "+relu+maxpool2"."""
        parts = [f"+{self.activation.lower()}"] if self.activation else []
        if self.pool:
            kh, kw = self.pool
            parts.append(f"+maxpool{kh}" if kh == kw else f"+maxpool{kh}x{kw}")
        return "".join(parts)

    def output_size(self, conv_size: tuple[int, ...]) -> tuple[int, ...]:
        """Spatial size after the pool (floor mode drops a partial last window)."""
        if not self.pool:
            return tuple(conv_size)
        return tuple(s // k for s, k in zip(conv_size, self.pool))

    def conv_size_read(self, conv_size: tuple[int, ...]) -> tuple[int, ...]:
        """The part of the conv output the pool reads: a floor-mode pool leaves out
        the last rows and columns when its window does not divide the size, and a
        fused kernel need not compute them (lenet86 conv2: 32x32 of 34x34)."""
        if not self.pool:
            return tuple(conv_size)
        return tuple(s // k * k for s, k in zip(conv_size, self.pool))

    def apply(self, y: np.ndarray, xp=np) -> np.ndarray:
        """The meaning, on an (N, M, H, W) conv output, in ONNX's order; `xp` is
        the array module (numpy, or cupy for device arrays).

        NaN propagates: Relu keeps it (`v < 0 ? 0 : v`), and a window holding a
        NaN pools to NaN (+inf wins over everything else). onnxruntime's own
        MaxPool treats a NaN differently by its place in the window, so no fixed
        rule matches it; instead every NaN or +inf that reaches a window shows in
        this output, and the runner reruns such chunks on onnxruntime's nodes."""
        if self.activation:
            y = Activation.plain(self.activation).apply(y, xp)
        if self.pool:
            kh, kw = self.pool
            oh, ow = y.shape[2] // kh, y.shape[3] // kw
            pooled = y[:, :, 0 : oh * kh : kh, 0 : ow * kw : kw]
            for i in range(kh):
                for j in range(kw):
                    pooled = xp.maximum(pooled, y[:, :, i : oh * kh : kh, j : ow * kw : kw])
            y = pooled
        return y

    def apply_cupy(self, y):
        import cupy

        return cupy.ascontiguousarray(self.apply(y, cupy))


NONE = Epilogue()
