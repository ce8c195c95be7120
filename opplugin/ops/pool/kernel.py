"""Built pool kernels: the numpy reference (CPU device) and the CUDA kernels of kernels/pool.cu."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import Kernel
from ..operands import batched_input, contiguous_out
from . import reference
from .spec import AVERAGE, MAX, PoolSpec

SOURCE = "pool.cu"
BLOCK = 256  # threads per block of pool_window; pool_global's BLOCK_THREADS in the source
# a global pool's plane gets a warp up to this many elements (a few loads per lane), a block above
WARP_PLANE_LIMIT = 1024


def kernel_name(spec: PoolSpec, on_device: bool, variant: str | None = None) -> str:
    """"maxpool.cuda.<suffix>" on a CUDA device, "...reference..." on the CPU's numpy reference, and the
    variant in the middle for a kernel on channel-last tensors ("maxpool.cuda_fp16_h3.3x3s2p1", channel_last.py)."""
    op = ("global" if spec.is_global else "") + ("maxpool" if spec.mode == MAX else "averagepool")
    return f"{op}.{variant or ('cuda' if on_device else 'reference')}.{spec.suffix}"


class ReferencePoolKernel(Kernel):
    """The numpy reference, run as the pool kernel of the CPU device: float64 arithmetic, float32 out."""

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.name = kernel_name(spec, on_device=False)
        # an average follows IEEE as onnxruntime does; a max keeps every NaN, which onnxruntime may drop
        self.nonfinite_exact = spec.mode == AVERAGE

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        return [reference.expected(self.spec, inputs[0]).astype(np.float32)]


def plane_threads(spec: PoolSpec) -> int:
    return 32 if spec.size[0] * spec.size[1] <= WARP_PLANE_LIMIT else 256


def defines(spec: PoolSpec) -> dict[str, int]:
    """The -D macros of kernels/pool.cu for this pool (all but the batch)."""
    return shape_defines(spec) | ({"PLANE_THREADS": plane_threads(spec)} if spec.is_global else {})


def shape_defines(spec: PoolSpec) -> dict[str, int]:
    """The macros of the pool's shape and window, which kernels/pool.cu and pool_channel_last.cu share."""
    (h, w), (oh, ow) = spec.size, spec.output_size
    shape = {"C": spec.channels, "H": h, "W": w, "IS_MAX": int(spec.mode == MAX)}
    if spec.is_global:
        return shape
    top, left, bottom, right = spec.pads
    return shape | {
        "OH": oh, "OW": ow, "KH": spec.kernel[0], "KW": spec.kernel[1], "SH": spec.strides[0], "SW": spec.strides[1],
        "DH": spec.dilations[0], "DW": spec.dilations[1], "PT": top, "PL": left,
        "COUNT_INCLUDE_PAD": int(spec.count_include_pad), "PH_END": h + bottom, "PW_END": w + right,
    }


def function_name(spec: PoolSpec) -> str:
    return "pool_global" if spec.is_global else "pool_window"


def compile_job(spec: PoolSpec, arch: str) -> CompileJob:
    """What PoolKernel compiles for this node on a GPU of `arch`."""
    return cuda.module_job(SOURCE, defines(spec), arch)


class PoolKernel(Kernel):
    """kernels/pool.cu specialised for one node; call it with [X] (a CuPy array)."""

    out_view = "contiguous"  # __call__ takes out= (registry.Kernel)
    replayable = True

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.name = kernel_name(spec, on_device=True)
        self.nonfinite_exact = spec.mode == AVERAGE  # as ReferencePoolKernel's
        self.function = cuda.load(compile_job(spec, cuda.device_arch())).get_function(function_name(spec))
        self.functions = [self.function]

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        """[Y] for [X]; Y is `out` when given (a C-contiguous float32 CuPy array, written in full)."""
        import cupy

        x = batched_input(cupy, inputs[0] if inputs else None, (self.spec.channels, *self.spec.size), "X", self.name)
        batch = int(x.shape[0])
        shape = self.spec.output_shape(batch)
        contiguous_out(cupy, out, shape, self.name)
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            y = cupy.empty(shape, dtype=cupy.float32) if out is None else out
            if batch:
                self._launch(x, y, batch)
        return [y]

    def _launch(self, x: Any, y: Any, batch: int) -> None:
        planes = batch * self.spec.channels
        if self.spec.is_global:
            threads = plane_threads(self.spec)
            grid = -(-planes // (BLOCK // threads))
            self.function((grid,), (BLOCK,), (x, y, np.int64(planes)))
        else:
            outputs = y.size
            self.function((-(-outputs // BLOCK),), (BLOCK,), (x, y, np.int64(outputs)))
