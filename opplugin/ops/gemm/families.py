"""The CUDA families of Gemm, their configurations, limits and the heuristic choice.

Every kernel computes Y = epilogue(A W^T) with A batch x K and W N x K, both
K-contiguous (see kernel.py for how transA, transB, alpha, beta and C arrive in
that form). The shape (N, K), the tile or warp configuration and the epilogue
are compiled in through NVRTC -D macros; the batch is a kernel argument.

Each family has a frozen Config, its name made in the one grammar (ops/config_grammar.py):
- `gemv_w<MB>x<OPW>_k<WPR>` (kernels/gemm_gemv.cu): batch 1-16; a warp computes MB batch
  rows x OPW outputs over a WPR-th of K, the WPR warps of an output adding their sums.
- `tiled_b<BM>x<BN>x<BK>_t<TM>x<TN>` (kernels/gemm_tiled.cu): any batch; register micro-tiles
  from shared-memory tiles.
- `rowwarp_r<RW>` (kernels/gemm_rowwarp.cu): N <= 32, a warp per RW rows; the only
  family that fuses a row Softmax.
- `tc_3xtf32_b<BM>x<BN>x<BK>_w<WM>x<WN>_s<S>` (kernels/gemm_tc.cu): any batch, on the tensor
  cores: mma.sync in 3xTF32 (an error of FP32's order against float64) from tiles streamed
  through an S-stage cp.async pipeline. `tc_tf32_...` is the same with one TF32 MMA per tile:
  opt-in (~3e-4 relative error, as cuBLAS's TF32 mode), never picked by the heuristic.
- `wg_3xtf32_b<BM>x<BN>x<BK>_s<S>[_k<SPLITS>]` (kernels/gemm_wgmma.cu): the same 3xTF32 arithmetic on
  Hopper's wgmma (sm_90a alone), producer and consumer warpgroups; for grids that fill the GPU, with
  K split into runs (and their sums added in order by a second launch) where the tiles alone do not.

A family's plain name ("gemv") stands for the configuration the heuristic picks.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import config_grammar
from ...gpu import cuda
from ..activation import cuda_float
from ..config_grammar import Config, tagged
from .epilogue import NONE, GemmEpilogue
from .spec import BIAS_COLUMN, BIAS_FULL, BIAS_NONE, GemmSpec

SMS = 132  # streaming multiprocessors of an H100 SXM: what the block counts below aim to fill
MAX_GEMV_BATCH = 16  # past this, a weight load feeding every row costs more registers than it saves
MAX_ROWWARP_N = 32  # a lane per output of the row
GEMV_MAX_RESULTS = 32  # MB * OPW sums per warp: each reduced by its own shuffles
MIN_GEMV_WARPS = 1024  # about 8 per SM: fewer leave the memory system idle
MAX_GEMV_WARPS = 16384  # past this, with several rows a block, more warps only add A loads and partial sums
L2_RESIDENT_BYTES = 24 << 20  # weights up to this stay in an H100's 50 MB L2 between the blocks that read them
MAX_WPR = 16  # warps per output: one block holds them all, and past 512 threads the registers run short
GRID_Y_LIMIT = 65535
INT32_MAX = 2**31 - 1


BIAS_CODES = {BIAS_NONE: 0, BIAS_COLUMN: 1, BIAS_FULL: 2}


def effective_bias(spec: GemmSpec) -> str:
    """How C reaches the kernel: not at all when beta is 0 (onnxruntime then never reads C either)."""
    return BIAS_NONE if spec.beta == 0.0 else spec.bias


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class GemmConfig(Config):
    """What every Gemm family's Config gives the kernel: its source, -D macros, block size,
    grid, and how weight rows and columns are padded (rows to a multiple of row_pad, columns
    of col_pad)."""

    source = ""
    arch_specific = False  # compiled for "sm_90a" rather than "sm_90": uses wgmma

    @property
    def function(self) -> str:
        """The kernel's name in its source."""
        return f"gemm_{self.family}"

    @property
    def threads(self) -> int:
        raise NotImplementedError

    @property
    def row_pad(self) -> int:
        return 1

    @property
    def col_pad(self) -> int:
        return 4

    def defines(self, spec: GemmSpec) -> dict[str, int]:
        raise NotImplementedError

    def grid(self, spec: GemmSpec, batch: int) -> tuple[int, int, int]:
        raise NotImplementedError

    def max_batch(self) -> int:
        """The largest batch one launch covers (the grid's y limit)."""
        raise NotImplementedError


