"""What the pipelined implicit GEMMs share (kernels/conv_implicit_tiles.cuh): the tensor-core
GEMM (`tensor_gemm`) and the FP32 SIMT GEMM (`simt_gemm`) stream BM x BK weight tiles and
BK x BN tiles gathered from the image (through the __constant__ tap table) through a
cp.async pipeline, and may split the K loop over several blocks whose partial sums a second
kernel adds in a fixed order, for layers with too few output tiles to fill the GPU.

Here: the tap table, the K split that fills the GPU, the limits both share (no max pool, the
table's size), and the kernel that launches either. Each family brings its own Config (the
block tile, its warp or thread tiles, the stages) and its table of tiles.

Any group count: each group is a GEMM of its own, K over its C/G channels. A block's map tile
lies inside one group, so grid y runs over G times the map tiles of one group (`map_tiles`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ....gpu import cuda
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import BlockTiledConfig, ConvKernel, Family
from .gemm import k_dim, pixels  # K = C/G * KH * KW: one group's

TAP_TABLE_ROWS = 8192  # int2 rows of the __constant__ k table: 64 KiB
NO_TAP = 0x3FFF  # must match the source: marks the table rows past K
TAP_SLICE = 32  # the tap table covers K in slices of this many rows, and the K split counts these slices
MIN_SLICES_PER_BLOCK = 4  # split K only while each block keeps this many slices (the pipeline's depth)
MAX_K_SPLITS = 16
DEFAULT_SMS = 132  # an H100 SXM; the configs use the real count when a device is present
WAVE_SHARE = 0.8  # a grid of fewer blocks than this share of the SMs leaves too much idle: split K
WAVE_BALANCE = 0.9  # a K split that fills this share of the block slots over every wave is offered too
REDUCE_BLOCK = 256
GRID_Y_LIMIT = 65535


class PipelinedConfig(BlockTiledConfig):
    """What both GEMMs' Configs give: `block` (BM x BN x BK), `stages` and `splits` fields,
    and the threads, registers budget and shared memory of a block."""

    stages: int
    splits: int

    @property
    def threads(self) -> int:
        raise NotImplementedError

    @property
    def min_blocks(self) -> int:
        """Blocks per SM the registers are capped for (__launch_bounds__)."""
        raise NotImplementedError

    def shared_bytes(self) -> int:
        raise NotImplementedError


def k_slices(spec: ConvSpec) -> int:
    return -(-k_dim(spec) // TAP_SLICE)


def map_tiles(spec: ConvSpec, bm: int) -> int:
    """Grid y: the BM-map tiles of every group (a tile never spans two groups)."""
    return spec.group * -(-(spec.out_channels // spec.group) // bm)


def columns(spec: ConvSpec, batch: int | None = None) -> int:
    return (spec.batch if batch is None else batch) * pixels(spec)


def is_pointwise(spec: ConvSpec) -> bool:
    """1x1, stride 1, no pads: a B row is a channel's pixels, contiguous in the image."""
    return spec.kernel == (1, 1) and spec.strides == (1, 1) and not any(spec.pads)


def masks_taps(spec: ConvSpec) -> bool:
    """Whether a thread can keep one bit per window tap (and one more that is never set)."""
    return int(np.prod(spec.kernel)) < 64


def taps_by_channel(spec: ConvSpec) -> bool:
    """Whether K's rows outgrow the table, so that it holds one channel's window and the kernel
    adds each k's channel offset itself (TAPS_BY_CHANNEL)."""
    return k_slices(spec) * TAP_SLICE > TAP_TABLE_ROWS


