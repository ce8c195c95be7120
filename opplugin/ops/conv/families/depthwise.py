"""Convolution of narrow groups with filters of any size (kernels/conv_depthwise.cu), weights
read at call time, so no layer is too wide for it:

- `depthwise_t<TH>x<TW>_b<BH>x<BW>_p<P>`: every output map reads one input channel (C / G == 1,
  any depth multiplier);
- `grouped_t<TH>x<TW>_b<BH>x<BW>_p<P>[_m<MT>]`: a few input channels a group (ResNeXt's 4, RegNet's 16),
  the P maps of a block in one group, sharing its channels' patches.

A block computes a BH x BW tile of output pixels of P maps, each thread a TH x TW register tile
of one map (grouped: of MT maps, so that each input value it reads serves MT maps); the block
stages its input patches and its filters in shared memory. The depthwise heuristic's tile covers
the plane with little waste (`plane_tile`) and packs maps into a block until it has enough threads
(`planes_for`); the grouped one takes all of a group's maps a block (`Grouped.preferred`).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, ConvKernel, Family, shape_defines
from .pipelined import multiprocessors

SHARED_BYTES = 48 * 1024  # static shared memory of a block
MAX_THREADS = 512
BANKS = 32
# Thread tiles in the order the heuristic tries them: 2 x 4 outputs share input rows and columns
# at a register count that keeps occupancy (4 x 4 with a 7x7 filter took 159 registers on sm_80);
# the small ones fit planes of few pixels without waste.
THREAD_TILES = ((2, 4), (2, 2), (1, 4), (4, 4), (4, 2), (2, 1), (1, 2), (1, 1))
THREADS_ACROSS = 8  # a block row of threads spans 8 thread tiles: 32 columns at TW = 4
PLANE_THREADS = 128  # threads a block aims for over one plane before it packs several maps
LEAST_EFFICIENCY = 0.8  # share of computed outputs that lie in the plane, for the heuristic's tile
WAVES = 2  # the heuristic packs more maps only while the grid keeps this many blocks per SM
# Where the first pick's grid is shorter than that (batch 1, few maps), a thread tile of fewer
# outputs goes first: more threads, each with a shorter chain of loads. Graphed on an H200 at
# batch 1, 2 x 1 ran 1.00-1.11x the best tile of five such depthwise layers (EfficientNet-B0's
# and MobileNetV2's stride-2 ones, ConvNeXt-T's 7x7 at 768 maps), where 2 x 4 and 1 x 4 ran up to 1.85x.
SHORT_GRID_TILES = ((2, 1), (1, 2), (1, 1))
# The thread tiles offered unstaged (STAGED 0: no shared memory; see kernels/conv_depthwise.cu).
UNSTAGED_TILES = ((2, 2), (1, 1), (2, 1), (1, 2))
# A depthwise layer goes unstaged (2 x 2 tiles) where a thread's window loads stay few per output,
# or where the staged pick's patch is mostly halo, so that staging it buys little reuse. Graphed on an
# H100, unstaged 2 x 2 ran 1.00-1.05x the best of every suite depthwise layer but one at batch 1 and
# 32 (EfficientNet-B0's 5x5 and 5x5 s2, MobileNetV2's 3x3 s2, ConvNeXt-T's 7x7 at 7x7), where the
# staged pick ran up to 1.65x; ConvNeXt-T's 7x7 at 56x56 (16 loads an output, a patch 1.5x its
# tile) stays staged, 1.00x.
UNSTAGED_MOST_LOADS = 12.5  # a 2 x 2 tile's window loads per output: 6.25 at 3x3 s2, 12.25 at 5x5 s2, 16 at 7x7
UNSTAGED_LEAST_HALO = 2.0  # the staged pick's patch values per output of its tile
# Grouped layers: a block computes all of its group's maps, up to GROUP_PLANES, and each thread
# MAPS_PER_THREAD of them, so that each input value a thread reads from shared memory feeds that
# many maps' multiply-adds. The heuristic's pick, measured on an H100 (graphed; pick_study.py) on nine
# grouped 3x3 layers of ResNeXt-50/101, RegNetY-400MF/800MF and groups of 2: where the grid has
# WAVES blocks an SM, 2 x 2 tiles of 4 maps a thread ran 1.00-1.16x the best configuration of each
# layer (1.27x for groups of 2 maps), where one map a thread had run up to 1.75x; where the staged
# patch outgrows shared memory (ResNeXt-50's stride-2 256-channel layer), unstaged 2 x 2 tiles of all
# the block's maps a thread ran the best, 80 µs, against 293 for the one-map pick. On the short grids
# of batch 1, 1 x 1 tiles of 4 maps a thread ran 1.00-1.10x the best.
GROUP_PLANES = 8
MAPS_PER_THREAD = (1, 2, 4, 8)  # the counts of maps a thread the family offers
PREFERRED_MAPS = 4
LONG_GRID_TILE, SHORT_GRID_TILE = (2, 2), (1, 1)


@dataclass(frozen=True)
class DepthwiseConfig(Config):
    """TH x TW outputs per thread, a BH x BW output tile per block, P maps per block, `maps` of them
    per thread; `staged` 0: no shared memory, each thread reads its window from global memory."""

    thread: tuple[int, int] = tagged("t", 2)
    block: tuple[int, int] = tagged("b", 2)
    planes: int = tagged("p")
    maps: int = tagged("m", default=1)
    staged: int = tagged("l", default=1)

    @property
    def threads(self) -> int:
        (th, tw), (bh, bw) = self.thread, self.block
        return self.planes // max(self.maps, 1) * (bh // th) * (bw // tw)


def patch_size(spec: ConvSpec, block: tuple[int, int]) -> tuple[int, int]:
    """Input rows x columns a block's output tile reads."""
    (kh, kw), (sh, sw), (dh, dw) = spec.kernel, spec.strides, spec.dilations
    return (block[0] - 1) * sh + (kh - 1) * dh + 1, (block[1] - 1) * sw + (kw - 1) * dw + 1


