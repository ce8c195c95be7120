"""example.ops::Swish, the custom op of the shipped lenet86_swish model: y = x * sigmoid(beta * x).

    opplugin check lenet86_swish --ops models/lenet86_swish_ops.py

One declaration: its inputs, outputs and attribute, a float64 numpy reference (all the CPU
needs), and three kernels for the GPU, each a variant (`--variant example.ops::Swish=cupy`),
the first the default: a CUDA C file, a CuPy ElementwiseKernel, and an autotuned Triton
kernel (where Triton and torch are installed) whose every configuration `tune` checks
against the reference before it times it.
"""
from pathlib import Path

import numpy as np

from opplugin.custom import CudaSource, CuPy, CustomOp, Triton

swish = CustomOp("example.ops", "Swish", inputs=["X"], outputs=["Y"], attributes={"beta": 1.0})


@swish.reference
def swish_reference(x, beta):
    return x / (1.0 + np.exp(-beta * x))


# CUDA C: compiled by NVRTC for each node, its shapes and attributes as macros (X_SIZE, ATTR_BETA)
swish.implement(CudaSource(Path(__file__).with_name("swish.cu")))

_elementwise = None


def swish_cupy(x, beta):
    """A CuPy ElementwiseKernel, made on first use (CuPy is imported only on a GPU machine)."""
    global _elementwise
    import cupy

    if _elementwise is None:
        _elementwise = cupy.ElementwiseKernel("float32 x, float32 beta", "float32 y",
                                              "y = x / (1.0f + expf(-beta * x))", "example_swish")
    return _elementwise(x, np.float32(beta))


swish.implement(CuPy(swish_cupy, name="cupy"))

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton here: the other kernels serve
    triton = None

if triton is not None:
    @triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=4)],
                     key=["n_elements"])
    @triton.jit
    def swish_triton(x_ptr, y_ptr, n_elements, beta, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=inside)
        tl.store(y_ptr + offsets, x / (1.0 + tl.exp(-beta * x)), mask=inside)

    swish.implement(Triton(swish_triton, grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),)))
