"""The pipelined tensor-core implicit GEMM (kernels/conv_tc_gemm.cu), for the
layers of real CNNs: weights in global memory, so no filter bank is too big.

- `tc_3xtf32_b<BM>x<BN>x<BK>_w<WM>x<WN>_s<S>[_k<K>]`: each FP32 operand split into
  two TF32 parts, three MMAs per tile. FP32-exact *by measurement*: its error against
  float64 meets the bound every exact family is held to (relative L2 <= 1e-5), so the
  heuristic and `opplugin tune` may pick it.
- `tc_tf32_...`: one TF32 MMA per tile, opt-in (~3e-4 relative error).
- `tc_fp16_...`, `tc_bf16_...`: operands rounded to FP16 or BF16, m16n8k16 MMAs with FP32
  accumulation, opt-in (~3e-4 and ~2e-3).

BM x BN is the block's output tile (maps x pixels of the batch), BK the K depth of a
pipeline stage, WM x WN a warp's part of the tile, S the stages in flight; `_k<K>` splits
the K loop over K blocks (see `pipelined`). The tiles are `WARP_TILES`.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config_grammar import tagged
from ..epilogue import NONE
from .base import CompileUnit, Family, shape_defines
from .pipelined import PipelinedConfig, PipelinedGemm, split_configs, tile_order, tiles_header_defines

SLICE_DEPTH = 32  # BK: four m16n8k8 steps per pipeline stage
STAGES = 3


@dataclass(frozen=True)
class TensorGemmConfig(PipelinedConfig):
    """A block's output tile, its K depth, how its warps share it, the stages, the K split."""

    block: tuple[int, int, int] = tagged("b", 3)  # BM x BN x BK
    warp: tuple[int, int] = tagged("w", 2)  # WM x WN: maps a multiple of 16, pixels a multiple of 8
    stages: int = tagged("s")
    splits: int = tagged("k", default=1)

    @property
    def threads(self) -> int:
        wm, wn = self.warp
        return (self.bm // wm) * (self.bn // wn) * 32

    @property
    def min_blocks(self) -> int:
        """One block of 256 threads, or two of 128, leave each thread up to 255 registers."""
        return 1 if self.threads >= 256 else 2

    def shared_bytes(self) -> int:
        return self.stages * (self.bm * (self.bk + 4) + self.bk * (self.bn + 8)) * 4


# A warp's part is 64x32, 32x64 or 32x32: 64 or 32 accumulators a lane (and as many
# for the slice's partial sums), the most that leave room for the split operands.
# (Twice the warps on 32x32 parts, capped at 128 registers for two blocks an SM, ran
# no faster on the layer set at batch 32 on an H100, and spilled on the 7x7 stem.)
WARP_TILES = {
    (128, 128): (64, 32),
    (128, 64): (64, 32),
    (64, 128): (32, 64),
    (64, 64): (32, 32),
    (32, 128): (32, 32),
    (32, 64): (32, 16),
}


# The order the heuristic tries tiles in, by the layer's maps: on an H100 at batch 32 the
# deep 3x3 layers with 128 maps or more ran fastest on 128x64 tiles, those with 64 maps on
# 64x128 (bench --suite cnn); the rest are what `opplugin tune` also tries.
TILE_ORDER = (
    (128, ((128, 64), (64, 128), (64, 64), (128, 128), (32, 128), (32, 64))),
    (48, ((64, 128), (64, 64), (128, 64), (32, 128), (128, 128), (32, 64))),
    (0, ((32, 128), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))),
)


class PipelinedTensorGemm(PipelinedGemm):
    """kernels/conv_tc_gemm.cu; `split` picks 3xTF32, `half` 1 FP16 and 2 BF16 operands."""

    split = True
    half = 0
    tiles = WARP_TILES
    config_type = TensorGemmConfig

    def tile_config(self, tile, splits=1):
        return TensorGemmConfig(self.name, (*tile, SLICE_DEPTH), WARP_TILES[tile], STAGES, splits)

    def configs(self, spec, epilogue=NONE):
        """Every tile, the heuristic's pick first (TILE_ORDER), each with its K splits (`split_configs`)."""
        return split_configs(spec, [self.tile_config(t) for t in tile_order(TILE_ORDER, spec)])

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, config.splits) | {
            "BM": config.bm,
            "BN": config.bn,
            "BK": config.bk,
            "WM": config.warp[0],
            "WN": config.warp[1],
            "STAGES": config.stages,
            "SPLIT": int(self.split),
            "HALF": self.half,
            "MIN_BLOCKS": config.min_blocks,
        }
        units = [CompileUnit("conv_tc_gemm.cu", "conv_tc_gemm", defines)]
        if config.splits > 1:
            units.append(CompileUnit("conv_tc_gemm.cu", "conv_k_slices_reduce", defines))
        return units


class Split3xTf32Gemm(PipelinedTensorGemm):
    name = "tc_3xtf32"
    summary = (
        "tensor cores, FP32-exact by measurement (sm_80+): implicit GEMM with each operand split into big + small "
        "TF32 parts (three mma.sync per tile), tiles streamed through a 3-stage cp.async pipeline, split K for small "
        "outputs; weights read at call time; fuses bias, a residual Add and an activation"
    )
    exact = True
    exact_by = "measurement"
    expected_relative_error = 1e-6
    max_relative_error = 1e-5


class ReducedPrecisionGemm(PipelinedTensorGemm):
    """One rounding of each operand to a narrower type: opt-in, never picked by the runner."""

    split = False
    exact = False


class Tf32Gemm(ReducedPrecisionGemm):
    name = "tc_tf32"
    precision = "tf32"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with one TF32 mma.sync per tile; "
        "relative L2 error ~3e-4, as cuDNN's TF32 mode"
    )
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class Fp16Gemm(ReducedPrecisionGemm):
    name = "tc_fp16"
    precision = "fp16"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with both operands rounded to FP16 and "
        "m16n8k16 MMAs accumulating in FP32; relative L2 error ~3e-4; inputs beyond FP16's range (65504) overflow"
    )
    half = 1
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class Bf16Gemm(ReducedPrecisionGemm):
    name = "tc_bf16"
    precision = "bf16"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with both operands rounded to BF16 "
        "(FP32's range, 8-bit mantissa) and m16n8k16 MMAs accumulating in FP32; relative L2 error ~2e-3"
    )
    half = 2
    expected_relative_error = 2e-3
    max_relative_error = 1e-2


FAMILIES: list[Family] = [Split3xTf32Gemm(), Tf32Gemm(), Fp16Gemm(), Bf16Gemm()]