def bank_conflicts(spec: ConvSpec, config: DepthwiseConfig, pitch: int) -> int:
    """The most lanes of a warp's first 32 threads that read one bank at different addresses
    when each reads the first value of its patch window (one map's lanes; maps sit whole
    patches apart, which the pitch does not change much)."""
    (th, tw), (bh, bw) = config.thread, config.block
    across, per_plane = bw // tw, (bh // th) * (bw // tw)
    plane_floats = patch_size(spec, config.block)[0] * pitch
    addresses = set()
    for lane in range(min(BANKS, config.threads)):
        plane, inside = divmod(lane, per_plane)
        ty, tx = divmod(inside, across)
        slot = plane if depthwise(spec) else 0  # a group's maps read the same channel's patch at once
        addresses.add(slot * plane_floats + ty * th * spec.strides[0] * pitch + tx * tw * spec.strides[1])
    per_bank: dict[int, int] = {}
    for address in addresses:
        per_bank[address % BANKS] = per_bank.get(address % BANKS, 0) + 1
    return max(per_bank.values())


@functools.lru_cache(maxsize=4096)  # 32 pitches of 32 lanes tried; asked again by cost, resources and build
def pitch_for(spec: ConvSpec, config: DepthwiseConfig) -> int:
    """Floats per patch row: the patch's width, or up to 32 more where that spreads a warp's reads over more banks."""
    width = patch_size(spec, config.block)[1]
    return min(range(width, width + BANKS), key=lambda pitch: (bank_conflicts(spec, config, pitch), pitch))


def depthwise(spec: ConvSpec) -> bool:
    return spec.in_channels == spec.group


def shared_bytes(spec: ConvSpec, config: DepthwiseConfig) -> int:
    """The channel patches (each map's own depthwise, else the group's) and the block's filters; none unstaged."""
    if not config.staged:
        return 0
    rows = patch_size(spec, config.block)[0]
    channels = spec.in_channels // spec.group
    slots = config.planes if channels == 1 else channels
    return 4 * (slots * rows * pitch_for(spec, config) + config.planes * channels * int(np.prod(spec.kernel)))


def loads_per_output(spec: ConvSpec, thread: tuple[int, int]) -> float:
    """Input values a thread of this tile reads for each output it computes (its window rows x columns)."""
    (th, tw), (kh, kw), (sh, sw), (dh, dw) = thread, spec.kernel, spec.strides, spec.dilations
    return ((th - 1) * sh + (kh - 1) * dh + 1) * ((tw - 1) * sw + (kw - 1) * dw + 1) / (th * tw)