class BlockTiledConfig(GemmConfig):
    """A Config whose `block` field is BM rows x BN columns of Y x the K depth BK a block loads at a time:
    a block per tile of Y, the weights padded to whole tiles of BN rows and BK columns."""

    block: tuple[int, int, int]

    @property
    def row_pad(self) -> int:
        return self.block[1]

    @property
    def col_pad(self) -> int:
        return self.block[2]

    def grid(self, spec, batch):
        bm, bn, _ = self.block
        return (-(-spec.n // bn), -(-batch // bm), 1)

    def max_batch(self):
        return GRID_Y_LIMIT * self.block[0]


@dataclass(frozen=True)
class GemvConfig(GemmConfig):
    warp: tuple[int, int] = tagged("w", 2)  # MB batch rows x OPW outputs
    splits: int = tagged("k")  # WPR: warps per output, each over a slice of K
    source = "gemm_gemv.cu"

    @property
    def mb(self) -> int:
        return self.warp[0]

    @property
    def opw(self) -> int:
        return self.warp[1]

    @property
    def warps(self) -> int:
        return max(8, self.splits)  # 256 threads, or one output's warps when more

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def row_pad(self) -> int:
        return self.opw * (self.warps // self.splits)

    def defines(self, spec):
        return {"MB": self.mb, "OPW": self.opw, "WPR": self.splits, "WARPS": self.warps, "KP": round_up(spec.k, 4)}

    def grid(self, spec, batch):
        per_block = self.opw * (self.warps // self.splits)
        return (-(-spec.n // per_block), -(-batch // self.mb), 1)

    def max_batch(self):
        return GRID_Y_LIMIT * self.mb


@dataclass(frozen=True)
class TiledConfig(BlockTiledConfig):
    block: tuple[int, int, int] = tagged("b", 3)  # BM x BN x BK
    thread: tuple[int, int] = tagged("t", 2)  # TM x TN
    source = "gemm_tiled.cu"

    @property
    def threads(self) -> int:
        (bm, bn, _), (tm, tn) = self.block, self.thread
        return (bm // tm) * (bn // tn)

    def defines(self, spec):
        (bm, bn, bk), (tm, tn) = self.block, self.thread
        return {"BM": bm, "BN": bn, "TM": tm, "TN": tn, "BK": bk, "KP": round_up(spec.k, bk)}


@dataclass(frozen=True)
class RowwarpConfig(GemmConfig):
    rows: int = tagged("r")  # RW: rows of Y per warp
    source = "gemm_rowwarp.cu"
    warps = 8

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def col_pad(self) -> int:
        return 1

    def defines(self, spec):
        return {"RW": self.rows, "WARPS": self.warps}

    def grid(self, spec, batch):
        return (-(-batch // (self.rows * self.warps)), 1, 1)

    def max_batch(self):
        return INT32_MAX // 32


@dataclass(frozen=True)
class TensorConfig(BlockTiledConfig):
    block: tuple[int, int, int] = tagged("b", 3)  # BM x BN x BK
    warp: tuple[int, int] = tagged("w", 2)  # WM x WN: a multiple of 16 rows, of 8 columns
    stages: int = tagged("s")
    source = "gemm_tc.cu"
    function = "gemm_tc"

    @property
    def split(self) -> bool:
        """3xTF32 (exact to FP32's order) rather than one TF32 MMA."""
        return self.family == "tc_3xtf32"

    @property
    def threads(self) -> int:
        (bm, bn, _), (wm, wn) = self.block, self.warp
        return (bm // wm) * (bn // wn) * 32

    @property
    def min_blocks(self) -> int:
        """One block of 256 threads, or two of 128, leave each thread up to 255 registers."""
        return 1 if self.threads >= 256 else 2

    def shared_bytes(self) -> int:
        bm, bn, bk = self.block
        return self.stages * (bm + bn) * (bk + 4) * 4

    def defines(self, spec):
        (bm, bn, bk), (wm, wn) = self.block, self.warp
        return {"BM": bm, "BN": bn, "BK": bk, "WM": wm, "WN": wn, "STAGES": self.stages, "SPLIT": int(self.split),
                "MIN_BLOCKS": self.min_blocks, "KP": round_up(spec.k, bk)}


# wg's operand formats: the 3xTF32 family's FP32 values with their small parts; the opt-in half-precision
# families' FP16 or BF16 values (HALF_OPERANDS), two bytes each, a slice's 128-byte line holding 64
HALF_FORMATS = {"wg_fp16": 1, "wg_bf16": 2}


@dataclass(frozen=True)
class WgmmaConfig(BlockTiledConfig):
    block: tuple[int, int, int] = tagged("b", 3)  # BM rows (64 a consumer warpgroup) x BN columns (64 or 128) x BK
    stages: int = tagged("s")
    splits: int = tagged("k", default=1)  # K split into runs, each a block; gemm_split_reduce adds them in order
    source = "gemm_wgmma.cu"
    function = "gemm_wgmma"
    arch_specific = True

    @property
    def threads(self) -> int:
        """A consumer warpgroup per 64 rows, as many producer threads."""
        return 4 * self.block[0]

    @property
    def half(self) -> bool:
        """Operands in FP16 or BF16 (wg_fp16, wg_bf16), not FP32 with small parts."""
        return self.family in HALF_FORMATS

    @property
    def depth(self) -> int:
        """BK: the values of a slice's 128-byte line."""
        return HALF_DEPTH if self.half else TENSOR_DEPTH

    def shared_bytes(self) -> int:
        """The stages (weights and data, with their small parts in 3xTF32), two mbarriers a stage, 1024 bytes to
        align the swizzle."""
        bm, bn, bk = self.block
        per_value = 2 if self.half else 2 * 4  # a half; a float and its small part
        return self.stages * (bm + bn) * bk * per_value + self.stages * 16 + 1024

    def defines(self, spec):
        bm, bn, bk = self.block
        half = {"HALF_OPERANDS": HALF_FORMATS[self.family]} if self.half else {}
        return {"BM": bm, "BN": bn, "BK": bk, "STAGES": self.stages, "KP": round_up(spec.k, bk), "SPLITS": self.splits} | half

    def grid(self, spec, batch):
        """A K split's grid: a block per tile and run of slices. Unsplit, persistent: a block an SM, each taking
        every SM-th tile, so that its producers copy the next tile's first slices during this one's epilogue."""
        columns, rows, _ = super().grid(spec, batch)
        if self.splits > 1:
            return (columns, rows, self.splits)
        return (min(columns * rows, cuda.multiprocessor_count()), 1, 1)


# wg's block tiles, rows x columns, most rows first; three stages of 128 x 128 take 197 KB of shared memory
WGMMA_TILES = ((128, 128), (128, 64), (64, 128), (64, 64))
WGMMA_STAGES = 3
# the half-precision families' stages (32 KB each at 128 x 128): 3% faster than three at ViT's b32 shapes on an
# H200 (ViT-S QKV 30.6 against 31.5 us, MLP out 52.5 against 53.5), five or six no faster again
WGMMA_HALF_STAGES = 4
MAX_SHARED_BYTES = 227 << 10  # a block's dynamic shared memory on Hopper
HOPPER = "sm_90"  # the one architecture wgmma's code (sm_90a) runs on


def wgmma_runs_here() -> bool:
    """Whether the current GPU runs wgmma; True without a device (offline compiles)."""
    return not cuda.is_available() or cuda.device_arch() == HOPPER


# tc's block tiles and each one's warp tile: 64x32, 32x64 or 32x32 a warp, 64 or 32 accumulators
# a lane and as many for a slice's partial sums (the Conv family's measured limits); BK 32 is four
# m16n8k8 steps a stage
TENSOR_TILES = {
    (128, 128): (64, 32),
    (128, 64): (64, 32),
    (64, 128): (32, 64),
    (64, 64): (32, 32),
    (32, 64): (32, 16),
}
TENSOR_DEPTH = 32
HALF_DEPTH = 64  # wg_fp16's and wg_bf16's BK: 64 two-byte values a 128-byte line
TENSOR_STAGES = 3

# tiled's tiles: BM x BN, its micro-tile and K step; BK makes each thread load whole float4s of both tiles
TILES = [TiledConfig("tiled", block, thread) for block, thread in (
    ((128, 128, 8), (8, 8)), ((128, 64, 16), (8, 4)), ((64, 64, 16), (4, 4)), ((64, 32, 16), (4, 4)), ((32, 32, 16), (4, 4)),
)]


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def gemv_default(spec: GemmSpec) -> GemvConfig:
    """(MB, OPW, WPR) for this node, from a sweep of every configuration on an H100
    (bench --suite gemm --all-configs, batches 1 and 16, the six seed layers):

    - MB covers the batch, but only 4 rows a block where the weights fit in L2: they are
      then read from DRAM once and from L2 by the other blocks, and four blocks in place of
      one per output quarter the A loads each warp makes (3-7x faster at batch 16 there).
      Weights larger than L2 are read once, by blocks of 16 rows (b16o2w8: 1.3x cuBLAS).
    - Two outputs per warp with several rows: each A load then feeds two weight rows.
    - As many warps per output as give each lane at least one float4 of K (up to 16): at
      batch 1 the most warps in flight won on every layer; with rows per block, at most
      16,384 warps in all and 8 a block where 32 sums fill the registers.
    - Fewer rows a block while that leaves under 1,024 warps (a narrow layer)."""
    mb = min(MAX_GEMV_BATCH, _power_of_two_at_least(max(1, spec.m)))
    if 4 * spec.n * spec.k <= L2_RESIDENT_BYTES:
        mb = min(mb, 4)
    while True:
        opw = 2 if mb >= 2 and spec.n >= 2 else 1
        wpr = MAX_WPR
        while wpr > 1 and (spec.k < wpr * 128 or (mb * opw > 16 and wpr > 8)
                           or (mb > 1 and -(-spec.n // opw) * wpr * -(-spec.m // mb) > MAX_GEMV_WARPS)):
            wpr //= 2
        if mb == 1 or -(-spec.n // opw) * wpr * -(-spec.m // mb) >= MIN_GEMV_WARPS:
            return GemvConfig("gemv", (mb, opw), wpr)
        mb //= 2


def tiled_default(spec: GemmSpec) -> TiledConfig:
    """The largest tile that still gives two blocks per SM, not wider than N needs."""
    widest = max(32, _power_of_two_at_least(spec.n))
    fits = [t for t in TILES if t.block[1] <= widest]
    for tile in fits:
        bm, bn, _ = tile.block
        if -(-spec.m // bm) * -(-spec.n // bn) >= 2 * SMS:
            return tile
    return fits[-1]


def tensor_default(spec: GemmSpec, family: str = "tc_3xtf32") -> TensorConfig:
    """The largest block tile (most rows first) that still gives a block per SM, not wider than N
    needs; else the smallest."""
    widest = max(64, _power_of_two_at_least(spec.n))
    fits = [tile for tile in TENSOR_TILES if tile[1] <= widest]
    chosen = next((tile for tile in fits if -(-spec.m // tile[0]) * -(-spec.n // tile[1]) >= SMS), fits[-1])
    return TensorConfig(family, (*chosen, TENSOR_DEPTH), TENSOR_TILES[chosen], TENSOR_STAGES)


def wgmma_default(spec: GemmSpec, family: str = "wg_3xtf32") -> WgmmaConfig:
    """The first tile (most rows, then columns not wider than N needs) whose grid fills every SM once;
    where even the smallest does not, K split as wgmma_splits finds fastest (3xTF32's cost model: the
    half-precision families take it as it is, not yet measured)."""
    depth = HALF_DEPTH if family in HALF_FORMATS else TENSOR_DEPTH
    fits = [tile for tile in WGMMA_TILES if tile[1] <= max(64, _power_of_two_at_least(spec.n))]
    blocks = {tile: -(-spec.m // tile[0]) * -(-spec.n // tile[1]) for tile in fits}
    chosen = next((tile for tile in fits if blocks[tile] >= SMS), fits[-1])
    splits = wgmma_splits(spec, blocks[chosen], depth) if blocks[chosen] < SMS else 1
    return WgmmaConfig(family, (*chosen, depth), WGMMA_HALF_STAGES if family in HALF_FORMATS else WGMMA_STAGES, splits)


# wg_3xtf32's time on an H200 at batch-1 transformer shapes (bench --suite gemm --all-configs, 197 and 49
# rows), in units of one K slice's time for a wave of blocks (~0.55 us; a block per SM: 232 registers a
# consumer thread): a fixed 4 us (launches, the small parts' pass, the pipeline's fill), waves of blocks x
# slices a block walks, plus, for a K split, the reduce's launch (~3 us) and its pass over the split's
# partial sums (~2 TB/s, written once and read once). It predicts 24 of the 25 timed (shape, split) pairs
# within 15% (ViT-S's MLP out split in 4: 23% under).
FIXED_US = 4.0
SLICE_US = 0.55
REDUCE_US = 3.0
PARTIAL_BYTES_PER_US = 2e6
MAX_SPLITS = 16


def k_slices(spec: GemmSpec, depth: int = TENSOR_DEPTH) -> int:
    """The `depth`-deep slices a tensor-core family walks K in."""
    return -(-spec.k // depth)


def splits_fill(slices: int, splits: int) -> bool:
    """Whether `slices` split into `splits` runs of equal length (the last shorter) leave no run empty."""
    return 1 <= splits <= slices and (splits - 1) * -(-slices // splits) < slices


def wgmma_splits(spec: GemmSpec, blocks: int, depth: int = TENSOR_DEPTH) -> int:
    """The K split the cost model above finds fastest for `blocks` tiles (fewest runs on a tie), every
    run non-empty."""
    slices = k_slices(spec, depth)

    def cost(splits: int) -> float:
        per_run = -(-slices // splits)
        waves = -(-blocks * splits // SMS)
        reduce = REDUCE_US + 8 * splits * spec.m * spec.n / PARTIAL_BYTES_PER_US if splits > 1 else 0.0
        return FIXED_US + waves * per_run * SLICE_US + reduce

    valid = [splits for splits in range(1, min(MAX_SPLITS, slices) + 1) if splits_fill(slices, splits)]
    return min(valid, key=lambda splits: (cost(splits), splits))


def rowwarp_default(spec: GemmSpec) -> RowwarpConfig:
    """Rows per warp: up to 4 (each W load feeds them all) while RW x N sums stay within 64 registers."""
    return RowwarpConfig("rowwarp", max(1, min(4, 64 // max(1, spec.n))))


FAMILIES = {
    "gemv": "batch 1-16: warps per output row block, shuffle reduction, float4 streaming weight loads feeding every batch row",
    "tiled": "large batches: BM x BN tiles staged in shared memory, register micro-tiles",
    "rowwarp": "N <= 32 (classifier heads): a warp per rows of Y, row Softmax fused in registers",
    "tc_3xtf32": "large batches on the tensor cores, FP32-exact by measurement: each operand split into big + small "
                 "TF32 parts (three mma.sync per tile), tiles streamed through a cp.async pipeline",
    "tc_tf32": "tc_3xtf32 with one TF32 mma.sync per tile (opt-in, ~3e-4 relative error, as cuBLAS's TF32 mode)",
    "wg_3xtf32": "large batches on Hopper (sm_90a): tc_3xtf32's arithmetic on wgmma, producer warpgroups copying "
                 "through a cp.async and mbarrier pipeline, consumer warpgroups multiplying; K a multiple of 4",
    "wg_fp16": "wg_3xtf32's pipeline on FP16 operands (A converted before each call, W at build), one wgmma a k16 step, "
               "FP32 sums (opt-in, not FP32-exact: ~5e-4 relative a product); K a multiple of 8",
    "wg_bf16": "wg_fp16 in BF16 (opt-in, ~4e-3 relative a product, FP32's range)",
}
CONFIGS: dict[str, type[GemmConfig]] = {"gemv": GemvConfig, "tiled": TiledConfig, "rowwarp": RowwarpConfig,
                                        "tc_3xtf32": TensorConfig, "tc_tf32": TensorConfig, "wg_3xtf32": WgmmaConfig,
                                        "wg_fp16": WgmmaConfig, "wg_bf16": WgmmaConfig}
DEFAULTS = {"gemv": gemv_default, "tiled": tiled_default, "rowwarp": rowwarp_default,
            "tc_3xtf32": tensor_default, "tc_tf32": lambda spec: tensor_default(spec, "tc_tf32"), "wg_3xtf32": wgmma_default,
            "wg_fp16": lambda spec: wgmma_default(spec, "wg_fp16"), "wg_bf16": lambda spec: wgmma_default(spec, "wg_bf16")}
# the family that runs a flat product in each reduced precision of a run's --precision (its operands rounded to
# the format, FP32 sums), and the other way round
PRECISION_FAMILIES = {"tf32": "tc_tf32", "fp16": "wg_fp16", "bf16": "wg_bf16"}
FAMILY_PRECISIONS = {family: precision for precision, family in PRECISION_FAMILIES.items()}
SIMT_FAMILIES = ("gemv", "tiled", "rowwarp")  # FP32 FMAs
EXACT_FAMILIES = (*SIMT_FAMILIES, "tc_3xtf32", "wg_3xtf32")  # the heuristic's and the tuner's choice; tc_tf32 is opt-in


def configure(spec: GemmSpec, variant: str) -> GemmConfig:
    """The Config a variant name stands for on this node (parsed here, where names come in);
    a family name gets the heuristic's configuration."""
    family, config = config_grammar.parse(variant, CONFIGS, "Gemm")
    return DEFAULTS[family](spec) if config is None else config


def unsupported_reason(spec: GemmSpec, config: GemmConfig, epilogue: GemmEpilogue = NONE, *, this_gpu: bool = True) -> str | None:
    """None when the configuration can run this node with this epilogue, else why. `this_gpu`: on this machine's
    GPU too (False: on the GPU its family is written for, as the CPU device's emulation of a precision asks)."""
    if spec.m * max(spec.n, spec.k) > INT32_MAX or spec.n * spec.k > INT32_MAX:
        return "the operands exceed 32-bit indexing"
    if epilogue.softmax and config.family != "rowwarp":
        return f"{config.family} does not fuse a row Softmax (rowwarp does, for N <= {MAX_ROWWARP_N})"
    if epilogue.residual and not isinstance(config, WgmmaConfig):
        return f"{config.family} does not add a residual in its epilogue (wg_3xtf32 does)"
    if isinstance(config, GemvConfig):
        mb, opw = config.warp
        if mb < 1 or mb > MAX_GEMV_BATCH or opw < 1 or mb * opw > GEMV_MAX_RESULTS:
            return f"{config}: MB x OPW must be within 1..{GEMV_MAX_RESULTS} and MB at most {MAX_GEMV_BATCH}"
        if config.splits not in (1, 2, 4, 8, 16):
            return f"{config}: WPR must be a power of two up to 16 (a block of at most 512 threads)"
        if mb * opw > 16 and config.warps > 8:
            return f"{config}: {mb * opw} sums a warp in blocks of {config.warps} warps would spill; at most 8 warps"
    if isinstance(config, TiledConfig) and config not in TILES:
        return f"{config}: the tiles are {', '.join(t.name() for t in TILES)}"
    if isinstance(config, TensorConfig):
        tile = config.block[:2]
        if tile not in TENSOR_TILES or config.warp != TENSOR_TILES[tile] or config.block[2] != TENSOR_DEPTH:
            return f"{config}: the tiles are {', '.join(TensorConfig(config.family, (*t, TENSOR_DEPTH), w, 3).name() for t, w in TENSOR_TILES.items())} (any stage count 2..4)"
        if not 2 <= config.stages <= 4:
            return f"{config}: 2 to 4 stages"
    if isinstance(config, WgmmaConfig):
        depth, quad = config.depth, 8 if config.half else 4  # values in a 16-byte copy
        if config.block[:2] not in WGMMA_TILES or config.block[2] != depth:
            return f"{config}: the tiles are {', '.join(WgmmaConfig(config.family, (*t, depth), WGMMA_STAGES).name() for t in WGMMA_TILES)}"
        if config.stages < 2 or config.shared_bytes() > MAX_SHARED_BYTES:
            return f"{config}: at least 2 stages, within {MAX_SHARED_BYTES >> 10} KB of shared memory"
        if spec.k % quad:
            return f"{config.family} copies A's rows in 16-byte quads: K must be a multiple of {quad}, not {spec.k}"
        if not splits_fill(k_slices(spec, depth), config.splits):
            return f"{config}: K's {k_slices(spec, depth)} slices of {depth} do not split into {config.splits} non-empty runs"
        if this_gpu and not wgmma_runs_here():
            return f"{config.family} needs an sm_90 GPU (wgmma); this one is {cuda.device_arch()}"
    if isinstance(config, RowwarpConfig):
        if spec.n > MAX_ROWWARP_N:
            return f"rowwarp needs N <= {MAX_ROWWARP_N} (a lane per output); this Gemm has N = {spec.n}"
        if not 1 <= config.rows <= 8:
            return f"{config}: RW must be 1..8"
    return None


def heuristic_config(spec: GemmSpec, epilogue: GemmEpilogue = NONE, tensor_cores: bool = True) -> GemmConfig:
    """gemv for batch <= 16, rowwarp for narrow outputs (and wherever a Softmax is fused), else the
    tensor cores in 3xTF32: on wgmma where it runs (Hopper, K a multiple of 4), its K split where the
    tiles alone leave SMs idle, else on mma.sync (or, without `tensor_cores`, tiled FP32 FMAs). wgmma,
    split or not, beat mma.sync on every batch-1 transformer shape timed, filling the GPU or not
    (197 and 49 rows: 11.7 against 12.4 us on ViT-S's QKV; 32.2 against 40.9 on its MLP out, 17.2 split in six)."""
    if epilogue.softmax or (spec.n <= MAX_ROWWARP_N and spec.m > MAX_GEMV_BATCH):
        return rowwarp_default(spec)
    if spec.m <= MAX_GEMV_BATCH:
        return gemv_default(spec)
    if not tensor_cores:
        return tiled_default(spec)
    hopper = wgmma_default(spec)
    if unsupported_reason(spec, hopper, epilogue) is None:
        return hopper
    return tensor_default(spec)


def defines(spec: GemmSpec, config: GemmConfig, epilogue: GemmEpilogue) -> dict:
    """Every -D macro of this configuration on this node."""
    return {
        "N": spec.n,
        "K": spec.k,
        "HAS_ALPHA": int(spec.alpha != 1.0),
        "ALPHA": cuda_float(spec.alpha),
        "BIAS": BIAS_CODES[effective_bias(spec)],
        **config.defines(spec),
        **epilogue.defines(),
    }
