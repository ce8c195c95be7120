"""The reduced-precision number formats opplugin knows (TF32, FP16, BF16): their names, how far rounding
to one moves a value, and the rounding itself on float32 arrays. One place for them, below every layer:
check --precision emulates a precision with it (verify/precision_cost.py), and the CPU reference of a
step that runs in a precision rounds its operands with it (ops/gemm/kernel.py), and the half-precision
kernels take their weights in the format's bits from it (ops/conv/families/wgmma.py)."""
from __future__ import annotations

import numpy as np

FP32 = "fp32"
REDUCED = ("tf32", "fp16", "bf16")  # the formats a product's operands may be rounded to
UNIT_ROUNDOFF = {"tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}  # a value rounded to it moves by this much at most, relatively
DROPPED_BITS = {"bf16": 16, "tf32": 13}  # the low mantissa bits of FP32 that BF16 and TF32 lack (FP16 also narrows the exponent)


def round_to(values: np.ndarray, precision: str) -> np.ndarray:
    """float32 `values` rounded to the nearest FP16, BF16 or TF32 value (ties to even), back as float32."""
    x = np.asarray(values, np.float32)
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    dropped = DROPPED_BITS.get(precision)
    if dropped is None:
        raise ValueError(f"unknown precision {precision!r}")
    bits = x.view(np.uint32).astype(np.uint64)
    half = (1 << (dropped - 1)) - 1
    kept = (bits + half + ((bits >> dropped) & 1)) & (0xFFFFFFFF ^ ((1 << dropped) - 1))
    return np.where(np.isnan(x), x, kept.astype(np.uint32).view(np.float32))  # a NaN's payload could round into an infinity


def half_bits(values: np.ndarray, precision: str) -> np.ndarray:
    """float32 `values` rounded to FP16 or BF16 as `round_to` rounds them, as the format's 16-bit patterns
    (uint16): what a kernel that reads its operands in that format is given."""
    rounded = round_to(values, precision)
    if precision == "fp16":
        return rounded.astype(np.float16).view(np.uint16)
    if precision != "bf16":
        raise ValueError(f"{precision!r} is not a 16-bit format")
    return (rounded.view(np.uint32) >> 16).astype(np.uint16)  # BF16 is FP32's upper half; round_to cleared the rest
