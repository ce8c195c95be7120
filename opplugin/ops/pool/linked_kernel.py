"""A pool's kernel on tensors kept channel-last in a 16-bit format (kernels/pool_channel_last.cu): which ones
its configuration says (channel_last.py); the other is FP32 NCHW, as the plain kernel (kernel.py) has both."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import Kernel
from ..channel_last import FORMAT_CODES, INPUT, OUTPUT, linked_call_arrays
from .channel_last import LANES, LinkedPool
from .kernel import BLOCK, kernel_name, shape_defines
from .spec import AVERAGE, PoolSpec

SOURCE = "pool_channel_last.cu"
GROUP_TILE = 32  # channel groups a global pool's block takes at most: a warp's loads of a pixel, 512 bytes
FEWEST_GROUPS = 4  # ... and at least, where the image has that many: runs of 64 bytes of a pixel
BLOCKS_AN_IMAGE = 8  # blocks an image's channels are split over where the tiles allow: a batch of 1 still fills SMs


def defines(spec: PoolSpec, config: LinkedPool) -> dict[str, int]:
    """The -D macros of kernels/pool_channel_last.cu for this pool and links (all but the batch)."""
    found = shape_defines(spec) | {"HALF_FORMAT": FORMAT_CODES[config.format], "X_CHANNEL_LAST": int(bool(config.links & INPUT)),
                                   "Y_CHANNEL_LAST": int(bool(config.links & OUTPUT))}
    if spec.is_global:
        found |= {"GROUP_TILE": group_tile(spec), "TILES": global_tiles(spec)}
    return found


def group_tile(spec: PoolSpec) -> int:
    """A global pool block's channel groups (of LANES channels): the most, up to GROUP_TILE, that still split an image
    over BLOCKS_AN_IMAGE blocks, else FEWEST_GROUPS; the block's other threads share the plane's pixels. EfficientNet's
    squeezes (672 channels at 14x14, 96 at 112x112) took 10 to 20 us each at 32 groups a block: 1 to 3 blocks an
    image, each thread walking hundreds of pixels one load at a time."""
    groups = spec.channels // LANES
    tile = GROUP_TILE
    while tile > FEWEST_GROUPS and -(-groups // tile) < BLOCKS_AN_IMAGE:
        tile //= 2
    return min(tile, groups)


def global_tiles(spec: PoolSpec) -> int:
    """A global pool's blocks an image: its channel groups, group_tile's at a time."""
    groups = spec.channels // LANES
    return -(-groups // group_tile(spec))


def function_name(spec: PoolSpec) -> str:
    return "pool_global_channel_last" if spec.is_global else "pool_window_channel_last"


def compile_job(spec: PoolSpec, config: LinkedPool, arch: str) -> CompileJob:
    """What LinkedPoolKernel compiles for this node on a GPU of `arch`."""
    return cuda.module_job(SOURCE, defines(spec, config), arch)


class LinkedPoolKernel(Kernel):
    """kernels/pool_channel_last.cu for one node and links; call it with [X]: uint16 [N][H][W][C] in the format
    where X is linked, float32 NCHW where not. Y likewise. It raises a watched step's NaN/Inf flag itself,
    reading each value as it stored it."""

    out_view = "contiguous"  # __call__ takes out= (registry.Kernel)
    replayable = True
    flags_nonfinite = True

    def __init__(self, spec: PoolSpec, config: LinkedPool):
        self.spec, self.config = spec, config
        self.variant = config.name()
        self.name = kernel_name(spec, True, self.variant)
        self._x_linked, self._y_linked = bool(config.links & INPUT), bool(config.links & OUTPUT)
        # a max keeps every NaN, as the plain kernel's (its step is watched, runtime/exact.py); an average follows
        # IEEE, but one of FP32 values rounded into FP16 as it is stored may pass its range: watched then too
        self.nonfinite_exact = spec.mode == AVERAGE and (self._x_linked or not self._y_linked)
        self.function = cuda.load(compile_job(spec, config, cuda.device_arch())).get_function(function_name(spec))
        self.functions = [self.function]

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        """As the plain kernel's, with two bytes a value of a linked tensor rather than four."""
        (h, w), (oh, ow) = self.spec.size, self.spec.output_size
        values = batch * self.spec.channels
        return self.spec.bytes_moved(batch) - 2 * values * (h * w * self._x_linked + oh * ow * self._y_linked)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0) -> list[Any]:
        """[Y] for [X]; Y is `out` when given (C-contiguous, written in full). `nonfinite`: the device address
        of a zeroed byte the kernel sets where a value of Y as stored is NaN or Inf (0: none)."""
        import cupy

        sample = (self.spec.channels, *self.spec.size)
        with cuda.on_stream(stream):
            x, y, batch = linked_call_arrays(cupy, inputs[0] if inputs else None, out, self.config.links, sample,
                                             self.spec.output_shape, self.name)
            if batch:
                self._launch(x, y, batch, np.uint64(nonfinite))
        return [y]

    def _launch(self, x: Any, y: Any, batch: int, flag: np.uint64) -> None:
        if self.spec.is_global:
            self.function((batch * global_tiles(self.spec),), (BLOCK,), (x, y, flag))
        else:
            threads = batch * self.spec.output_size[0] * self.spec.output_size[1] * (self.spec.channels // LANES)
            self.function((-(-threads // BLOCK),), (BLOCK,), (x, y, np.int64(threads), flag))
