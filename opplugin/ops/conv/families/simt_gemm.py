"""The pipelined SIMT implicit GEMM (kernels/conv_simt_gemm.cu): the tensor-core
GEMM's pipeline (cp.async stages, the B tile gathered from the image, split K)
around plain FP32 fused multiply-adds, so it is FP32-exact *by construction*.

`simt_gemm_b<BM>x<BN>x<BK>_t<TM>x<TN>_s<S>_o<O>[_k<K>]`: BM x BN is the block's output
tile (maps x pixels of the batch) and BK its K depth, each thread keeping a TM x TN
micro-tile in registers, S stages in flight, registers budgeted for O blocks per SM
(`THREAD_TILES`); `_k<K>` splits the K loop over K blocks. Any group count: a block's maps
lie in one group, so narrow groups (ResNeXt's 4, RegNet's 16 maps) take 16- and 8-row
tiles. The limits (no pool, the tap table), the groups and the launch are the pipelined
GEMMs' (`pipelined`); the tiles, their order, the slice depth and the source are this
family's own.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config_grammar import tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, Family, shape_defines
from .gemm import pixels
from .pipelined import PipelinedConfig, PipelinedGemm, multiprocessors, split_for, tile_order, tiles_header_defines, with_split

SLICE_DEPTH = 16  # BK: four float4 reads of A per slice; the tap table (32-row slices) covers it
STAGES = 4  # BK slices in flight in shared memory


@dataclass(frozen=True)
class SimtGemmConfig(PipelinedConfig):
    """A block's output tile and K depth, each thread's register micro-tile, the stages,
    the blocks per SM the registers are budgeted for, the K split."""

    block: tuple[int, int, int] = tagged("b", 3)  # BM x BN x BK; BK at most the tap table's 32-row slices
    thread: tuple[int, int] = tagged("t", 2)  # TM x TN: maps x pixels (whole float4 groups) per thread
    stages: int = tagged("s")
    occupancy: int = tagged("o")  # __launch_bounds__' blocks per SM
    splits: int = tagged("k", default=1)

    @property
    def threads(self) -> int:
        return (self.bm // self.thread[0]) * (self.bn // self.thread[1])

    @property
    def min_blocks(self) -> int:
        return self.occupancy

    def shared_bytes(self) -> int:
        return self.stages * (self.bm * (self.bk + 4) + self.bk * self.bn) * 4


# BM x BN -> (TM x TN, blocks per SM). 8x8 micro-tiles where the block is large (64 FMAs per
# 4 LDS.128 per k), 8x4 and 4x4 on the small tiles. The blocks per SM cap the registers: 168 for
# the 128-thread 8x8 tiles (3 blocks an SM), 128 for the small ones; 128x128 (256 threads) gets
# all 255, since at 128 the 7x7 stem spills. Measured on an H100 (VGG 512->512 14x14 and ResNet
# 3x3 layers, batch 32): 4 blocks of the 8x8 tiles at 128 registers ran 8-15% slower than 3 at
# 167 (less ILP), and BK = 32 slower than 16.
THREAD_TILES = {
    (128, 128): ((8, 8), 1),
    (128, 64): ((8, 8), 3),
    (64, 128): ((8, 8), 3),
    (64, 64): ((8, 4), 4),
    (32, 128): ((4, 8), 4),
    (32, 64): ((4, 4), 4),
    (16, 128): ((2, 8), 4),
    (16, 64): ((2, 4), 4),
    (8, 128): ((1, 8), 4),
}

# The order configs() offers tiles in, by the maps of a group, from `bench --suite cnn` on an H100:
# at batch 32, 128x64 was fastest on every layer with 128 maps or more but one (ResNet 256->256
# 14x14: 64x64, 2% ahead), 64x128 on every layer with 64 maps; 32-row tiles for fewer maps. A
# group's maps waste the rest of a tile's rows, so narrow groups take the 16- and 8-row tiles.
LARGE = ((128, 128), (128, 64), (64, 128), (64, 64))
TILE_ORDER = (
    (128, ((128, 64), (64, 128), (64, 64), (128, 128), (32, 128), (32, 64), (16, 128), (16, 64), (8, 128))),
    (48, ((64, 128), (64, 64), (32, 128), (128, 64), (128, 128), (32, 64), (16, 128), (16, 64), (8, 128))),
    (24, ((32, 128), (32, 64), (64, 128), (64, 64), (128, 64), (128, 128), (16, 128), (16, 64), (8, 128))),
    (12, ((16, 128), (16, 64), (32, 128), (32, 64), (8, 128), *LARGE)),
    (0, ((8, 128), (16, 128), (16, 64), (32, 128), (32, 64), *LARGE)),
)


def vector_output(spec: ConvSpec) -> bool:
    """A 4-pixel group of columns lies in one image and starts 16-byte aligned: float4 stores."""
    return pixels(spec) % 4 == 0


class SimtGemm(PipelinedGemm):
    name = "simt_gemm"
    summary = (
        "FP32 FMAs, FP32-exact by construction (sm_80+): implicit GEMM with 8x8 register micro-tiles fed by "
        "16-byte shared-memory reads, tiles streamed through a 4-stage cp.async pipeline, split K for small outputs; "
        "weights read at call time; fuses bias, a residual Add and an activation"
    )
    exact = True
    exact_by = "construction"
    tiles = THREAD_TILES
    config_type = SimtGemmConfig

    def tile_config(self, tile, splits=1):
        thread, occupancy = THREAD_TILES[tile]
        return SimtGemmConfig(self.name, (*tile, SLICE_DEPTH), thread, STAGES, occupancy, splits)

    def configs(self, spec, epilogue=NONE):
        """Every tile, the likely fastest first (TILE_ORDER), each with the K split that fills the GPU."""
        sms = multiprocessors()
        return [with_split(c, split_for(spec, c, sms)) for c in map(self.tile_config, tile_order(TILE_ORDER, spec))]

    def compile_units(self, spec, config, epilogue=NONE):
        tm, tn = config.thread
        tile_defines = dict(BM=config.bm, BN=config.bn, BK=config.bk, TM=tm, TN=tn, STAGES=config.stages, MIN_BLOCKS=config.min_blocks)
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, config.splits) | tile_defines | {"OUT_VEC": int(vector_output(spec))}
        functions = ["conv_simt_gemm"] + (["conv_k_slices_reduce"] if config.splits > 1 else [])  # the reduce adds split-K slices
        return [CompileUnit("conv_simt_gemm.cu", function, defines) for function in functions]

    def alignment(self, spec):
        return 16 if vector_output(spec) else super().alignment(spec)  # y and the residual are written and read as float4


FAMILIES: list[Family] = [SimtGemm()]