def tap_table(spec: ConvSpec) -> np.ndarray:
    """k -> (c*H*W + kh*DH*W + kw*DW, the tap's place), as int32 pairs, for K rounded up to
    whole slices. The place is kh*KW + kw when `masks_taps`, with KH*KW for the rows
    past K; else kh*DH << 16 | kw*DW, with NO_TAP << 16 past K (a row outside every image).
    Where `taps_by_channel`, the rows of channel 0 alone, then one row for past K."""
    (h, w), (kh, kw), (dh, dw) = spec.in_size, spec.kernel, spec.dilations
    channels = 1 if taps_by_channel(spec) else spec.in_channels // spec.group
    c, i, j = np.meshgrid(np.arange(channels), np.arange(kh), np.arange(kw), indexing="ij")
    offsets = (c * h * w + i * dh * w + j * dw).ravel()
    if masks_taps(spec):
        places, past_k = (i * kw + j).ravel(), kh * kw
    else:
        places, past_k = ((i * dh) << 16 | (j * dw)).ravel(), NO_TAP << 16
    rows = offsets.size + 1 if taps_by_channel(spec) else k_slices(spec) * TAP_SLICE
    table = np.zeros((rows, 2), dtype=np.int32)
    table[:, 1] = past_k
    table[: offsets.size, 0] = offsets
    table[: offsets.size, 1] = places
    return table


def tiles_header_defines(spec: ConvSpec, splits: int) -> dict[str, int]:
    """The macros kernels/conv_implicit_tiles.cuh reads besides the shape's and the tile's: the K
    split, 16-byte weight rows (A_VEC) and pixel groups (B_VEC), the window test, the tap table's rows."""
    pointwise_vectors = is_pointwise(spec) and pixels(spec) % 4 == 0
    by_channel = {"TAPS_BY_CHANNEL": 1} if taps_by_channel(spec) else {}  # else left out: the sources it had
    return dict(KSLICES=splits, A_VEC=4 if k_dim(spec) % 4 == 0 else 1, B_VEC=4 if pointwise_vectors else 1,
                TAP_MASK=int(masks_taps(spec)), KPAD=k_slices(spec) * TAP_SLICE, **by_channel)


def multiprocessors() -> int:
    try:
        return cuda.multiprocessor_count()
    except Exception:  # no CuPy or no device (the offline compile check): assume an H100
        return DEFAULT_SMS


