"""The GEMM formulations of Conv: per group, Y[MG x cols] = W[MG x K] * X[K x cols],
K = C/G*KH*KW and one column per output pixel of the batch.

`im2col_gemm_b<BM>x<BN>x<BK>_t<TM>x<TN>` writes X to a global-memory workspace
(kernels/conv_im2col.cu), a chunk of images at a time, and multiplies it tile by tile
(kernels/conv_gemm.cu); `implicit_gemm_b<BM>x<BN>x<BK>_t<TM>x<TN>` gathers X's elements
from the input while loading the tiles, so X never exists in memory. Both read the
weights at call time, so they serve constant and run-time weights alike, and neither
fuses an epilogue.

A block computes BM maps x BN output pixels with 256 threads, TM x TN each, stepping
through K by BK; the configurations offered take the thread tile that BM and BN give
256 threads and the K step that suits the node's K: see `gemm_config`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ....gpu import cuda
from ...config_grammar import tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import BLOCK, BlockTiledConfig, CompileUnit, ConvKernel, Family, shape_defines

THREADS = BLOCK  # threads per GEMM block
SHARED_FLOATS = 48 * 1024 // 4  # static shared memory of one block: the BK x (BM + BN) tiles
MAX_K_STEP = 16
K_STEP_OVERHEAD = 4  # the cost of one K step (two barriers, a loop turn) in multiply-add rows
MAX_PER_THREAD = 64  # accumulators per thread; past this ptxas spills
MAX_PREFETCH = 20  # next-tile input values a thread holds in registers while it multiplies
MIN_K_STEP = 4  # the default tiles skip a tile whose K step would be shorter (a barrier pair per few rows)
MAX_TILE_SIDE = 4096
GRID_YZ_LIMIT = 65535
WORKSPACE_BUDGET = 256 * 2**20  # bytes of unrolled input one im2col_gemm call allocates at most
FREE_MEMORY_SHARE = 4  # ... and never more than this fraction of the free device memory


@dataclass(frozen=True)
class GemmConfig(BlockTiledConfig):
    """BM x BN outputs per block, BK the K step, TM x TN outputs per thread."""

    block: tuple[int, int, int] = tagged("b", 3)  # BM x BN x BK
    thread: tuple[int, int] = tagged("t", 2)  # TM x TN

    @property
    def threads(self) -> int:
        return (self.bm // self.thread[0]) * (self.bn // self.thread[1])

    def defines(self) -> dict[str, int]:
        (bm, bn, bk), (tm, tn) = self.block, self.thread
        return {"BM": bm, "BN": bn, "BK": bk, "TM": tm, "TN": tn}

    def grid(self, spec: ConvSpec, cols: int) -> tuple[int, int, int]:
        maps = spec.out_channels // spec.group
        return (-(-cols // self.bn), -(-maps // self.bm), spec.group)


def k_dim(spec: ConvSpec) -> int:
    return (spec.in_channels // spec.group) * math.prod(spec.kernel)


def pixels(spec: ConvSpec) -> int:
    return math.prod(spec.out_size)


def thread_tile(bm: int, bn: int) -> tuple[int, int]:
    """TM x TN for 256 threads: 4 maps per thread, 8 once a thread has 32 outputs or more."""
    per_thread = bm * bn // THREADS
    tm = min(bm, 8 if per_thread >= 32 else 4, per_thread)
    return tm, per_thread // tm


def k_step_limit(k: int, bm: int, bn: int) -> int:
    """The longest K step within shared memory and the prefetch registers (and K)."""
    return max(1, min(MAX_K_STEP, SHARED_FLOATS // (bm + bn), MAX_PREFETCH * THREADS // bn, k))


def k_step(k: int, bm: int, bn: int) -> int:
    """The K step: the fewest multiply-add rows counting the zero-padded tail and
    each step's overhead, within `k_step_limit`; the larger step on a tie."""
    return min(range(1, k_step_limit(k, bm, bn) + 1), key=lambda bk: (-(-k // bk) * (bk + K_STEP_OVERHEAD), -bk))


def tile_reason(spec: ConvSpec, bm: int, bn: int) -> str | None:
    """Why a BM x BN tile cannot run this node; None if it can."""
    if bm < 1 or bn < 1 or bm & (bm - 1) or bn & (bn - 1) or max(bm, bn) > MAX_TILE_SIDE:
        return f"a {bm}x{bn} tile: both sides must be powers of 2 up to {MAX_TILE_SIDE}"
    per_thread = bm * bn // THREADS
    if bm * bn % THREADS or per_thread > MAX_PER_THREAD:
        return (
            f"a {bm}x{bn} tile gives {bm * bn / THREADS:g} outputs to each of {THREADS} threads; "
            f"it must be a whole number up to {MAX_PER_THREAD}"
        )
    if bm + bn > SHARED_FLOATS:
        return f"a {bm}x{bn} tile does not fit in 48 KiB of shared memory"
    if -(-(spec.out_channels // spec.group) // bm) > GRID_YZ_LIMIT or spec.group > GRID_YZ_LIMIT:
        return f"the grid's y (map tiles) or z ({spec.group} groups) exceeds {GRID_YZ_LIMIT}"
    return None




def default_tiles(spec: ConvSpec) -> list[tuple[int, int]]:
    """At most 4 tiles: BM the maps of a group rounded up to a power of 2 (4 to 128)
    with 16, 32 and 8 outputs per thread, then half that BM with 16; not those so
    wide that the K step would fall under MIN_K_STEP. A BM far above the maps of
    a group wastes most multiply-adds: a 64x64 tile ran lenet86 conv1 (4 maps)
    5x slower than 4x1024 on an H200."""
    maps = spec.out_channels // spec.group
    bm = min(128, max(4, 1 << (maps - 1).bit_length()))
    tiles = [(bm, THREADS * per_thread // bm) for per_thread in (16, 32, 8)] + [(bm // 2, THREADS * 32 // bm)]
    k = k_dim(spec)
    fitting = [t for t in dict.fromkeys(tiles) if tile_reason(spec, *t) is None]
    return [t for t in fitting if k_step(k, *t) >= min(k, MIN_K_STEP)][:4]


class GemmFamily(Family):
    """What the two GEMM families share: their configurations and limits."""

    exact = True
    constant_weights = False  # the filters are read from global memory at call time
    config_type = GemmConfig

    def config(self, spec: ConvSpec, bm: int, bn: int) -> GemmConfig:
        """The BM x BN tile with the thread tile of 256 threads and the node's K step."""
        return GemmConfig(self.name, (bm, bn, k_step(k_dim(spec), bm, bn)), thread_tile(bm, bn))

    def configs(self, spec, epilogue=NONE):
        return [self.config(spec, bm, bn) for bm, bn in default_tiles(spec)]

    def unconfigured_reason(self, spec, epilogue):
        return "no GEMM tile fits this Conv"

    def reason(self, spec, config, epilogue):
        (bm, bn, bk), (tm, tn) = config.block, config.thread
        reason = tile_reason(spec, bm, bn)
        if reason:
            return reason
        if (tm, tn) != thread_tile(bm, bn):
            return f"{config}: a {bm}x{bn} block of {THREADS} threads has {'x'.join(map(str, thread_tile(bm, bn)))} thread tiles"
        limit = k_step_limit(k_dim(spec), bm, bn)
        if not 1 <= bk <= limit:
            return f"{config}: the K step must be 1 to {limit} (shared memory, prefetch registers and K = {k_dim(spec)})"
        return None

    def gemm_defines(self, spec: ConvSpec, config: GemmConfig) -> dict[str, int | str]:
        return shape_defines(spec) | config.defines()


class Im2colGemm(GemmFamily):
    name = "im2col_gemm"
    summary = (
        "input unrolled (im2col) into a global-memory workspace, a chunk of images at a time, then a "
        "shared-memory tiled matrix product with the filters; weights read at call time"
    )

    def unconfigured_reason(self, spec, epilogue):
        return self._grid_reason(spec) or super().unconfigured_reason(spec, epilogue)

    def reason(self, spec, config, epilogue):
        return self._grid_reason(spec) or super().reason(spec, config, epilogue)

    @staticmethod
    def _grid_reason(spec: ConvSpec) -> str | None:
        if spec.in_channels > GRID_YZ_LIMIT:
            return f"the unroll kernel's grid has one row per input channel: {spec.in_channels} exceed {GRID_YZ_LIMIT}"
        return None

    def compile_units(self, spec, config, epilogue=NONE):
        defines = self.gemm_defines(spec, config)
        return [CompileUnit("conv_im2col.cu", "conv_im2col", defines), CompileUnit("conv_gemm.cu", "conv_gemm", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        unroll, multiply = self.load(spec, config, weights, epilogue)
        return Im2colGemmKernel(spec, config, unroll, multiply)


class ImplicitGemm(GemmFamily):
    name = "implicit_gemm"
    summary = (
        "implicit GEMM: the tiled matrix product gathers the unrolled input from the image as it loads "
        "each shared-memory tile, so no unrolled matrix exists in memory; weights read at call time"
    )

    def compile_units(self, spec, config, epilogue=NONE):
        return [CompileUnit("conv_gemm.cu", "conv_implicit_gemm", self.gemm_defines(spec, config))]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return ImplicitGemmKernel(spec, config, function)


class ImplicitGemmKernel(ConvKernel):
    reads_weights = True

    def __init__(self, spec: ConvSpec, config: GemmConfig, function):
        super().__init__(spec, config, [function])
        self._function = function

    def _launch(self, x, weights, y, batch):
        w, b = weights
        grid = self.config.grid(self.spec, batch * pixels(self.spec))
        self._function(grid, (self.config.threads, 1, 1), (x, w, b, y, np.int32(batch)))


class Im2colGemmKernel(ConvKernel):
    """Unroll + multiply over chunks of images whose unrolled matrix fits
    `workspace_budget` bytes (and a quarter of the free device memory); a chunk
    is at least one image. The workspace is allocated once per call, on the
    current stream, and reused by every chunk."""

    reads_weights = True

    def __init__(self, spec: ConvSpec, config: GemmConfig, unroll, multiply, workspace_budget: int = WORKSPACE_BUDGET):
        super().__init__(spec, config, [unroll, multiply])
        self.workspace_budget = workspace_budget
        self._unroll = unroll
        self._multiply = multiply

    def image_workspace_bytes(self) -> int:
        """Bytes of unrolled input one image needs: C*KH*KW rows x OH*OW columns."""
        spec = self.spec
        return 4 * spec.in_channels * int(np.prod(spec.kernel)) * pixels(spec)

    def chunk_images(self, batch: int, budget: int) -> int:
        return max(1, min(batch, budget // self.image_workspace_bytes()))

    def workspace_bytes(self, batch: int) -> int:
        """The workspace a call of this batch allocates, at most (the free-memory cap can only shrink it)."""
        return 0 if batch < 1 else self.chunk_images(batch, self.workspace_budget) * self.image_workspace_bytes()

    def _launch(self, x, weights, y, batch):
        import cupy

        spec, tile = self.spec, self.config
        w, b = weights
        budget = min(self.workspace_budget, cuda.free_device_bytes() // FREE_MEMORY_SHARE)
        chunk = self.chunk_images(batch, budget)
        workspace = cupy.empty(chunk * self.image_workspace_bytes() // 4, dtype=cupy.float32)
        for first in range(0, batch, chunk):
            images = min(chunk, batch - first)
            cols = images * pixels(spec)
            count = np.int32(images)
            self._unroll((-(-cols // BLOCK), spec.in_channels, 1), (BLOCK, 1, 1), (x[first : first + images], workspace, count))
            self._multiply(tile.grid(spec, cols), (tile.threads, 1, 1), (w, b, workspace, y[first : first + images], count))


FAMILIES: list[Family] = [Im2colGemm(), ImplicitGemm()]