def patch_per_output(spec: ConvSpec, block: tuple[int, int]) -> float:
    """Patch values a block stages for each output of its tile."""
    rows, columns = patch_size(spec, block)
    return rows * columns / (block[0] * block[1])


def prefers_unstaged(spec: ConvSpec, staged: DepthwiseConfig) -> bool:
    """Whether a depthwise layer runs quicker unstaged than on `staged` (see UNSTAGED_MOST_LOADS)."""
    return loads_per_output(spec, UNSTAGED_TILES[0]) <= UNSTAGED_MOST_LOADS or patch_per_output(spec, staged.block) >= UNSTAGED_LEAST_HALO


def balanced(outputs: int, per_thread: int, most_threads: int) -> int:
    """Threads along one side of a block: at most `most_threads`, split evenly over the tiles
    the side needs, so that the last tile is not mostly empty."""
    threads = -(-outputs // per_thread)
    tiles = -(-threads // most_threads)
    return -(-threads // tiles)


def plane_tile(spec: ConvSpec, thread: tuple[int, int]) -> tuple[int, int]:
    """The block tile of this thread tile: up to THREADS_ACROSS tiles across and PLANE_THREADS
    threads in all, no larger than the plane (rounded up to whole thread tiles), the plane
    split evenly."""
    (oh, ow), (th, tw) = spec.out_size, thread
    across = balanced(ow, tw, THREADS_ACROSS)
    down = balanced(oh, th, max(1, PLANE_THREADS // across))
    return down * th, across * tw


def efficiency(spec: ConvSpec, block: tuple[int, int]) -> float:
    """The share of the outputs a grid of these tiles computes that lie inside the plane."""
    (oh, ow), (bh, bw) = spec.out_size, block
    return oh * ow / (-(-oh // bh) * bh * -(-ow // bw) * bw)


def plane_tiles(spec: ConvSpec, block: tuple[int, int]) -> int:
    """Block tiles that cover one output plane."""
    (oh, ow), (bh, bw) = spec.out_size, block
    return -(-oh // bh) * -(-ow // bw)


def grid_blocks(spec: ConvSpec, config: DepthwiseConfig) -> int:
    """Blocks of the launch: a tile of the plane, for a block's maps, for each image."""
    return spec.batch * plane_tiles(spec, config.block) * -(-spec.out_channels // config.planes)


def planes_for(spec: ConvSpec, plane_threads: int, tiles: int) -> int:
    """Maps per block: a power of 2 that gives a block at least a warp, then more up to
    PLANE_THREADS threads while the grid at the planned batch keeps WAVES blocks on each SM.
    Grouped, the maps of a block share their group's patches: as many as MAX_THREADS allow
    (dividing the group's maps), the same waves permitting."""
    maps = spec.out_channels // spec.group
    fits = (lambda p: p <= spec.out_channels) if depthwise(spec) else (lambda p: maps % p == 0)
    most = PLANE_THREADS if depthwise(spec) else MAX_THREADS
    planes = 1
    while planes * plane_threads < 32 and fits(planes * 2):
        planes *= 2
    while (planes * 2 * plane_threads <= most and fits(planes * 2)
           and spec.batch * tiles * -(-spec.out_channels // (planes * 2)) >= WAVES * multiprocessors()):
        planes *= 2
    return planes


def kernel_reason(name: str, spec: ConvSpec, epilogue) -> str | None:
    """What the depthwise kernels (conv_depthwise.cu, conv_depthwise_half.cu) decline on any shape: a fused max pool,
    an image past 32-bit offsets."""
    if epilogue.pool:
        return f"{name} fuses the bias, a residual Add and an activation, not a max pool"
    if spec.in_channels * int(np.prod(spec.in_size)) >= 2**31:
        return f"{name} indexes one image's input with 32-bit offsets: at most 2**31 - 1 values an image"
    return None


def tile_reason(config) -> str | None:
    """Why a thread tile (`thread`) and block tile (`block`) of `planes` maps do not make a block; None: they do."""
    (th, tw), (bh, bw) = config.thread, config.block
    if min(th, tw, bh, bw, config.planes) < 1 or bh % th or bw % tw:
        return f"{config}: the block tile must be whole thread tiles"
    return None


class NarrowGroups(Family):
    """The depthwise family (`depthwise` True: one input channel a group) or the grouped one."""

    exact = True
    exact_by = "construction"
    fuses = True
    config_type = DepthwiseConfig
    depthwise = True
    MOST_CHANNELS = 32  # grouped: input channels a group at most; wider groups fill GEMM tiles well
    thread_tiles = THREAD_TILES

    def config(self, spec: ConvSpec, thread: tuple[int, int], staged: int = 1) -> DepthwiseConfig:
        block = plane_tile(spec, thread)
        plane_threads = (block[0] // thread[0]) * (block[1] // thread[1])
        return DepthwiseConfig(self.name, thread, block, planes_for(spec, plane_threads, plane_tiles(spec, block)), staged=staged)

    def configs(self, spec, epilogue=NONE):
        """Every thread tile's config; first the earliest of THREAD_TILES whose tiles waste at most a fifth
        of the work, else the least wasteful, unless a depthwise layer prefers_unstaged."""
        if self._shape_reason(spec, epilogue):
            return []
        configs = [self.config(spec, thread) for thread in self.thread_tiles]
        configs += [self.config(spec, thread, staged=0) for thread in UNSTAGED_TILES]
        configs = [c for c in dict.fromkeys(configs) if self.reason(spec, c, epilogue) is None]
        good = [c for c in configs if efficiency(spec, c.block) >= LEAST_EFFICIENCY]
        first = good[0] if good else max(configs, key=lambda c: efficiency(spec, c.block), default=None)
        if first is not None and grid_blocks(spec, first) < WAVES * multiprocessors():
            first = next((c for tile in SHORT_GRID_TILES for c in good if c.thread == tile and c.staged), first)
        # its tiles may overhang a small plane (8x8 over 7x7): they still ran quickest there
        unstaged = next((c for c in configs if not c.staged and c.thread == UNSTAGED_TILES[0]), None)
        if self.depthwise and first is not None and unstaged is not None and prefers_unstaged(spec, first):
            first = unstaged
        return [first, *(c for c in configs if c != first)] if first else []

    def unconfigured_reason(self, spec, epilogue):
        return self._shape_reason(spec, epilogue) or f"no {self.name} tile fits this Conv in shared memory"

    def _shape_reason(self, spec: ConvSpec, epilogue) -> str | None:
        channels = spec.in_channels // spec.group
        if self.depthwise and channels != 1:
            return f"depthwise only: each output map must read one input channel (this Conv has {channels} per group)"
        if not self.depthwise and not 1 < channels <= self.MOST_CHANNELS:
            return f"groups of 2 to {self.MOST_CHANNELS} input channels only (this Conv has {channels}); depthwise takes 1"
        return kernel_reason(self.name, spec, epilogue)

    def reason(self, spec, config, epilogue):
        reason = self._shape_reason(spec, epilogue) or tile_reason(config)
        if reason:
            return reason
        planes = config.planes
        if not self.depthwise and (spec.out_channels // spec.group) % planes:
            return f"{config}: a block's {planes} maps must lie in one group of {spec.out_channels // spec.group}"
        if config.maps < 1 or planes % config.maps:
            return f"{config}: a thread's {config.maps} maps must divide the block's {planes}"
        if self.depthwise and config.maps > 1:
            return f"{config}: one map a thread (m1) in depthwise layers; a thread's maps share a group's patches"
        if config.staged not in (0, 1):
            return f"{config}: loads l1 (staged in shared memory) or l0 (from global memory), not l{config.staged}"
        th, tw = config.thread
        if th * tw * config.maps > 32:
            return f"{config}: a thread tile of {th} x {tw} outputs of {config.maps} maps does not fit in registers (at most 32)"
        if config.threads > MAX_THREADS:
            return f"{config}: {config.threads} threads a block, at most {MAX_THREADS}"
        if shared_bytes(spec, config) > SHARED_BYTES:
            return f"{config}: the input patch and filters need {shared_bytes(spec, config)} bytes of shared memory, at most {SHARED_BYTES}"
        return None

    def compile_units(self, spec, config, epilogue=NONE):
        (th, tw), (bh, bw) = config.thread, config.block
        defines = shape_defines(spec, epilogue) | dict(TH=th, TW=tw, BH=bh, BW=bw, PLANES=config.planes, MAPS=config.maps,
                                                       PITCH=pitch_for(spec, config), STAGED=config.staged)
        return [CompileUnit("conv_depthwise.cu", "conv_depthwise", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return DepthwiseKernel(spec, config, function, epilogue)


class DepthwiseKernel(ConvKernel):
    reads_weights = True
    residual_parameter = True

    def __init__(self, spec: ConvSpec, config: DepthwiseConfig, function, epilogue=NONE):
        super().__init__(spec, config, [function], epilogue)
        self._function = function
        self._tiles = plane_tiles(spec, config.block)
        self._map_blocks = -(-spec.out_channels // config.planes)

    def _launch(self, x, weights, y, batch):
        w, b, r = weights
        self._function((batch * self._tiles, self._map_blocks, 1), (self.config.threads, 1, 1), (x, w, b, r, y, np.int32(batch)))


class Depthwise(NarrowGroups):
    name = "depthwise"
    summary = (
        "depthwise (one input channel per map) of any filter size, stride and dilation: a block stages its input "
        "patches and filters in shared memory, each thread computes a register tile of rows x columns whose input "
        "rows it loads once; weights read at call time; fuses bias, a residual Add and an activation"
    )
    depthwise = True


class Grouped(NarrowGroups):
    name = "grouped"
    summary = (
        "narrow groups (2 to 32 input channels) of any filter size: the depthwise kernel with a block's maps in one "
        "group sharing its channels' patches in shared memory; weights read at call time; fuses bias, a residual Add "
        "and an activation"
    )
    depthwise = False
    # A grouped block stages every channel of its group, so smaller register tiles (more threads
    # to share the staging) do better: graphed on an H200, 2 x 2 ran 1.00-1.15x the best tile of
    # the suite's grouped layers at batch 1 and 32, where 2 x 4 ran up to 1.49x (ResNeXt's 128 maps, batch 1).
    thread_tiles = ((2, 2), *(tile for tile in THREAD_TILES if tile != (2, 2)))

    def configs(self, spec, epilogue=NONE):
        """Every thread tile with the group's planes (group_planes) and each count of maps a thread
        (MAPS_PER_THREAD), staged and unstaged, the heuristic's order first (see GROUP_PLANES), then
        the one-map configs the depthwise heuristic picks."""
        single = super().configs(spec, epilogue)
        if not single:
            return []
        planes = group_planes(spec)
        several = [DepthwiseConfig(self.name, thread, plane_tile(spec, thread), planes, maps=maps, staged=staged)
                   for staged in (1, 0) for thread in self.thread_tiles for maps in MAPS_PER_THREAD if maps <= planes]
        several = [c for c in several if self.reason(spec, c, epilogue) is None]
        return list(dict.fromkeys([*(c for c in self.preferred(spec, planes) if c in several), *several, *single]))

    def preferred(self, spec: ConvSpec, planes: int) -> list[DepthwiseConfig]:
        """The measured picks, in order: on a grid of WAVES blocks an SM, 2 x 2 tiles of PREFERRED_MAPS
        maps a thread staged, else unstaged with all the block's maps a thread; on a shorter one, 1 x 1 tiles."""
        maps = min(PREFERRED_MAPS, planes)
        long_tile = DepthwiseConfig(self.name, LONG_GRID_TILE, plane_tile(spec, LONG_GRID_TILE), planes, maps=maps)
        if grid_blocks(spec, long_tile) < WAVES * multiprocessors():
            return [DepthwiseConfig(self.name, SHORT_GRID_TILE, plane_tile(spec, SHORT_GRID_TILE), planes, maps=maps)]
        return [long_tile, dataclasses.replace(long_tile, maps=planes, staged=0)]


def group_planes(spec: ConvSpec) -> int:
    """Grouped: the maps a block computes, all of its group's up to GROUP_PLANES (a power of 2 dividing them)."""
    maps, planes = spec.out_channels // spec.group, 1
    while planes * 2 <= GROUP_PLANES and maps % (planes * 2) == 0:
        planes *= 2
    return planes


FAMILIES: list[Family] = [Depthwise(), Grouped()]
