"""The numpy reference of Gemm: the CPU backend and, in float64, the oracle every kernel is checked against."""
from __future__ import annotations

import numpy as np

from .epilogue import NONE, GemmEpilogue
from .spec import GemmSpec


def gemm(spec: GemmSpec, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """ONNX Gemm in the dtype of the inputs (the arithmetic's too: float64 operands for an oracle):
    alpha * A' B' + beta * C, C broadcast to Y. Like onnxruntime, beta * C is formed first and
    the product added to it."""
    a = a.T if spec.trans_a else a
    b = b.T if spec.trans_b else b
    # one product of the same shape per row: BLAS picks its blocking, and so its rounding, by the
    # matrix size, and a row's result must not depend on how many rows share the call (chunked runs)
    product = np.matmul(a[:, None, :], b)[:, 0, :]
    if spec.alpha != 1.0:
        product = product * product.dtype.type(spec.alpha)
    if c is None or spec.beta == 0.0:
        return product
    scaled = np.asarray(c, product.dtype) * product.dtype.type(spec.beta) if spec.beta != 1.0 else np.asarray(c, product.dtype)
    return scaled + product


def run(spec: GemmSpec, epilogue: GemmEpilogue, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    return epilogue.apply(gemm(spec, a, b, c))


def expected(spec: GemmSpec, epilogue: GemmEpilogue, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    """The oracle: the step's output computed in float64 from float32 inputs."""
    as64 = None if c is None else np.asarray(c, np.float64)
    return run(spec, epilogue or NONE, np.asarray(a, np.float64), np.asarray(b, np.float64), as64)
