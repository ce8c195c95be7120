"""What may follow a Gemm inside its kernel: an activation (ops/activation.py's
table), then a Softmax over each row of Y; or, after the activation, the Add of a
residual tensor of Y's shape (wg_3xtf32 alone).

The bias (Gemm's C) and alpha, beta belong to the Gemm itself. A kernel applies
all of it in ONNX's order: alpha * acc + beta * C, the activation, then the row
Softmax (max, exp of the difference, sum, divide: onnxruntime's order, so NaN and
+inf spread over a row as they do there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..activation import Activation


@dataclass(frozen=True)
class GemmEpilogue:
    activation: Activation | None = None
    softmax: bool = False
    # a tensor of Y's shape added last (a transformer's residual: x + Linear(...)), read as the outputs are
    # stored; the caller hands it to the kernel (GemmKernel's `residual`)
    residual: bool = False

    @property
    def suffix(self) -> str:
        """For kernel names: "+sigmoid+softmax", "+residual"."""
        return ((self.activation.suffix if self.activation else "") + ("+softmax" if self.softmax else "")
                + ("+residual" if self.residual else ""))

    def apply(self, y: Any, xp: Any = np) -> Any:
        """The meaning on Y (M, N), in Y's dtype."""
        if self.activation:
            y = self.activation.apply(y, xp)
        if self.softmax:
            e = xp.exp(y - y.max(axis=1, keepdims=True))
            y = e / e.sum(axis=1, keepdims=True)
        return y

    def defines(self) -> dict[str, int | str]:
        return (self.activation.define() if self.activation else {}) | {"SOFTMAX": int(self.softmax), "RESIDUAL": int(self.residual)}


NONE = GemmEpilogue()
