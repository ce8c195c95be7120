"""Implicit GEMM on the tensor cores with mma.sync m16n8k8 TF32 (kernels/conv_tf32_mma.cu, sm_80+).
Neither is FP32-exact (exact=False): they run only when named, never by the heuristic or tuning.

- `tf32_n<NT>`: one warp computes 16*ceil(M/16) maps x 8*NT pixels per step.
- `3xtf32_n<NT>`: the same GEMM with each operand split into two TF32 parts and three MMAs
  per tile: about FP32 accuracy, still opt-in because of its name.

Each family states its accuracy as `expected_relative_error` (the relative L2 error against a
float64 reference one should see on standard-normal data) and `max_relative_error` (the bound
the GPU tests hold it to).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ....gpu import cuda
from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import BLOCK, CompileUnit, ConvKernel, Family, shape_defines


MMA_TILES = (4, 2, 8)  # 8-pixel tiles per warp step (NT): the pick's candidates, then 8 (spills at 128 registers)
MMA_ACCUMULATORS = 64  # 4 per 16x8 tile: the pick keeps MTILES x NT tiles within this
# The pick also keeps a warp step at most this many MMAs (k-steps x tiles x 1 or 3): on an
# H200 at batch 10000 the larger steps of lenet86.conv2 (tf32_n8, 3xtf32_n4) ran 15-30% slower.
MMA_STEP_BUDGET = 192
MMA_SHARED_BYTES = 48 * 1024  # static shared memory of one block
MMA_UNROLL_BUDGET = 512  # MMAs in the fully unrolled k-step loop, past which it stays rolled
BLOCKS_PER_SM = 8  # grid cap of the grid-stride loop: 8 blocks of 256 threads fill an SM


@dataclass(frozen=True)
class MmaConfig(Config):
    """A warp computes all the maps x `pixel_tiles` 8-pixel tiles per step."""

    pixel_tiles: int = tagged("n")


def map_tiles(spec: ConvSpec) -> int:
    return -(-spec.out_channels // 16)


def k_steps(spec: ConvSpec) -> int:
    return -(-(spec.in_channels // spec.group) * int(np.prod(spec.kernel)) // 8)


class TensorCoreGemm(Family):
    """Implicit GEMM with mma.sync m16n8k8 TF32; `split` picks the 3xTF32 form."""

    split = False
    exact = False
    fuses = False
    config_type = MmaConfig

    def shared_bytes(self, spec: ConvSpec) -> int:
        return map_tiles(spec) * k_steps(spec) * 32 * 16 * (2 if self.split else 1)

    def step_mmas(self, spec: ConvSpec, tiles: int) -> int:
        """MMA instructions of one warp step over the whole K."""
        return k_steps(spec) * map_tiles(spec) * tiles * (3 if self.split else 1)

    def configs(self, spec, epilogue=NONE):
        fitting = [n for n in MMA_TILES if map_tiles(spec) * n * 4 <= MMA_ACCUMULATORS]
        pick = next((n for n in fitting if n < 8 and self.step_mmas(spec, n) <= MMA_STEP_BUDGET), 1)
        return [MmaConfig(self.name, n) for n in dict.fromkeys([pick, *fitting])][:3]

    def reason(self, spec, config, epilogue):
        if spec.group != 1:
            return f"{self.name} implements group=1 only (this Conv has group={spec.group}); fp16 or the FP32 variants run grouped convs"
        if self.shared_bytes(spec) > MMA_SHARED_BYTES:
            return (
                f"{self.name}: the padded {16 * map_tiles(spec)} x {8 * k_steps(spec)} weight fragments need "
                f"{self.shared_bytes(spec)} bytes of shared memory, more than {MMA_SHARED_BYTES}"
            )
        tiles = config.pixel_tiles
        if not 1 <= tiles <= 8 or map_tiles(spec) * tiles * 4 > 2 * MMA_ACCUMULATORS:
            return (
                f"{config}: {map_tiles(spec)} map tiles x {tiles} pixel tiles need {map_tiles(spec) * tiles * 4} "
                f"accumulators per lane; at most {2 * MMA_ACCUMULATORS} (and 1..8 pixel tiles) fit in registers"
            )
        return None

    def compile_units(self, spec, config, epilogue=NONE):
        tiles = config.pixel_tiles
        defines = shape_defines(spec) | {
            "NT": tiles,
            "SPLIT": int(self.split),
            "UNROLL_K": k_steps(spec) if self.step_mmas(spec, tiles) <= MMA_UNROLL_BUDGET else 1,
            # two resident blocks (at most 128 registers) paid off with one or two map tiles;
            # with four (ece408_high) the register cap cost more than the occupancy gained
            "MIN_BLOCKS": 2 if map_tiles(spec) <= 2 else 1,
        }
        return [CompileUnit("conv_tf32_mma.cu", "conv_3xtf32" if self.split else "conv_tf32", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        processors = cuda.multiprocessor_count()
        return MmaKernel(spec, config, function, max_blocks=BLOCKS_PER_SM * processors)


class Tf32(TensorCoreGemm):
    name = "tf32"
    precision = "tf32"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): implicit GEMM with mma.sync m16n8k8 TF32, operands rounded with "
        "cvt.rna; relative L2 error ~3e-4 (cuDNN's TF32 mode gives the same); group 1; weights read at call time"
    )
    # measured on an H200, standard-normal data: 2.8e-4 to 2.9e-4 on the shipped convs
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class Split3xTf32(TensorCoreGemm):
    name = "3xtf32"
    summary = (
        "tensor cores (opt-in, sm_80+): implicit GEMM with each FP32 operand split into big + small TF32 parts and "
        "three MMAs (big*big + big*small + small*big): relative L2 error ~1e-6, near FP32; group 1"
    )
    split = True
    # measured on an H200: 2.4e-7 (K=25), 4.3e-7 (K=49), 1.4e-6 (K=196) on the shipped convs;
    # FP32 kernels give 1e-7 to 3e-7: the MMA's own FP32 accumulation rounds less carefully
    expected_relative_error = 1e-6
    max_relative_error = 1e-5


class MmaKernel(ConvKernel):
    """A tensor-core variant: a grid-stride loop over warp tiles of NT x 8 pixels,
    at most `max_blocks` blocks so that each block's weight staging is amortised."""

    reads_weights = True

    def __init__(self, spec, config: MmaConfig, function, *, max_blocks: int):
        super().__init__(spec, config, [function])
        self._function = function
        self._pixel_tiles = config.pixel_tiles
        self._max_blocks = max_blocks

    def _launch(self, x: Any, weights: tuple, y: Any, batch: int) -> None:
        columns = batch * int(np.prod(self.spec.out_size))
        warp_tiles = -(-columns // (8 * self._pixel_tiles))
        blocks = min(-(-warp_tiles // (BLOCK // 32)), self._max_blocks)
        self._function((blocks, 1, 1), (BLOCK, 1, 1), (x, *weights, y, np.int32(batch)))


FAMILIES: list[Family] = [Tf32(), Split3xTf32()]
