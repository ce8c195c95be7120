"""Gemm problems shared by the CPU and GPU tests: a spec with its operands in ONNX's layout."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opplugin.ops.gemm.spec import BIAS_NONE, GemmSpec, bias_kind

# C shapes ONNX's unidirectional broadcast allows, as functions of (M, N)
C_SHAPES = {
    "none": None,
    "scalar": lambda m, n: (),
    "one": lambda m, n: (1,),
    "row": lambda m, n: (n,),
    "row2d": lambda m, n: (1, n),
    "column": lambda m, n: (m, 1),
    "full": lambda m, n: (m, n),
}


@dataclass
class GemmProblem:
    spec: GemmSpec
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray | None


def make_problem(m: int, n: int, k: int, trans_a=False, trans_b=False, alpha=1.0, beta=1.0, c="row", seed=0) -> GemmProblem:
    """Random operands (never zeros: normal values) for Y = alpha A' B' + beta C."""
    rng = np.random.default_rng(seed)
    shape = C_SHAPES[c](m, n) if C_SHAPES[c] else None
    bias = BIAS_NONE if shape is None else bias_kind(shape, m, n, "test")
    spec = GemmSpec(m, n, k, trans_a, trans_b, alpha, beta, bias, shape or ())
    a = rng.standard_normal(spec.a_shape()).astype(np.float32)
    b = (rng.standard_normal(spec.b_shape) / np.sqrt(k)).astype(np.float32)
    cv = None if shape is None else rng.standard_normal(shape).astype(np.float32)
    return GemmProblem(spec, a, b, cv)


def error_scale(p: GemmProblem) -> np.ndarray:
    """|alpha| |A'| |B'| + |beta C|: what float32 rounding errors of Y scale with."""
    a = np.abs(p.a.T if p.spec.trans_a else p.a).astype(np.float64)
    b = np.abs(p.b.T if p.spec.trans_b else p.b).astype(np.float64)
    scale = abs(p.spec.alpha) * (a @ b)
    if p.c is not None:
        scale = scale + abs(p.spec.beta) * np.abs(p.c.astype(np.float64))
    return scale
