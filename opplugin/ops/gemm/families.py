"""The CUDA families of Gemm, their configurations, limits and the heuristic choice.

Every kernel computes Y = epilogue(A W^T) with A batch x K and W N x K, both
K-contiguous (see kernel.py for how transA, transB, alpha, beta and C arrive in
that form). The shape (N, K), the tile or warp configuration and the epilogue
are compiled in through NVRTC -D macros; the batch is a kernel argument.

- `gemv_b<MB>o<OPW>w<WPR>` (kernels/gemm_gemv.cu): batch 1-16; MB batch rows per
  block, OPW outputs per warp, WPR warps per output.
- `tiled_<BM>x<BN>` (kernels/gemm_tiled.cu): any batch; register micro-tiles from
  shared-memory tiles.
- `rowwarp_r<RW>` (kernels/gemm_rowwarp.cu): N <= 32, a warp per RW rows; the only
  family that fuses a row Softmax.

A family's plain name ("gemv") stands for the configuration the heuristic picks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import PluginError
from ..activation import cuda_float
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


@dataclass(frozen=True)
class Tile:
    bm: int
    bn: int
    tm: int
    tn: int
    bk: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)


# tiled_<BM>x<BN> -> its micro-tile and K step; BK makes each thread load whole float4s of both tiles
TILES = {(t.bm, t.bn): t for t in (
    Tile(128, 128, 8, 8, 8), Tile(128, 64, 8, 4, 16), Tile(64, 64, 4, 4, 16), Tile(64, 32, 4, 4, 16), Tile(32, 32, 4, 4, 16),
)}


@dataclass(frozen=True)
class Config:
    """One configured variant: its family, kernels/ source and function, its -D macros, block size,
    and how weight rows and columns are padded (rows to a multiple of row_pad, columns of col_pad)."""

    family: str
    name: str
    source: str
    defines: dict
    threads: int
    row_pad: int = 1
    col_pad: int = 4

    def grid(self, spec: GemmSpec, batch: int) -> tuple[int, int, int]:
        d = self.defines
        if self.family == "gemv":
            per_block = d["OPW"] * (d["WARPS"] // d["WPR"])
            return (-(-spec.n // per_block), -(-batch // d["MB"]), 1)
        if self.family == "tiled":
            return (-(-spec.n // d["BN"]), -(-batch // d["BM"]), 1)
        return (-(-batch // (d["RW"] * d["WARPS"])), 1, 1)

    def max_batch(self) -> int:
        """The largest batch one launch covers (the grid's y limit)."""
        d = self.defines
        if self.family == "gemv":
            return GRID_Y_LIMIT * d["MB"]
        if self.family == "tiled":
            return GRID_Y_LIMIT * d["BM"]
        return INT32_MAX // 32


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def gemv_config(spec: GemmSpec, mb: int, opw: int, wpr: int) -> Config:
    warps = max(8, wpr)  # 256 threads, or one output's warps when more
    defines = {"MB": mb, "OPW": opw, "WPR": wpr, "WARPS": warps, "KP": round_up(spec.k, 4)}
    return Config("gemv", f"gemv_b{mb}o{opw}w{wpr}", "gemm_gemv.cu", defines, 32 * warps,
                  row_pad=opw * (warps // wpr), col_pad=4)


def gemv_default(spec: GemmSpec) -> tuple[int, int, int]:
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
            return mb, opw, wpr
        mb //= 2


def tiled_config(spec: GemmSpec, tile: Tile) -> Config:
    defines = {"BM": tile.bm, "BN": tile.bn, "TM": tile.tm, "TN": tile.tn, "BK": tile.bk, "KP": round_up(spec.k, tile.bk)}
    return Config("tiled", f"tiled_{tile.bm}x{tile.bn}", "gemm_tiled.cu", defines, tile.threads, row_pad=tile.bn, col_pad=tile.bk)


def tiled_default(spec: GemmSpec) -> Tile:
    """The largest tile that still gives two blocks per SM, not wider than N needs."""
    widest = max(32, _power_of_two_at_least(spec.n))
    fits = [t for t in TILES.values() if t.bn <= widest]
    for tile in fits:
        if -(-spec.m // tile.bm) * -(-spec.n // tile.bn) >= 2 * SMS:
            return tile
    return fits[-1]


def rowwarp_config(spec: GemmSpec, rw: int) -> Config:
    return Config("rowwarp", f"rowwarp_r{rw}", "gemm_rowwarp.cu", {"RW": rw, "WARPS": 8}, 256, col_pad=1)


def rowwarp_default(spec: GemmSpec) -> int:
    """Rows per warp: up to 4 (each W load feeds them all) while RW x N sums stay within 64 registers."""
    return max(1, min(4, 64 // max(1, spec.n)))


FAMILIES = {
    "gemv": "batch 1-16: warps per output row block, shuffle reduction, float4 streaming weight loads feeding every batch row",
    "tiled": "large batches: BM x BN tiles staged in shared memory, register micro-tiles",
    "rowwarp": "N <= 32 (classifier heads): a warp per rows of Y, row Softmax fused in registers",
}
_PATTERNS = {
    "gemv": re.compile(r"gemv_b(\d+)o(\d+)w(\d+)"),
    "tiled": re.compile(r"tiled_(\d+)x(\d+)"),
    "rowwarp": re.compile(r"rowwarp_r(\d+)"),
}


def configure(spec: GemmSpec, variant: str) -> Config:
    """The Config a variant name stands for on this node; a family name gets the heuristic's configuration."""
    if variant == "gemv":
        return gemv_config(spec, *gemv_default(spec))
    if variant == "tiled":
        return tiled_config(spec, tiled_default(spec))
    if variant == "rowwarp":
        return rowwarp_config(spec, rowwarp_default(spec))
    for family, pattern in _PATTERNS.items():
        match = pattern.fullmatch(variant)
        if match:
            numbers = [int(g) for g in match.groups()]
            if family == "gemv":
                return gemv_config(spec, *numbers)
            if family == "tiled":
                tile = TILES.get((numbers[0], numbers[1]))
                if tile is None:
                    raise PluginError(f"unknown Gemm tile {variant!r}; tiles: {', '.join(f'tiled_{t.bm}x{t.bn}' for t in TILES.values())}")
                return tiled_config(spec, tile)
            return rowwarp_config(spec, numbers[0])
    raise PluginError(f"unknown Gemm variant {variant!r}; choose from {', '.join(FAMILIES)} (or a configured name such as gemv_b1o1w4)")


def unsupported_reason(spec: GemmSpec, config: Config, epilogue: GemmEpilogue = NONE) -> str | None:
    """None when the configuration can run this node with this epilogue, else why."""
    d = config.defines
    if spec.m * max(spec.n, spec.k) > INT32_MAX or spec.n * spec.k > INT32_MAX:
        return "the operands exceed 32-bit indexing"
    if epilogue.softmax and config.family != "rowwarp":
        return f"{config.family} does not fuse a row Softmax (rowwarp does, for N <= {MAX_ROWWARP_N})"
    if config.family == "gemv":
        if d["MB"] < 1 or d["MB"] > MAX_GEMV_BATCH or d["OPW"] < 1 or d["MB"] * d["OPW"] > GEMV_MAX_RESULTS:
            return f"{config.name}: MB x OPW must be within 1..{GEMV_MAX_RESULTS} and MB at most {MAX_GEMV_BATCH}"
        if d["WPR"] not in (1, 2, 4, 8, 16):
            return f"{config.name}: WPR must be a power of two up to 16 (a block of at most 512 threads)"
        if d["MB"] * d["OPW"] > 16 and d["WARPS"] > 8:
            return f"{config.name}: {d['MB'] * d['OPW']} sums a warp in blocks of {d['WARPS']} warps would spill; at most 8 warps"
    if config.family == "rowwarp":
        if spec.n > MAX_ROWWARP_N:
            return f"rowwarp needs N <= {MAX_ROWWARP_N} (a lane per output); this Gemm has N = {spec.n}"
        if not 1 <= d["RW"] <= 8:
            return f"{config.name}: RW must be 1..8"
    return None


def heuristic_variant(spec: GemmSpec, epilogue: GemmEpilogue = NONE) -> str:
    """gemv for batch <= 16, rowwarp for narrow outputs (and wherever a Softmax is fused), else tiled."""
    if epilogue.softmax or (spec.n <= MAX_ROWWARP_N and spec.m > MAX_GEMV_BATCH):
        return configure(spec, "rowwarp").name
    if spec.m <= MAX_GEMV_BATCH:
        return configure(spec, "gemv").name
    return configure(spec, "tiled").name


def defines(spec: GemmSpec, config: Config, epilogue: GemmEpilogue) -> dict:
    """Every -D macro of this configuration on this node."""
    return {
        "N": spec.n,
        "K": spec.k,
        "HAS_ALPHA": int(spec.alpha != 1.0),
        "ALPHA": cuda_float(spec.alpha),
        "BIAS": BIAS_CODES[effective_bias(spec)],
        **config.defines,
        **epilogue.defines(),
    }
