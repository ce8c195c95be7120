"""A LayerNormalization's kernel over the channel axis on tensors kept channel-last in a 16-bit format
(kernels/norm_channel_last.cu): which ones its configuration says (channel_last.py); the other is FP32 NCHW, as
the plain kernel (kernel.py) has both."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import Kernel
from ..activation import cuda_float
from ..channel_last import FORMAT_CODES, INPUT, OUTPUT, linked_call_arrays
from .channel_last import LANES, LinkedNorm
from .kernel import op_name
from .spec import NormSpec

SOURCE = "norm_channel_last.cu"
FUNCTION = "normalize_channel_last"
BLOCK = 256  # the kernel's BLOCK_THREADS
WARP = 32
PIECES_A_THREAD = 4  # a pixel takes more threads while each would hold more 8-channel pieces: 32 values in registers


def pixel_lanes(channels: int) -> int:
    """Threads a pixel: the largest power of two (up to a warp) that divides its 8-channel pieces, so that every
    thread takes as many (ConvNeXt's 96 to 768 channels: 4 to 32 threads of 3 pieces); twice that while a thread
    would take more than PIECES_A_THREAD (some threads then take one piece fewer)."""
    pieces = channels // LANES
    lanes = min(WARP, pieces & -pieces)
    while lanes < WARP and -(-pieces // lanes) > PIECES_A_THREAD:
        lanes *= 2
    return lanes


def pieces_a_thread(channels: int) -> int:
    return -(-(channels // LANES) // pixel_lanes(channels))


def defines(spec: NormSpec, config: LinkedNorm) -> dict[str, int | str]:
    """The -D macros of kernels/norm_channel_last.cu for this node and links (all but the batch)."""
    channels, h, w = spec.input_shape[1:]
    return {"C": channels, "PLANE": h * w, "EPSILON": cuda_float(spec.epsilon), "PIXEL_LANES": pixel_lanes(channels),
            "PER": pieces_a_thread(channels), "HALF_FORMAT": FORMAT_CODES[config.format],
            "X_CHANNEL_LAST": int(bool(config.links & INPUT)), "Y_CHANNEL_LAST": int(bool(config.links & OUTPUT))}


def compile_job(spec: NormSpec, config: LinkedNorm, arch: str) -> CompileJob:
    """What LinkedNormKernel compiles for this node on a GPU of `arch`."""
    return cuda.module_job(SOURCE, defines(spec, config), arch)


def kernel_name(spec: NormSpec, config: LinkedNorm) -> str:
    """e.g. "layernorm.cuda_fp16_h3.4lanes": the threads that take a pixel's channels."""
    return f"{op_name(spec)}.{config.name()}.{pixel_lanes(spec.input_shape[1])}lanes"


class LinkedNormKernel(Kernel):
    """kernels/norm_channel_last.cu for one node and links, on the scale and bias it was built with; call it with
    [X]: uint16 [N][H][W][C] in the format where X is linked, float32 NCHW where not. Y likewise. It raises a
    watched step's NaN/Inf flag itself, reading each value as it stored it."""

    out_view = "contiguous"  # __call__ takes out= (registry.Kernel)
    replayable = True
    flags_nonfinite = True

    def __init__(self, spec: NormSpec, config: LinkedNorm, scale: np.ndarray, bias: np.ndarray):
        import cupy

        self.spec, self.config = spec, config
        self.variant = config.name()
        self.name = kernel_name(spec, config)
        # NaN and Inf in a row make it NaN as the plain kernel's do; but an FP32 result rounded into the format as
        # it is stored may pass FP16's range (a large scale): a linked Y is watched, the plain kernel its rerun
        self.nonfinite_exact = not config.links & OUTPUT
        self.function = cuda.load(compile_job(spec, config, cuda.device_arch())).get_function(FUNCTION)
        self.functions = [self.function]
        self._scale = cupy.asarray(scale, dtype=cupy.float32)  # 16-byte aligned: a fresh allocation
        self._bias = cupy.asarray(bias, dtype=cupy.float32)
        # a copy from pageable memory may still be on its way when the call returns; a launch on another stream
        # must find the scale and bias whole
        cupy.cuda.get_current_stream().synchronize()
        self._lanes = pixel_lanes(spec.input_shape[1])

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        """As the plain kernel's, with two bytes a value of a linked tensor rather than four."""
        values = batch * int(np.prod(self.spec.input_shape[1:]))
        return self.spec.bytes_moved(batch) - 2 * values * (bool(self.config.links & INPUT) + bool(self.config.links & OUTPUT))

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0) -> list[Any]:
        """[Y] for [X]; Y is `out` when given (C-contiguous, written in full). `nonfinite`: the device address
        of a zeroed byte the kernel sets where a value of Y as stored is NaN or Inf (0: none)."""
        import cupy

        with cuda.on_stream(stream):
            x, y, batch = linked_call_arrays(cupy, inputs[0] if inputs else None, out, self.config.links, self.spec.input_shape[1:],
                                             self.spec.output_shape, self.name)
            if batch:
                pixels = batch * self.spec.rows.inner
                threads = pixels * self._lanes
                self.function((-(-threads // BLOCK),), (BLOCK,), (x, self._scale, self._bias, y, np.int64(pixels), np.uint64(nonfinite)))
        return [y]
