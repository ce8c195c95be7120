"""The CPU device's variants of an op that has reduced-precision kernels on a GPU: "reference", the numpy
reference in FP32, and "reference.<precision>" (reference.fp16, ...), the same with its product's operands
rounded to that format first, as the GPU's kernel reads them. A plan on the CPU device then says, and
computes, what the GPU would run (Gemm, MatMul, the fused attention and Conv take them)."""
from __future__ import annotations

from ..core.number_formats import FP32, REDUCED

REFERENCE = "reference"
REFERENCE_VARIANTS = {REFERENCE: None, **{f"{REFERENCE}.{precision}": precision for precision in REDUCED}}


def reference_variant(precision: str | None = None) -> str:
    """The CPU device's variant for a precision: the reference, its operands rounded to `precision` first (None, fp32: not)."""
    return REFERENCE if precision in (None, FP32) else f"{REFERENCE}.{precision}"


def is_reference(variant: str | None) -> bool:
    """Whether the CPU device runs `variant`: None (the plugin's choice), or a reference variant."""
    return variant is None or variant in REFERENCE_VARIANTS
