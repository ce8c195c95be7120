"""The Hopper implicit GEMM (kernels/conv_wgmma.cu): tc_3xtf32's implicit GEMM and 3xTF32
arithmetic on the asynchronous warpgroup MMA, wgmma, of sm_90a. It runs on compute capability 9.0
alone (H100, H200); tc_3xtf32 stays the path everywhere else.

A block's producer warpgroups copy and split each slice into shared memory, its consumer warpgroups
(one per 64 pixels) multiply from there; see the kernel's header for why.

`wg_3xtf32_b<BM>x<BN>x<BK>_s<S>[_k<K>]`: BM maps (one wgmma's N: 64 or 128) x BN pixels of the
batch a block, BK the K depth of a slice (32: one 128-byte line a row), S slices staged; `_k<K>`
splits the K loop over K blocks (`pipelined`). FP32-exact by measurement, as tc_3xtf32.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config_grammar import tagged
from ..epilogue import NONE
from .common import CompileUnit, Family, shape_defines
from .pipelined import PipelinedConfig, PipelinedGemm, split_configs, tile_order, tiles_header_defines
from .tensor_gemm import Split3xTf32Gemm

SLICE_DEPTH = 32  # BK: four k8 steps of three wgmmas a stage
STAGES = 4  # two slices in flight, one being split, one multiplied
HOPPER = "sm_90"  # the one architecture wgmma's code (sm_90a) runs on
WARPGROUP = 128
PIXELS_PER_WARPGROUP = 64  # a wgmma's M


@dataclass(frozen=True)
class WgmmaGemmConfig(PipelinedConfig):
    """A block's output tile and K depth, the stages, the K split."""

    block: tuple[int, int, int] = tagged("b", 3)  # BM maps x BN pixels x BK
    stages: int = tagged("s")
    splits: int = tagged("k", default=1)

    @property
    def threads(self) -> int:
        """A consumer warpgroup per 64 pixels, as many producer threads."""
        return 2 * self.bn // PIXELS_PER_WARPGROUP * WARPGROUP

    @property
    def min_blocks(self) -> int:
        """The shared memory of the stages, and the consumers' registers, leave room for one block an SM."""
        return 1

    def shared_bytes(self) -> int:
        """STAGES slices of weights and image values, two of their small parts, two mbarriers a stage,
        and 1024 bytes to align the swizzle's atoms with."""
        return (self.stages + 2) * (self.bm + self.bn) * self.bk * 4 + self.stages * 16 + 1024


# maps x pixels; the order the heuristic offers them in, by the maps of a group (as tc_3xtf32's)
TILES = ((128, 64), (128, 128), (64, 128), (64, 64))
# On an H200 at batch 32: 128x128 ran fastest on every 3x3 layer of 128 maps or more (VGG 512->512
# at 14x14, ResNet 128->128 at 28x28, 256->256, 512->512), 64x128 on ResNet 64->64 at 56x56.
TILE_ORDER = (
    (128, ((128, 128), (64, 128), (128, 64), (64, 64))),
    (0, ((64, 128), (128, 128), (64, 64), (128, 64))),
)


class WgmmaGemm(PipelinedGemm):
    name = "wg_3xtf32"
    summary = (
        "tensor cores, FP32-exact by measurement (sm_90 alone: H100, H200): tc_3xtf32's implicit GEMM on Hopper's "
        "asynchronous warpgroup MMA (wgmma): producer warpgroups copy each slice into swizzled shared memory and "
        "split it into big + small TF32 parts once, consumer warpgroups multiply from there; split K; fuses bias, "
        "a residual Add and an activation"
    )
    exact = True
    exact_by = "measurement"
    split = True
    expected_relative_error = Split3xTf32Gemm.expected_relative_error
    max_relative_error = Split3xTf32Gemm.max_relative_error
    tiles = dict.fromkeys(TILES)
    config_type = WgmmaGemmConfig
    archs = (HOPPER,)

    def tile_config(self, tile, splits=1):
        return WgmmaGemmConfig(self.name, (*tile, SLICE_DEPTH), STAGES, splits)

    def configs(self, spec, epilogue=NONE):
        """Every tile, by TILE_ORDER, each with its K splits (`split_configs`)."""
        return split_configs(spec, [self.tile_config(t) for t in tile_order(TILE_ORDER, spec)])

    def alignment(self, spec):
        return 4

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, config.splits) | {
            "BM": config.bm,
            "BN": config.bn,
            "BK": config.bk,
            "STAGES": config.stages,
            "B_VEC": 1,  # the image tile is K-major: four neighbouring pixels are not neighbours there
        }
        units = [CompileUnit("conv_wgmma.cu", "conv_wgmma", defines, arch_specific=True)]
        if config.splits > 1:
            units.append(CompileUnit("conv_wgmma.cu", "conv_k_slices_reduce", defines, arch_specific=True))
        return units


FAMILIES: list[Family] = [WgmmaGemm()]
