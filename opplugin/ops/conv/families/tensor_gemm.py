"""The pipelined tensor-core implicit GEMM (kernels/conv_tc_gemm.cu), for the
layers of real CNNs: weights in global memory, so no filter bank is too big.

- `tc_3xtf32_<BM>x<BN>[_k<S>]`: each FP32 operand split into two TF32 parts,
  three MMAs per tile. FP32-exact *by measurement*: its error against float64
  meets the bound every exact family is held to (relative L2 <= 1e-5), so the
  heuristic and `opplugin tune` may pick it.
- `tc_tf32_<BM>x<BN>[_k<S>]`: one TF32 MMA per tile, opt-in (~3e-4 relative error).
- `tc_fp16_...`, `tc_bf16_...`: operands rounded to FP16 or BF16, m16n8k16 MMAs with FP32
  accumulation, opt-in (~3e-4 and ~2e-3).

BM x BN is the block's output tile (maps x pixels of the batch); `_k<S>` splits
the K loop over S blocks whose partial sums a second kernel adds in a fixed
order, for layers with too few output tiles to fill the GPU. The block's warp
layout, K depth and pipeline depth follow from the tile (`TILES`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..epilogue import NONE
from ..spec import ConvSpec
from .... import cuda
from .common import CompileUnit, ConvKernel, Family, load_functions, shape_defines
from .gemm import k_dim, pixels  # group 1 here: K = C * KH * KW

TAP_TABLE_ROWS = 8192  # int2 rows of the __constant__ k table: 64 KiB
NO_TAP = 0x3FFF  # must match the source: marks the table rows past K
SLICE_DEPTH = 32  # BK: four m16n8k8 steps per pipeline stage
STAGES = 3
MIN_SLICES_PER_BLOCK = 4  # split K only while each block keeps this many BK slices (the pipeline's depth)
MAX_K_SPLITS = 16
SHORT_K = 512  # up to this GEMM K, an unsplit smaller tile beats a split larger one
DEFAULT_SMS = 132  # an H100 SXM; the configs use the real count when a device is present
WAVE_SHARE = 0.8  # a grid of fewer blocks than this share of the SMs leaves too much idle: split K
WAVE_BALANCE = 0.9  # a K split that fills this share of the block slots over every wave is offered too
REDUCE_BLOCK = 256


@dataclass(frozen=True)
class Tile:
    """A block's output tile and how its warps share it."""

    bm: int
    bn: int
    wm: int  # rows (maps) per warp: a multiple of 16
    wn: int  # columns (pixels) per warp: a multiple of 8

    @property
    def threads(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn) * 32

    @property
    def min_blocks(self) -> int:
        """Blocks per SM the registers are capped for: one of 256 threads, or two of 128,
        leave each thread up to 255."""
        return 1 if self.threads >= 256 else 2

    def shared_bytes(self, depth: int = SLICE_DEPTH, stages: int = STAGES) -> int:
        return stages * (self.bm * (depth + 4) + depth * (self.bn + 8)) * 4


# A warp's part is 64x32, 32x64 or 32x32: 64 or 32 accumulators a lane (and as many
# for the slice's partial sums), the most that leave room for the split operands.
# (Twice the warps on 32x32 parts, capped at 128 registers for two blocks an SM, ran
# no faster on the layer set at batch 32 on an H100, and spilled on the 7x7 stem.)
TILES = {
    (128, 128): Tile(128, 128, 64, 32),
    (128, 64): Tile(128, 64, 64, 32),
    (64, 128): Tile(64, 128, 32, 64),
    (64, 64): Tile(64, 64, 32, 32),
    (32, 128): Tile(32, 128, 32, 32),
    (32, 64): Tile(32, 64, 32, 16),
}


# The order the heuristic tries tiles in, by the layer's maps: on an H100 at batch 32 the
# deep 3x3 layers with 128 maps or more ran fastest on 128x64 tiles, those with 64 maps on
# 64x128 (bench --suite cnn); the rest are what `opplugin tune` also tries.
TILE_ORDER = (
    (128, ((128, 64), (64, 128), (64, 64), (128, 128), (32, 128), (32, 64))),
    (48, ((64, 128), (64, 64), (128, 64), (32, 128), (128, 128), (32, 64))),
    (0, ((32, 128), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))),
)


