"""What may follow a Conv inside its kernel, in ONNX's order: a residual Add (or a
two-input Sum) of a same-shape tensor, an activation of ops/activation.py's table
(SiLU included, written as x * Sigmoid(x)), then a non-overlapping max pool.

A plan fuses such a chain when the intermediate tensors have no other reader; the
kernel then writes only the last node's output. This description drives both the
numpy reference (`apply`) and the CUDA code (`defines`, read by
kernels/conv_epilogue.cuh), so every family applies it the same way.

Without a residual, a nondecreasing activation commutes with the bias add and the
max (max of f is f of the max), so a kernel may pool first and activate once per
pooled value: a quarter of the activations and of the stores. A residual belongs to
each conv output, and HardSwish or SiLU do not commute with max: then every conv
output is finished before the pool (`pool_first` False).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..activation import Activation
from .prologue import Prologue

# where a fused step's kernel finds the residual operand: after the Conv's X, W and B (B may be empty)
RESIDUAL_INPUT = 3


@dataclass(frozen=True)
class Epilogue:
    """What a Conv kernel applies to its output before storing it; the empty one (NONE) does nothing.

    `activation` may be given as an op name ("Relu") for the op with ONNX's default parameters."""

    activation: Activation | None = None
    pool: tuple[int, int] | None = None  # max pool window = stride (kh, kw), no pads
    residual: bool = False  # an Add of a tensor shaped like the conv output, before the activation
    # what the kernel applies to each input value it loads (prologue.py): fused work before the Conv,
    # held here so that every family's choice, limits and macros see it with the rest
    prologue: Prologue | None = None

    def __post_init__(self):
        if isinstance(self.activation, str):
            object.__setattr__(self, "activation", Activation.plain(self.activation))

    @property
    def suffix(self) -> str:
        """For kernel names: "+add+relu+maxpool2"."""
        parts = ["+add"] if self.residual else []
        if self.activation:
            parts.append(self.activation.suffix)
        if self.pool:
            kh, kw = self.pool
            parts.append(f"+maxpool{kh}" if kh == kw else f"+maxpool{kh}x{kw}")
        return "".join(parts)

    @property
    def signature(self) -> str:
        """The prologue's prefix and the suffix: what the tuning cache keys a fused step by."""
        return (self.prologue.prefix if self.prologue else "") + self.suffix

    def without_prologue(self) -> "Epilogue":
        return replace(self, prologue=None)

    def prologue_only(self) -> "Epilogue":
        return Epilogue(prologue=self.prologue)

    @property
    def pool_first(self) -> bool:
        """Whether a kernel may pool the raw sums and add the bias and activate once per pooled value."""
        return bool(self.pool) and not self.residual and (self.activation is None or self.activation.nondecreasing)

    def defines(self) -> dict[str, int | str]:
        """The -D macros kernels/conv_epilogue.cuh reads (the pool's size is a shape macro)."""
        activation = self.activation.define() if self.activation else {}
        prologue = self.prologue.defines() if self.prologue else {}
        return activation | prologue | {"RESIDUAL": int(self.residual), "POOL_FIRST": int(self.pool_first)}

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

    def apply(self, y: Any, residual: Any = None, xp: Any = np) -> Any:
        """The meaning, on an (N, M, H, W) conv output (bias included) and the residual
        operand (same shape; needed when `residual`), in ONNX's order; `xp` is the
        array module (numpy, or cupy for device arrays).

        NaN propagates: the add and every activation keep it, and a window holding a
        NaN pools to NaN (+inf wins over everything else). onnxruntime's own
        MaxPool treats a NaN differently by its place in the window, so no fixed
        rule matches it; instead every NaN or +inf that reaches a window shows in
        this output, and the runner reruns such chunks on onnxruntime's nodes."""
        if self.pool_first:  # the same values (a nondecreasing activation commutes with max), on a pooled array
            return self._activated(self._pooled(y, xp), xp)
        if self.residual:
            if residual is None:
                raise ValueError(f"the epilogue {self.suffix} needs its residual operand")
            y = y + xp.asarray(residual, dtype=y.dtype)
        return self._pooled(self._activated(y, xp), xp)

    def _activated(self, y: Any, xp: Any) -> Any:
        return self.activation.apply(y, xp) if self.activation else y

    def _pooled(self, y: Any, xp: Any) -> Any:
        if not self.pool:
            return y
        kh, kw = self.pool
        oh, ow = y.shape[2] // kh, y.shape[3] // kw
        pooled = y[:, :, 0 : oh * kh : kh, 0 : ow * kw : kw]
        for i in range(kh):
            for j in range(kw):
                pooled = xp.maximum(pooled, y[:, :, i : oh * kh : kh, j : ow * kw : kw])
        return pooled

    def apply_cupy(self, y: Any, residual: Any = None) -> Any:
        import cupy

        return cupy.ascontiguousarray(self.apply(y, residual, cupy))


NONE = Epilogue()


def kernel_name(variant: str, epilogue: Epilogue = NONE) -> str:
    """A Conv kernel's name in reports: "conv.<prologue><configured name><epilogue>", e.g. "conv.const_mo_m4+relu",
    "conv.bn_relu*tc_3xtf32_b64x128x32_w32x64_s3"."""
    return f"conv.{epilogue.prologue.prefix if epilogue.prologue else ''}{variant}{epilogue.suffix}"
