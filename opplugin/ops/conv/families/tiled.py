"""`tiled_b<TH>x<TW>`: shared-memory tiled convolution. A block of TH x TW = 256
threads computes that tile of one output map, loading the input tile with its
halo into shared memory one channel at a time; filters in __constant__ memory."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import BLOCK, CompileUnit, ConvKernel, Family, filter_constants, shape_defines, unroll_channels

WIDTHS = (8, 16, 32, 64)  # tile widths a block of BLOCK threads can take (heights 32, 16, 8, 4)
TUNED_WIDTHS = (16, 32)  # what tuning tries: a half or a whole warp per tile row
IDLE_LIMIT = 1.15  # how many more threads (idle ones on the edges) t32 may launch than t16 and still go first
SHARED_BYTES = 48 * 1024  # static __shared__ limit of a block


@dataclass(frozen=True)
class TiledConfig(Config):
    """A block computes a height x width tile of one output map, a thread per output."""

    block: tuple[int, int] = tagged("b", 2)  # height x width

    @property
    def height(self) -> int:
        return self.block[0]

    @property
    def width(self) -> int:
        return self.block[1]


def input_tile(spec: ConvSpec, height: int, width: int) -> tuple[int, int]:
    """Rows and columns of input (halo included) one output tile reads per channel."""
    (sh, sw), (kh, kw), (dh, dw) = spec.strides, spec.kernel, spec.dilations
    return (height - 1) * sh + (kh - 1) * dh + 1, (width - 1) * sw + (kw - 1) * dw + 1


def tiles(spec: ConvSpec, height: int, width: int) -> int:
    """Tiles per output map; the last row and column of tiles may overhang."""
    oh, ow = spec.out_size
    return -(-oh // height) * -(-ow // width)


class Tiled(Family):
    name = "tiled"
    summary = (
        "shared-memory tiling: a block stages the input tile + halo of one channel at a time in shared "
        "memory, each thread computes one output from it; filters in __constant__ memory"
    )
    constant_weights = True
    config_type = TiledConfig

    def config(self, width: int) -> TiledConfig:
        """The tile of BLOCK threads `width` outputs wide."""
        return TiledConfig(self.name, (BLOCK // width, width))

    def configs(self, spec, epilogue=NONE):
        """t32 first (a warp is one tile row: conflict-free shared reads, measured faster on lenet86
        conv2 and ece408), unless its tiles overhang the output so far that it launches over
        IDLE_LIMIT x the threads t16 does (lenet86 conv1: 96 vs 80 columns, where t16 was faster)."""
        fitting = [w for w in TUNED_WIDTHS if self.reason(spec, self.config(w), epilogue) is None]
        if fitting == [16, 32]:
            # both tiles hold BLOCK threads: compare tile counts
            overhang = tiles(spec, BLOCK // 32, 32) > IDLE_LIMIT * tiles(spec, BLOCK // 16, 16)
            fitting = [16, 32] if overhang else [32, 16]
        return [self.config(w) for w in fitting]

    def unconfigured_reason(self, spec, epilogue):
        return "no tile's input fits in 48 KiB of shared memory"

    def reason(self, spec, config, epilogue):
        height, width = config.block
        if width not in WIDTHS or height * width != BLOCK:
            tiles = ", ".join(self.config(w).name() for w in WIDTHS)
            return f"{config}: the tile width must be one of {', '.join(map(str, WIDTHS))} (a block of {BLOCK} threads: {tiles})"
        rows, cols = input_tile(spec, height, width)
        if rows * cols * 4 > SHARED_BYTES:
            return (
                f"{config}: the input tile of {rows} x {cols} floats (halo included) exceeds "
                f"{SHARED_BYTES // 1024} KiB of shared memory"
            )
        return None

    def compile_units(self, spec, config, epilogue=NONE):
        # a tile load and two barriers per channel besides the taps: unroll the channels when short
        defines = shape_defines(spec) | {"TW": config.width, "TH": config.height, "UNROLL_C": unroll_channels(spec, 1)}
        return [CompileUnit("conv_tiled.cu", "conv_tiled", defines)]

    def module_constants(self, spec, config, weights):
        return filter_constants(weights)

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return TiledKernel(spec, config, function)


class TiledKernel(ConvKernel):
    """One block per (image, output tile) along x, per output map along y."""

    def __init__(self, spec, config: TiledConfig, function):
        super().__init__(spec, config, [function])
        self._function = function

    def _launch(self, x, weights, y, batch):
        height, width = self.config.block
        grid = (batch * tiles(self.spec, height, width), self.spec.out_channels, 1)
        self._function(grid, (width, height, 1), (x, y, np.int32(batch)))


FAMILIES: list[Family] = [Tiled()]