def k_slices(spec: ConvSpec) -> int:
    return -(-k_dim(spec) // SLICE_DEPTH)


def columns(spec: ConvSpec, batch: int | None = None) -> int:
    return (spec.batch if batch is None else batch) * pixels(spec)


def is_pointwise(spec: ConvSpec) -> bool:
    """1x1, stride 1, no pads: a B row is a channel's pixels, contiguous in the image."""
    return spec.kernel == (1, 1) and spec.strides == (1, 1) and not any(spec.pads)


def masks_taps(spec: ConvSpec) -> bool:
    """Whether a thread can keep one bit per window tap (and one more that is never set)."""
    return int(np.prod(spec.kernel)) < 64


def tap_table(spec: ConvSpec) -> np.ndarray:
    """k -> (c*H*W + kh*DH*W + kw*DW, the tap's place), as int32 pairs, for K rounded up to
    whole BK slices. The place is kh*KW + kw when `masks_taps`, with KH*KW for the rows
    past K; else kh*DH << 16 | kw*DW, with NO_TAP << 16 past K (a row outside every image)."""
    (h, w), (kh, kw), (dh, dw) = spec.in_size, spec.kernel, spec.dilations
    c, i, j = np.meshgrid(np.arange(spec.in_channels), np.arange(kh), np.arange(kw), indexing="ij")
    offsets = (c * h * w + i * dh * w + j * dw).ravel()
    if masks_taps(spec):
        places, past_k = (i * kw + j).ravel(), kh * kw
    else:
        places, past_k = ((i * dh) << 16 | (j * dw)).ravel(), NO_TAP << 16
    table = np.zeros((k_slices(spec) * SLICE_DEPTH, 2), dtype=np.int32)
    table[:, 1] = past_k
    table[: offsets.size, 0] = offsets
    table[: offsets.size, 1] = places
    return table


def tiles_header_defines(spec: ConvSpec, splits: int) -> dict[str, int]:
    """The macros kernels/conv_implicit_tiles.cuh reads besides the shape's and the tile's: the K
    split, 16-byte weight rows (A_VEC) and pixel groups (B_VEC), the window test, the tap table's rows."""
    pointwise_vectors = is_pointwise(spec) and pixels(spec) % 4 == 0
    return dict(KSLICES=splits, A_VEC=4 if k_dim(spec) % 4 == 0 else 1, B_VEC=4 if pointwise_vectors else 1,
                TAP_MASK=int(masks_taps(spec)), KPAD=k_slices(spec) * SLICE_DEPTH)


def multiprocessors() -> int:
    try:
        return cuda.multiprocessor_count()
    except Exception:  # no CuPy or no device (the offline compile check): assume an H100
        return DEFAULT_SMS


def grid_blocks(spec: ConvSpec, tile: Tile) -> int:
    """Output tiles of the layer at its batch: the blocks of an unsplit grid."""
    return -(-columns(spec) // tile.bn) * -(-spec.out_channels // tile.bm)


def split_for(spec: ConvSpec, tile: Tile, sms: int) -> int:
    """Blocks to split K over so that the grid covers about the SMs, each keeping
    MIN_SLICES_PER_BLOCK slices; 1 when the output tiles alone are enough."""
    blocks = grid_blocks(spec, tile)
    split = 1
    while blocks * split < WAVE_SHARE * sms and split * 2 <= MAX_K_SPLITS and k_slices(spec) >= 2 * split * MIN_SLICES_PER_BLOCK:
        split *= 2
    return split


def wave_efficiency(blocks: int, slots: int) -> float:
    """The share of the SMs' block slots a grid keeps busy over all its waves."""
    return blocks / (-(-blocks // slots) * slots)


def balancing_split(spec: ConvSpec, tile: Tile, sms: int) -> int:
    """The fewest K splits from `split_for`'s on whose grid fills WAVE_BALANCE of the block
    slots in its last wave too (else `split_for`'s): a grid of 1.5 waves leaves a quarter of
    the GPU idle (ncu on ResNet 256->256 at batch 32, 128x64 tiles: 0.7 waves of two blocks
    per SM, 19% of the SMs' cycles idle)."""
    blocks = grid_blocks(spec, tile)
    slots = sms * tile.min_blocks
    least = split_for(spec, tile, sms)
    for split in range(least, MAX_K_SPLITS + 1):
        if k_slices(spec) < split * MIN_SLICES_PER_BLOCK:
            break
        if wave_efficiency(blocks * split, slots) >= WAVE_BALANCE:
            return split
    return least


class PipelinedTensorGemm(Family):
    """kernels/conv_tc_gemm.cu; `split` picks 3xTF32, `half` 1 FP16 and 2 BF16 operands."""

    split = True
    half = 0
    fuses = True  # bias, a residual Add and an activation; not the max pool
    tiles: dict[tuple[int, int], Any] = TILES  # (BM, BN) -> the tile its configured names give
    slice_depth = SLICE_DEPTH  # BK: the K splits are counted in these slices
    _NAME = re.compile(r"_(\d+)x(\d+)(?:_k(\d+))?")

    def owns(self, variant):
        return variant == self.name or (variant.startswith(self.name) and self._parse(variant) is not None)

    def _parse(self, variant: str) -> tuple[int, int, int] | None:
        match = self._NAME.fullmatch(variant[len(self.name) :])
        if not match:
            return None
        bm, bn, splits = match.groups()
        return int(bm), int(bn), int(splits or 1)

    def config_name(self, tile: Tile, splits: int) -> str:
        return f"{self.name}_{tile.bm}x{tile.bn}" + (f"_k{splits}" if splits > 1 else "")

    def configs(self, spec, epilogue=NONE):
        """Every tile, the heuristic's pick first (TILE_ORDER), each with the K split that
        fills the GPU, then with the split that balances its waves (`balancing_split`).

        With a short K, a smaller tile that fills the GPU unsplit goes first: splitting
        costs a second kernel that a few slices per block do not repay (the MNIST 32->64
        layer at batch 32 ran 1.5x faster on 32x64 tiles than on 64x128 split 4). A first
        tile whose grid is short of one block per slot goes first with its balancing
        split: on an H100 at batch 32 that ran ResNet 256->256 at 14x14 1.16x faster
        (128x64 split 4) and 512->512 at 7x7 1.19x (split 5 over split 2), while the grids
        of 1.5 waves (VGG 512->512 at 14x14, 128->128 at 28x28) ran 1.01-1.13x slower split."""
        sms = multiprocessors()
        order = list(next(tiles for least_maps, tiles in TILE_ORDER if spec.out_channels >= least_maps))
        if k_dim(spec) <= SHORT_K:
            unsplit = [t for t in order if split_for(spec, TILES[t], sms) == 1]
            order = unsplit[:1] + [t for t in order if t not in unsplit[:1]]
        names = [self.config_name(TILES[t], split_for(spec, TILES[t], sms)) for t in order]
        balanced = [self.config_name(TILES[t], balancing_split(spec, TILES[t], sms)) for t in order]
        first = TILES[order[0]]
        if grid_blocks(spec, first) * split_for(spec, first, sms) < sms * first.min_blocks:
            names.insert(0, balanced[0])
        return list(dict.fromkeys(names + balanced))

    def reason(self, spec, variant, epilogue):
        if spec.group != 1:
            return f"{self.name} implements group=1 only (this Conv has group={spec.group})"
        if epilogue.pool:
            return f"{self.name} fuses the bias, a residual Add and an activation, not a max pool"
        if k_slices(spec) * SLICE_DEPTH > TAP_TABLE_ROWS:
            return f"K = {k_dim(spec)} exceeds the {TAP_TABLE_ROWS}-row tap table in __constant__ memory"
        if spec.in_size[0] >= NO_TAP or spec.in_size[1] > 0xFFFF:
            return f"images of {spec.in_size} pixels are too large for the packed tap table"
        parsed = self._parse(variant)
        if parsed is None:
            return None if variant == self.name else f"{variant!r} is not a {self.name} configuration"
        bm, bn, splits = parsed
        if (bm, bn) not in self.tiles:
            return f"{variant}: the tiles are {', '.join(f'{a}x{b}' for a, b in self.tiles)}"
        slices = -(-k_dim(spec) // self.slice_depth)
        if not 1 <= splits <= min(MAX_K_SPLITS, slices):
            return f"{variant}: K has {slices} slices of {self.slice_depth}; split it 1 to {min(MAX_K_SPLITS, slices)} ways"
        return None

    def tile_and_split(self, spec: ConvSpec, variant: str) -> tuple[Any, int]:
        bm, bn, splits = self._parse(self.resolve(spec, variant))
        return self.tiles[(bm, bn)], splits

    def compile_units(self, spec, variant, epilogue=NONE):
        tile, splits = self.tile_and_split(spec, variant)
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, splits) | {
            "BM": tile.bm,
            "BN": tile.bn,
            "BK": SLICE_DEPTH,
            "WM": tile.wm,
            "WN": tile.wn,
            "STAGES": STAGES,
            "SPLIT": int(self.split),
            "HALF": self.half,
            "MIN_BLOCKS": tile.min_blocks,
        }
        units = [CompileUnit("conv_tc_gemm.cu", "conv_tc_gemm", defines)]
        if splits > 1:
            units.append(CompileUnit("conv_tc_gemm.cu", "conv_k_slices_reduce", defines))
        return units

    def build(self, spec, variant, weights, epilogue=NONE):
        tile, splits = self.tile_and_split(spec, variant)
        units = self.compile_units(spec, variant, epilogue)
        functions = load_functions(units, {"taps": tap_table(spec).view(np.float32)})
        return TensorGemmKernel(spec, self.config_name(tile, splits), functions, tile, splits, epilogue, split_operands=self.split)


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
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with one TF32 mma.sync per tile; "
        "relative L2 error ~3e-4, as cuDNN's TF32 mode"
    )
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class Fp16Gemm(ReducedPrecisionGemm):
    name = "tc_fp16"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with both operands rounded to FP16 and "
        "m16n8k16 MMAs accumulating in FP32; relative L2 error ~3e-4; inputs beyond FP16's range (65504) overflow"
    )
    half = 1
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class Bf16Gemm(ReducedPrecisionGemm):
    name = "tc_bf16"
    summary = (
        "tensor cores (opt-in, not exact, sm_80+): the tc_3xtf32 pipeline with both operands rounded to BF16 "
        "(FP32's range, 8-bit mantissa) and m16n8k16 MMAs accumulating in FP32; relative L2 error ~2e-3"
    )
    half = 2
    expected_relative_error = 2e-3
    max_relative_error = 1e-2


class TensorGemmKernel(ConvKernel):
    reads_weights = True
    residual_parameter = True

    @property
    def nonfinite_exact(self) -> bool:
        return not self.split_operands and super().nonfinite_exact

    def __init__(self, spec: ConvSpec, variant: str, functions, tile: Tile, splits: int, epilogue=NONE, *, split_operands: bool):
        super().__init__(spec, variant, functions, epilogue)
        self.split_operands = split_operands  # 3xTF32: an infinite input turns into NaN (see split_tf32 in the kernel)
        self.tile = tile
        self.splits = splits
        self._shared = tile.shared_bytes()
        self._gemm = functions[0]
        self._reduce = functions[1] if splits > 1 else None
        if self._shared > 48 * 1024:  # past the default, a kernel must ask for its dynamic shared memory
            self._gemm.max_dynamic_shared_size_bytes = self._shared
        # the 16-byte weight copies need W's rows 16-byte aligned
        self.weight_alignment = 16 if k_dim(spec) % 4 == 0 else 4
        self.alignment = 16 if is_pointwise(spec) else 4
        self._geometries: dict[int, tuple[tuple[int, int, int], int, int]] = {}

    def workspace_bytes(self, batch: int) -> int:
        return 4 * self.splits * self.spec.out_channels * columns(self.spec, batch) if self.splits > 1 else 0

    def _geometry(self, batch: int) -> tuple[tuple[int, int, int], int, int]:
        """(grid, workspace floats, reduce blocks) of a call at this batch, worked out once per batch."""
        known = self._geometries.get(batch)
        if known is not None:
            return known
        cols = columns(self.spec, batch)
        grid = (-(-cols // self.tile.bn), -(-self.spec.out_channels // self.tile.bm), self.splits)
        outputs = batch * self.spec.out_channels * pixels(self.spec)
        self._geometries[batch] = grid, self.workspace_bytes(batch) // 4, min(-(-outputs // REDUCE_BLOCK), 65535)
        return self._geometries[batch]

    def _launch(self, x: Any, weights: tuple, y: Any, batch: int) -> None:
        import cupy

        w, b, r = weights
        if w.data.ptr % self.weight_alignment:
            w = w.copy()
        grid, workspace, reduce_blocks = self._geometry(batch)
        partial = cupy.empty(workspace, dtype=cupy.float32) if self.splits > 1 else None
        target = np.uint64(0) if partial is None else partial
        self._gemm(grid, (self.tile.threads, 1, 1), (x, w, b, r, y, target, np.int32(batch)), shared_mem=self._shared)
        if partial is not None:
            self._reduce((reduce_blocks, 1, 1), (REDUCE_BLOCK, 1, 1), (partial, b, r, y, np.int32(batch)))


FAMILIES: list[Family] = [Split3xTf32Gemm(), Tf32Gemm(), Fp16Gemm(), Bf16Gemm()]