def grid_blocks(spec: ConvSpec, config: PipelinedConfig) -> int:
    """Output tiles of the layer at its batch: the blocks of an unsplit grid."""
    return -(-columns(spec) // config.bn) * map_tiles(spec, config.bm)


def split_for(spec: ConvSpec, config: PipelinedConfig, sms: int) -> int:
    """Blocks to split K over so that the grid covers about the SMs, each keeping
    MIN_SLICES_PER_BLOCK slices; 1 when the output tiles alone are enough."""
    blocks = grid_blocks(spec, config)
    split = 1
    while blocks * split < WAVE_SHARE * sms and split * 2 <= MAX_K_SPLITS and k_slices(spec) >= 2 * split * MIN_SLICES_PER_BLOCK:
        split *= 2
    return split


SHORT_K = 512  # up to this GEMM K, an unsplit smaller tile beats a split larger one


def tile_order(orders, spec: ConvSpec) -> tuple:
    """The tiles of `orders` ((least maps a group, tiles), most maps first) for this layer's groups."""
    return next(tiles for least_maps, tiles in orders if spec.out_channels // spec.group >= least_maps)


def split_configs(spec: ConvSpec, order: list) -> list:
    """The unsplit tile configurations of `order`, each with the K split that fills the GPU, then with
    the split that balances its waves (`balancing_split`).

    With a short K, a smaller tile that fills the GPU unsplit goes first: splitting costs a second
    kernel that a few slices per block do not repay (the MNIST 32->64 layer at batch 32 ran 1.5x
    faster on tc_3xtf32's 32x64 tiles than on 64x128 split 4). A first tile whose grid is short of
    one block per slot goes first with its balancing split: on an H100 at batch 32 that ran ResNet
    256->256 at 14x14 1.16x faster (128x64 split 4) and 512->512 at 7x7 1.19x (split 5 over split 2),
    while the grids of 1.5 waves (VGG 512->512 at 14x14, 128->128 at 28x28) ran 1.01-1.13x slower split."""
    sms = multiprocessors()
    if k_dim(spec) <= SHORT_K:
        unsplit = [c for c in order if split_for(spec, c, sms) == 1]
        order = unsplit[:1] + [c for c in order if c not in unsplit[:1]]
    configs = [with_split(c, split_for(spec, c, sms)) for c in order]
    balanced = [with_split(c, balancing_split(spec, c, sms)) for c in order]
    first = order[0]
    if grid_blocks(spec, first) * split_for(spec, first, sms) < sms * first.min_blocks:
        configs.insert(0, balanced[0])
    return list(dict.fromkeys(configs + balanced))


def with_split(config: PipelinedConfig, splits: int) -> PipelinedConfig:
    return dataclasses.replace(config, splits=splits)


def wave_efficiency(blocks: int, slots: int) -> float:
    """The share of the SMs' block slots a grid keeps busy over all its waves."""
    return blocks / (-(-blocks // slots) * slots)


def balancing_split(spec: ConvSpec, config: PipelinedConfig, sms: int) -> int:
    """The fewest K splits from `split_for`'s on whose grid fills WAVE_BALANCE of the block
    slots in its last wave too (else `split_for`'s): a grid of 1.5 waves leaves a quarter of
    the GPU idle (ncu on ResNet 256->256 at batch 32, 128x64 tiles: 0.7 waves of two blocks
    per SM, 19% of the SMs' cycles idle)."""
    blocks = grid_blocks(spec, config)
    slots = sms * config.min_blocks
    least = split_for(spec, config, sms)
    for split in range(least, MAX_K_SPLITS + 1):
        if k_slices(spec) < split * MIN_SLICES_PER_BLOCK:
            break
        if wave_efficiency(blocks * split, slots) >= WAVE_BALANCE:
            return split
    return least


class PipelinedGemm(Family):
    """A pipelined implicit GEMM: subclasses give `tiles` (BM x BN -> what `tile_config` needs),
    `tile_config`, `configs` (each tile's config with a K split: `with_split`) and `compile_units`."""

    fuses = True  # bias, a residual Add and an activation; not the max pool
    takes_prologue = True  # a scale or affine + activation on each B value it loads (prologue_b_slice)
    split = False  # 3xTF32: each operand split into two TF32 parts (an infinite input turns into NaN)
    tap_table = True  # B's taps from the __constant__ table (`tap_table`); conv_wgmma.cu works them out itself
    tiles: dict[tuple[int, int], Any] = {}

    def tile_config(self, tile: tuple[int, int], splits: int = 1) -> PipelinedConfig:
        """The configuration of the BM x BN tile `tile`, its K split over `splits` blocks."""
        raise NotImplementedError

    def reason(self, spec, config, epilogue):
        if spec.in_channels == spec.group and spec.group > 1:
            return f"{self.name}: a depthwise Conv is a GEMM of K = {k_dim(spec)} per map; the depthwise family runs it"
        if epilogue.pool:
            return f"{self.name} fuses the bias, a residual Add and an activation, not a max pool"
        if self.tap_table and taps_by_channel(spec) and not masks_taps(spec):
            return (f"K = {k_dim(spec)} exceeds the {TAP_TABLE_ROWS}-row tap table, and a window of {np.prod(spec.kernel)} "
                    f"taps is too wide to read them by channel (the kernel spills)")
        if spec.in_channels // spec.group * spec.in_size[0] * spec.in_size[1] >= 2**31:
            return f"a group's {spec.in_channels // spec.group} channels of {spec.in_size} pixels are past the int32 offsets of the tap table"
        if spec.in_size[0] >= NO_TAP or spec.in_size[1] > 0xFFFF:
            return f"images of {spec.in_size} pixels are too large for the packed tap table"
        if map_tiles(spec, config.bm) > GRID_Y_LIMIT:
            return f"{config}: {map_tiles(spec, config.bm)} map tiles over {spec.group} groups exceed the grid's y limit of {GRID_Y_LIMIT}"
        tile = config.block[:2]
        if tile not in self.tiles or config != self.tile_config(tile, config.splits):
            return f"{config}: the tiles are {', '.join(self.tile_config(t).name() for t in self.tiles)}"
        slices = -(-k_dim(spec) // config.bk)
        if not 1 <= config.splits <= min(MAX_K_SPLITS, slices):
            return f"{config}: K has {slices} slices of {config.bk}; split it 1 to {min(MAX_K_SPLITS, slices)} ways"
        return None

    def alignment(self, spec: ConvSpec) -> int:
        """Bytes x, y and the residual must be aligned to: 16 where B rows are copied as float4 pixel groups."""
        return 16 if is_pointwise(spec) else 4

    def module_constants(self, spec, config, weights):
        return {"taps": tap_table(spec).view(np.float32)}

    def build(self, spec, config, weights, epilogue=NONE):
        functions = self.load(spec, config, weights, epilogue)
        return PipelinedGemmKernel(spec, config, functions, epilogue, split_operands=self.split, alignment=self.alignment(spec))


class PipelinedGemmKernel(ConvKernel):
    """The GEMM over a grid of output tiles x K splits, then (when split) the reduce kernel."""

    reads_weights = True
    residual_parameter = True
    prologue_parameter = True
    # X may be a view whose images lie apart (a channel slice of a Concat's buffer): the kernel takes
    # the distance between images as an argument (registry.Kernel)
    in_views = True
    flags_nonfinite = True  # store_sum and conv_k_slices_reduce raise it

    @property
    def nonfinite_exact(self) -> bool:
        return not self.split_operands and super().nonfinite_exact

    def __init__(self, spec: ConvSpec, config: PipelinedConfig, functions, epilogue=NONE, *, split_operands: bool, alignment: int):
        super().__init__(spec, config, functions, epilogue, alignment=alignment)
        self.split_operands = split_operands  # 3xTF32: an infinite input turns into NaN (see split_tf32 in the kernel)
        self.splits = config.splits
        self._shared = config.shared_bytes()
        self._gemm = functions[0]
        self._reduce = functions[1] if config.splits > 1 else None
        if self._shared > 48 * 1024:  # past the default, a kernel must ask for its dynamic shared memory
            self._gemm.max_dynamic_shared_size_bytes = self._shared
        # the 16-byte weight copies need W's rows 16-byte aligned
        self.weight_alignment = 16 if k_dim(spec) % 4 == 0 else 4
        self._geometries: dict[int, tuple[tuple[int, int, int], int, int]] = {}

    def workspace_bytes(self, batch: int) -> int:
        return 4 * self.splits * self.spec.out_channels * columns(self.spec, batch) if self.splits > 1 else 0

    def _geometry(self, batch: int) -> tuple[tuple[int, int, int], int, int]:
        """(grid, workspace floats, reduce blocks) of a call at this batch, worked out once per batch."""
        known = self._geometries.get(batch)
        if known is not None:
            return known
        cols = columns(self.spec, batch)
        grid = (-(-cols // self.config.bn), map_tiles(self.spec, self.config.bm), self.splits)
        outputs = batch * self.spec.out_channels * pixels(self.spec)
        self._geometries[batch] = grid, self.workspace_bytes(batch) // 4, min(-(-outputs // REDUCE_BLOCK), 65535)
        return self._geometries[batch]

    def _input_array(self, cupy: Any, x: Any) -> Any:
        """X as it is where each image's C x H x W values are contiguous and the images lie a multiple
        of the alignment apart (the kernel is given that distance); else a contiguous copy."""
        if x.ndim == 4 and x.shape[0] > 1 and x.data.ptr % self.alignment == 0:
            image = x.strides[0]
            per_image = cupy.ndarray(x.shape[1:], x.dtype, x.data, strides=x.strides[1:])
            if per_image.flags.c_contiguous and image >= per_image.nbytes and image % self.alignment == 0:
                return x
        return super()._input_array(cupy, x)

    def _launch(self, x: Any, weights: tuple, y: Any, batch: int, nonfinite: int = 0) -> None:
        import cupy

        w, b, r, pro = weights
        x_image = x.strides[0] // 4 if batch > 1 else int(np.prod(x.shape[1:]))
        if w.data.ptr % self.weight_alignment:
            w = w.copy()
        grid, workspace, reduce_blocks = self._geometry(batch)
        partial = cupy.empty(workspace, dtype=cupy.float32) if self.splits > 1 else None
        target = np.uint64(0) if partial is None else partial
        flag = np.uint64(nonfinite)
        self._gemm(grid, (self.config.threads, 1, 1), (x, w, b, r, pro, y, target, np.int32(batch), np.int32(x_image), flag),
                   shared_mem=self._shared)
        if partial is not None:
            self._reduce((reduce_blocks, 1, 1), (REDUCE_BLOCK, 1, 1), (partial, b, r, y, np.int32(batch), flag))
