"""Custom operators: an op onnx does not know (or one it does), declared in Python with its
shapes, a float64 reference and kernels in CUDA C, CuPy or Triton (declaration.py).

    from opplugin.custom import CustomOp, CuPy
    swish = CustomOp("example.ops", "Swish", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0},
                     reference=lambda x, beta: x / (1 + np.exp(-beta * x)))

`--ops FILE.py` on every command (loading.py), `Runner(ops=[swish])`, `registry.register(swish)`
and the ``opplugin.plugins`` entry points take declarations.
"""
from __future__ import annotations

from .cuda_source import CudaSource
from .cupy_impl import CuPy
from .declaration import REQUIRED, CustomOp, DeclarationError, Implementation
from .loading import load_ops
from .triton_impl import Triton

__all__ = ["REQUIRED", "CudaSource", "CuPy", "CustomOp", "DeclarationError", "Implementation", "Triton", "load_ops"]
