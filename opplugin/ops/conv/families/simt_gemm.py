"""The pipelined SIMT implicit GEMM (kernels/conv_simt_gemm.cu): the tensor-core
GEMM's pipeline (cp.async stages, the B tile gathered from the image, split K)
around plain FP32 fused multiply-adds, so it is FP32-exact *by construction*.

`simt_gemm_<BM>x<BN>[_k<S>]`: BM x BN is the block's output tile (maps x pixels of
the batch), each thread keeping a TM x TN micro-tile in registers (`TILES`); `_k<S>`
splits the K loop over S blocks whose partial sums a second kernel adds in a fixed
order, for layers with too few output tiles to fill the GPU. The name grammar, the
limits (group 1, no pool, the tap table) and the launch are the tensor-core family's
(`tensor_gemm`); the tiles, their order, the slice depth and the source are this family's own.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..epilogue import NONE
from ..spec import ConvSpec
from .common import CompileUnit, Family, shape_defines
from .gemm import pixels
from .tensor_gemm import PipelinedTensorGemm, multiprocessors, split_for, tiles_header_defines

SLICE_DEPTH = 16  # BK: four float4 reads of A per slice; the tap table (32-row slices) covers it


@dataclass(frozen=True)
class SimtTile:
    """A block's output tile and each thread's register micro-tile."""

    bm: int
    bn: int
    tm: int  # rows (maps) per thread
    tn: int  # columns (pixels) per thread: whole float4 groups
    min_blocks: int  # blocks per SM the register budget is set for (__launch_bounds__)
    stages: int = 4  # BK slices in flight in shared memory
    depth: int = SLICE_DEPTH  # BK; at most the tap table's 32-row slices

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    def shared_bytes(self) -> int:
        return self.stages * (self.bm * (self.depth + 4) + self.depth * self.bn) * 4


# 8x8 micro-tiles where the block is large (64 FMAs per 4 LDS.128 per k), 8x4 and 4x4 on the
# small tiles. min_blocks caps the registers: 168 for the 128-thread 8x8 tiles (3 blocks an SM),
# 128 for the small ones; 128x128 (256 threads) gets all 255, since at 128 the 7x7 stem spills.
# Measured on an H100 (VGG 512->512 14x14 and ResNet 3x3 layers, batch 32): 4 blocks of the 8x8
# tiles at 128 registers ran 8-15% slower than 3 at 167 (less ILP), and BK = 32 slower than 16.
TILES = {
    (128, 128): SimtTile(128, 128, 8, 8, 1),
    (128, 64): SimtTile(128, 64, 8, 8, 3),
    (64, 128): SimtTile(64, 128, 8, 8, 3),
    (64, 64): SimtTile(64, 64, 8, 4, 4),
    (32, 128): SimtTile(32, 128, 4, 8, 4),
    (32, 64): SimtTile(32, 64, 4, 4, 4),
}

# The order configs() offers tiles in, by the layer's maps, from `bench --suite cnn` on an H100:
# at batch 32, 128x64 was fastest on every layer with 128 maps or more but one (ResNet 256->256
# 14x14: 64x64, 2% ahead), 64x128 on every layer with 64 maps; 32-row tiles for fewer maps.
TILE_ORDER = (
    (128, ((128, 64), (64, 128), (64, 64), (128, 128), (32, 128), (32, 64))),
    (48, ((64, 128), (64, 64), (32, 128), (128, 64), (128, 128), (32, 64))),
    (0, ((32, 128), (32, 64), (64, 128), (64, 64), (128, 64), (128, 128))),
)


def vector_output(spec: ConvSpec) -> bool:
    """A 4-pixel group of columns lies in one image and starts 16-byte aligned: float4 stores."""
    return pixels(spec) % 4 == 0


class SimtGemm(PipelinedTensorGemm):
    name = "simt_gemm"
    summary = (
        "FP32 FMAs, FP32-exact by construction (sm_80+): implicit GEMM with 8x8 register micro-tiles fed by "
        "16-byte shared-memory reads, tiles streamed through a 4-stage cp.async pipeline, split K for small outputs; "
        "weights read at call time; fuses bias, a residual Add and an activation"
    )
    exact = True
    exact_by = "construction"
    split = False  # no operand split: NaN and Inf follow FP32 arithmetic
    tiles = TILES
    slice_depth = SLICE_DEPTH

    def configs(self, spec, epilogue=NONE):
        """Every tile, the likely fastest first (TILE_ORDER), each with the K split that fills the GPU."""
        sms = multiprocessors()
        order = next(tiles for least_maps, tiles in TILE_ORDER if spec.out_channels >= least_maps)
        return [self.config_name(TILES[t], split_for(spec, TILES[t], sms)) for t in order]

    def compile_units(self, spec, variant, epilogue=NONE):
        tile, splits = self.tile_and_split(spec, variant)
        tile_defines = dict(BM=tile.bm, BN=tile.bn, BK=tile.depth, TM=tile.tm, TN=tile.tn, STAGES=tile.stages, MIN_BLOCKS=tile.min_blocks)
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, splits) | tile_defines | {"OUT_VEC": int(vector_output(spec))}
        functions = ["conv_simt_gemm"] + (["conv_k_slices_reduce"] if splits > 1 else [])  # the reduce adds split-K slices
        return [CompileUnit("conv_simt_gemm.cu", function, defines) for function in functions]

    def build(self, spec, variant, weights, epilogue=NONE):
        kernel = super().build(spec, variant, weights, epilogue)  # the tensor-core family's launch, with this family's units
        if vector_output(spec):
            kernel.alignment = 16  # y and the residual are written and read as float4
        return kernel


FAMILIES: list[Family] = [SimtGemm()]
