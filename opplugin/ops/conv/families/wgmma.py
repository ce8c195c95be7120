"""The Hopper implicit GEMM (kernels/conv_wgmma.cu): tc_3xtf32's implicit GEMM and 3xTF32
arithmetic on the asynchronous warpgroup MMA, wgmma, of sm_90a. It runs on compute capability 9.0
alone (H100, H200); tc_3xtf32 stays the path everywhere else.

A block's producer warpgroups copy each slice into shared memory, its consumer warpgroups (one per
64 pixels) multiply from there; see the kernel's header for why. The operands come split into big
and small TF32 parts and K-major: the weights rearranged once, at build time, so that a slice is
one window tap's 32 channels (`split_weights`), and the image rewritten channel-last before each
call (conv_split_channel_last). So a group's input channels must be a multiple of 32, and the
weights constant (initializers). Any window: a copy is zeros where its tap lies outside the image, which the
producers read from a bit per tap of each pixel's window up to 3x3 (MASKED_TAPS) and test tap by tap past it.

`wg_3xtf32_b<BM>x<BN>x<BK>_s<S>[_k<K>]`: BM maps (one wgmma's N: 64 or 128) x BN pixels of the
batch a block, BK the K depth of a slice (32: one 128-byte line a row), S slices staged; `_k<K>`
splits the K loop over K blocks (`pipelined`). FP32-exact by measurement, as tc_3xtf32.

`wg_fp16` and `wg_bf16` are the same kernel on operands in that format, what `--precision fp16|bf16`
runs a Conv in: the weights converted at build, the image rewritten channel-last in the format (half
the bytes of the split rewrite), one wgmma a k16 step accumulating in FP32; BK is 64 (a 128-byte line
still). A 16-byte quad of a slice is eight channels of one tap, so a slice spans taps where a group
has fewer than 64 channels: they take groups of any multiple of 8 channels, and a one-group Conv of
any channel count, its channels padded with zeros to a multiple of 8 (a stem's 3 to 8). Their BM may
also be 8, 16, 24 or 32 (NARROW_MAPS: wgmma's N of one to four n8 blocks), so that a group of that many
maps (MobileNetV2's 16- and 24-map projections, RegNet's and ResNeXt's groups of 16) runs in the format on
a tile of its own maps, where a 64-map tile would be mostly padding, and links channel-last as wider
groups do; fewer than 32 maps a group in another count stay FP32.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ....core.number_formats import half_bits
from ...config_grammar import tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, Family, shape_defines
from .channel_last import INPUT, OUTPUT, RESIDUAL, LinkedTensors, link_defines, links_reason, possible_links
from .gemm import k_dim
from .pipelined import REDUCE_BLOCK, WAVE_BALANCE, PipelinedConfig, PipelinedGemm, PipelinedGemmKernel, balancing_split, columns, grid_blocks, multiprocessors, split_configs, tile_order, tiles_header_defines, wave_efficiency, with_split
from .tc_gemm import Split3xTf32Gemm

SLICE_DEPTH = 32  # BK: four k8 steps of three wgmmas a stage; one window tap's 32 channels
STAGES = 3  # two slices in flight, one multiplied
TF32_KEPT = np.uint32(0xFFFFE000)  # the bits of an FP32 value a TF32 operand keeps
PROLOGUE_BLOCK = 256  # conv_prologue_channel_last's threads a block, a 16-byte run of channels each
# conv_split_channel_last's tile: SPLIT_CHANNELS (one of these) channels x TRANSPOSE_VALUES / SPLIT_CHANNELS pixels
TRANSPOSE_CHANNELS = (8, 16, 32)
TRANSPOSE_VALUES = 1024  # a tile's values: four for each of the block's 256 threads (the kernel's SPLIT_PIXELS)
# A first tile whose waves leave SMs idle gives way: with a K from LONG_K on, to its K split that
# balances the waves (the reduce is repaid), with a shorter one to the tile of half its pixels
# (twice the blocks). On an H200 at batch 32: VGG 512->512 at 14x14 (K 4608) 0.331 ms split 2
# against 0.389 unsplit, ResNet 256->256 at 14x14 (2304) 0.124 split 4 against 0.136 split 2,
# 512->512 at 7x7 0.122 split 5 against 0.137 split 4; ResNet 128->128 at 28x28 (K 1152, 196
# blocks of 128 x 128: 1.5 waves) 0.120 on 128 x 64 tiles against 0.132, and 0.132 split 2.
LONG_K = 2048
HOPPER = "sm_90"  # the one architecture wgmma's code (sm_90a) runs on
# Up to this many window taps (3x3, 1x1) a producer works out once which taps of each of its pixels' windows lie
# inside the image, a bit each (TAP_MASK); for a wider window each copy tests its own tap instead: a 7x7 stem's
# 49-bit masks, held a pixel, spilled the producers of a 512-thread block (40 bytes on wg_fp16_b64x128x64_s4).
MASKED_TAPS = 9
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

    # the operands' parts a stage holds (values and small parts) and the bytes of each value
    parts = 2
    value_bytes = 4

    def shared_bytes(self) -> int:
        """STAGES slices of weights and image values (with their small parts), two mbarriers a stage,
        and 1024 bytes to align the swizzle's atoms with."""
        return self.stages * self.parts * (self.bm + self.bn) * self.bk * self.value_bytes + self.stages * 16 + 1024


@dataclass(frozen=True)
class WgmmaHalfConfig(WgmmaGemmConfig):
    """wg_fp16's and wg_bf16's: values alone, two bytes each; `links`, the tensors it keeps channel-last in
    the format (channel_last.py: INPUT, OUTPUT, RESIDUAL), which only a plan sets."""

    links: int = tagged("h", default=0)

    parts = 1
    value_bytes = 2

    def shared_bytes(self) -> int:
        """The stages, and where Y is linked each consumer warp's 16 staged rows (its pixels) of `staged_row` halves
        (conv_wgmma.cu's store_channel_last), BN / 16 warps."""
        staging = 2 * self.bn * staged_row(self.bm) if self.links & OUTPUT else 0
        return super().shared_bytes() + staging


def staged_row(bm: int) -> int:
    """Halves of a staged output row (conv_wgmma.cu's STAGED_ROW): 8 past the tile's BM maps, and 8 more where BM
    is no multiple of 16, so that a warp's stores of 8 rows fall in distinct banks."""
    return bm + 8 + bm % 16


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
    weights_at_build = True

    slice_depth = SLICE_DEPTH
    stages = STAGES
    half_format = 0  # 1 FP16, 2 BF16: the kernel's HALF_OPERANDS; 0 3xTF32
    pads_channels = False  # takes groups of whole quads of channels, one group of any count (padded)
    tap_table = False  # the producers work out each copy's tap from its place in K: any window

    def reason(self, spec, config, epilogue):
        channels = spec.in_channels // spec.group
        if self.pads_channels:
            if channels % HALF_QUAD and spec.group > 1:
                return (f"{self.name} reads a group's input channels {HALF_QUAD} at a time from a channel-last copy; "
                        f"this Conv has {spec.group} groups of {channels}")
        elif channels % self.slice_depth:
            return (f"{self.name} reads a group's input channels {self.slice_depth} at a time from a channel-last copy; "
                    f"this Conv has {channels} a group")
        return super().reason(spec, config, epilogue)

    def tile_config(self, tile, splits=1):
        return self.config_type(self.name, (*tile, self.slice_depth), self.stages, splits)

    def configs(self, spec, epilogue=NONE):
        """Every tile of `offered_tiles`, in order, each with its K splits (`split_configs`); where the first
        leaves SMs idle in its last wave, what fills them better first (LONG_K)."""
        offered = split_configs(spec, [self.tile_config(t) for t in self.offered_tiles(spec)])
        return list(dict.fromkeys([self._balanced(spec, offered[0]), *offered]))

    def offered_tiles(self, spec: ConvSpec) -> tuple[tuple[int, int], ...]:
        """The tiles `configs` offers, the heuristic's first: TILE_ORDER's for the layer's maps a group."""
        return tile_order(TILE_ORDER, spec)

    def _balanced(self, spec: ConvSpec, first: WgmmaGemmConfig) -> WgmmaGemmConfig:
        sms = multiprocessors()
        if k_dim(spec) >= LONG_K:
            return with_split(first, balancing_split(spec, first, sms))
        narrower = (first.bm, first.bn // 2)
        if first.splits > 1 or narrower not in self.tiles:
            return first
        efficiency = {c: wave_efficiency(grid_blocks(spec, c), sms) for c in (first, self.tile_config(narrower))}
        best = max(efficiency, key=efficiency.get)
        return best if efficiency[first] < WAVE_BALANCE else first

    def alignment(self, spec):
        return 4

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec, epilogue) | tiles_header_defines(spec, config.splits) | {
            "TAP_MASK": int(masks_window(spec)),
            "BM": config.bm,
            "BN": config.bn,
            "BK": config.bk,
            "STAGES": config.stages,
        } | ({"HALF_OPERANDS": self.half_format} if self.half_format else {}) | self._padding_defines(spec)
        defines["SPLIT_CHANNELS"] = split_channels(image_channels(spec, self.pads_channels))
        links = getattr(config, "links", 0)
        defines |= link_defines(links, self.half_format)
        units = [CompileUnit("conv_wgmma.cu", "conv_wgmma", defines, arch_specific=True)]
        if config.splits > 1:
            units.append(CompileUnit("conv_wgmma.cu", "conv_k_slices_reduce", defines, arch_specific=True))
        if links & INPUT:  # X comes channel-last in the format: nothing to rewrite, only a prologue to apply
            prologue = [CompileUnit("conv_wgmma.cu", "conv_prologue_channel_last", defines, arch_specific=True)]
            return units + (prologue if epilogue.prologue else [])
        return units + [CompileUnit("conv_wgmma.cu", "conv_split_channel_last", defines, arch_specific=True)]

    def _padding_defines(self, spec: ConvSpec) -> dict[str, int]:
        """CP, where the channel-last image pads the channels (else the kernel takes C)."""
        padded = image_channels(spec, self.pads_channels)
        return {"CP": padded} if padded != spec.in_channels else {}

    def module_constants(self, spec, config, weights):
        return None  # conv_wgmma.cu declares no tap table: its modules take no constants

    def build(self, spec, config, weights, epilogue=NONE):
        functions = self.load(spec, config, weights, epilogue)
        return WgmmaGemmKernel(spec, config, functions, epilogue, weights, self.precision if self.half_format else None)


# wg_fp16's and wg_bf16's stages: half the bytes of 3xTF32's a slice, so more of them in flight (as the
# GEMMs' wg_fp16, WGMMA_HALF_STAGES)
HALF_SLICE_DEPTH = 64  # BK: 64 two-byte values a 128-byte line
HALF_STAGES = 4
HALF_QUAD = 8  # two-byte values a 16-byte copy: channels of one tap
# wg_fp16's and wg_bf16's narrow map tiles, narrowest first: BM (wgmma's N) of one to four n8 blocks, for a group of
# fewer maps than a 64-map tile would hold without most of it padding. A group of such a count takes the narrowest
# that holds its maps (all of it: no padding), on 128 pixels a block, then 64.
NARROW_MAPS = (8, 16, 24, 32)
NARROW_PIXELS = (128, 64)
# from this many maps a group, any count runs (32 on a tile of its own, more on TILES', the last tile padded); fewer
# only in a count of NARROW_MAPS: lenet86's 4-map Conv and a 20-map squeeze stay on the FP32 kernels made for few maps
MIN_HALF_MAPS = 32


class WgmmaHalfGemm(WgmmaGemm):
    """wg_3xtf32 on operands in a 16-byte format: not exact, picked by --precision (never by the heuristic)."""

    exact = False
    exact_by = "construction"
    split = False
    config_type = WgmmaHalfConfig
    tiles = dict.fromkeys(TILES + tuple((maps, pixels) for maps in NARROW_MAPS for pixels in NARROW_PIXELS))
    slice_depth = HALF_SLICE_DEPTH
    stages = HALF_STAGES
    pads_channels = True

    def reason(self, spec, config, epilogue):
        maps = spec.out_channels // spec.group
        if maps < MIN_HALF_MAPS and maps not in NARROW_MAPS:
            return (f"{self.name} takes fewer than {MIN_HALF_MAPS} maps a group only in whole {NARROW_MAPS[0]}-map blocks "
                    f"(a tile of exactly its maps); this Conv has {maps} a group")
        if config is not None and config.links:
            why = self._links_reason(spec, config.links, epilogue)
            if why:
                return f"{self.name}: {why}"
            config = replace(config, links=0)  # the tile and its K split, as the family offers them
        return super().reason(spec, config, epilogue)

    def offered_tiles(self, spec):
        """The narrowest tile of NARROW_MAPS that holds a group's maps, where one does (a 16-map group: BM 16, not
        64), on each of NARROW_PIXELS; else wg_3xtf32's."""
        maps = spec.out_channels // spec.group
        narrowest = next((bm for bm in NARROW_MAPS if bm >= maps), None)
        if narrowest is None:
            return super().offered_tiles(spec)
        return tuple((narrowest, pixels) for pixels in NARROW_PIXELS)

    def channel_last_links(self, spec, epilogue):
        """X where no prologue applies and no channel is padded; Y and a fused residual where a group's maps are
        whole 16-byte runs."""
        return possible_links(lambda links: self._links_reason(spec, links, epilogue))

    def _links_reason(self, spec: ConvSpec, links: int, epilogue) -> str | None:
        """links_reason, and this kernel's own limits: a padded image, a group's maps in part of a 16-byte run."""
        why = links_reason(links, epilogue)
        if why:
            return why
        channels, maps = image_channels(spec, pads=True), spec.out_channels // spec.group
        if links & INPUT and channels != spec.in_channels:
            return f"X cannot come in channel-last: the kernel pads its {spec.in_channels} channels to {channels}"
        if links & (OUTPUT | RESIDUAL) and maps % HALF_QUAD:
            return f"a pixel's maps go channel-last {HALF_QUAD} at a time (16 bytes); this Conv has {maps} a group"
        return None

    def alignment(self, spec):
        return 4


class WgmmaFp16Gemm(WgmmaHalfGemm):
    name = "wg_fp16"
    precision = "fp16"
    half_format = 1
    summary = (
        "tensor cores (not exact; what --precision fp16 runs, sm_90 alone): wg_3xtf32's pipeline on operands rounded to "
        "FP16, the image rewritten channel-last in FP16 before each call, one wgmma a k16 step accumulating in FP32; "
        "values beyond FP16's range (65504) overflow; groups of a multiple of 8 input channels, or one group of any"
    )
    expected_relative_error = 3e-4
    max_relative_error = 2e-3


class WgmmaBf16Gemm(WgmmaHalfGemm):
    name = "wg_bf16"
    precision = "bf16"
    half_format = 2
    summary = "wg_fp16 in BF16 (not exact; what --precision bf16 runs, sm_90 alone): FP32's range, an 8-bit mantissa"
    expected_relative_error = 2e-3
    max_relative_error = 1e-2


def masks_window(spec: ConvSpec) -> bool:
    """Whether the producers keep a bit per window tap (MASKED_TAPS), rather than test each copy's tap."""
    return spec.kernel[0] * spec.kernel[1] <= MASKED_TAPS


def split_channels(channels: int) -> int:
    """conv_split_channel_last's channels a tile: the fewest of TRANSPOSE_CHANNELS that hold the image's
    `channels`, else the most."""
    return next((tile for tile in TRANSPOSE_CHANNELS if channels <= tile), TRANSPOSE_CHANNELS[-1])


def image_channels(spec: ConvSpec, pads: bool) -> int:
    """The channels of the channel-last image the kernel reads: the Conv's, or where `pads` (the half
    families) and one group's channels do not fill whole quads, that many padded with zeros to them."""
    if not pads or spec.group > 1:
        return spec.in_channels
    return -(-spec.in_channels // HALF_QUAD) * HALF_QUAD


def weight_rows(spec: ConvSpec, w: np.ndarray, channels: int, depth: int) -> np.ndarray:
    """W as the kernel reads it: a map's row of k = (kh*KW + kw)*channels + c, a group's `channels`
    (its own, or padded with zero weights), the row padded with zeros to whole slices of `depth`."""
    w = np.asarray(w, dtype=np.float32).transpose(0, 2, 3, 1)  # [M][KH][KW][C/G]
    taps = np.zeros((*w.shape[:3], channels), np.float32)
    taps[..., :w.shape[3]] = w
    k = taps[0].size
    rows = np.zeros((spec.out_channels, -(-k // depth) * depth), np.float32)
    rows[:, :k] = taps.reshape(spec.out_channels, k)
    return rows


def split_weights(spec: ConvSpec, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W as the 3xTF32 kernel reads it (weight_rows: groups of a multiple of 32 channels, so no padding),
    and the small TF32 parts of those values (each value less its TF32 bits, exact in FP32); the values
    themselves are the big parts."""
    rows = weight_rows(spec, w, spec.in_channels // spec.group, SLICE_DEPTH)
    return rows, rows - (rows.view(np.uint32) & TF32_KEPT).view(np.float32)


class WgmmaGemmKernel(LinkedTensors, PipelinedGemmKernel):
    """conv_split_channel_last over X, then the GEMM (and the K split's reduce) on the weights and
    bias it was built with; W and B among a call's inputs are not read. `half`: "fp16" or "bf16" for
    the families whose operands are in that format (None: 3xTF32's big and small parts). The tensors
    its configuration links (channel_last.py) come and go as uint16 [N][H][W][C] in that format."""

    reads_weights = False

    def __init__(self, spec, config, functions, epilogue, weights, half: str | None = None):
        import cupy

        # split_operands: an infinite input turns into NaN in 3xTF32, and a value past FP16's range into
        # an infinity: neither keeps FP32's NaN and Inf, so a chunk that meets them runs again exactly
        linked_x = bool(getattr(config, "links", 0) & INPUT)
        # the last function makes the GEMM's image: conv_split_channel_last from an FP32 X, or
        # conv_prologue_channel_last from a linked one with a prologue; a linked X without one is the image
        rewrites = not linked_x or epilogue.prologue is not None
        super().__init__(spec, config, functions[:-1] if rewrites else functions, epilogue, split_operands=True, alignment=4)
        self.functions = list(functions)
        self._split = functions[-1] if rewrites and not linked_x else None
        self._prologue = functions[-1] if rewrites and linked_x else None
        w, b = weights
        self._half = half
        self._links = getattr(config, "links", 0)
        self._channels = image_channels(spec, bool(half))  # of the channel-last image
        if half:
            rows = weight_rows(spec, w, self._channels // spec.group, HALF_SLICE_DEPTH)
            self._w_big, self._w_small = cupy.asarray(half_bits(rows, half)), np.uint64(0)
        else:
            self._w_big, self._w_small = (cupy.asarray(part) for part in split_weights(spec, w))
        self._b = cupy.asarray(np.asarray(b, dtype=np.float32)) if b is not None else np.uint64(0)
        # a copy from pageable memory may still be on its way when the call returns; a launch on
        # another stream must find the weights whole
        cupy.cuda.get_current_stream().synchronize()
        self._image_floats = spec.in_channels * spec.in_size[0] * spec.in_size[1]
        # conv_split_channel_last's blocks: pixel tiles of each image, channel tiles
        tile = split_channels(self._channels)
        pixels = TRANSPOSE_VALUES // tile
        self._transpose_tiles = (-(-spec.in_size[0] * spec.in_size[1] // pixels), -(-self._channels // tile))

    def workspace_bytes(self, batch: int) -> int:
        """The channel-last image (with its small parts), then the K split's partial sums."""
        return self._image_bytes(batch) + super().workspace_bytes(batch)

    def _image_bytes(self, batch: int) -> int:
        """The channel-last image's bytes: two per value in a half format, else eight (a value and its small
        part); none where X comes channel-last already, but for the prologue's output."""
        if self._links & INPUT and self._prologue is None:
            return 0
        return (2 if self._half else 8) * batch * self._channels * self.spec.in_size[0] * self.spec.in_size[1]

    def _geometry(self, batch: int) -> tuple[tuple[int, int, int], int, int]:
        """Unsplit, persistent: at most a block an SM (the stages' shared memory and the consumers' registers
        leave room for one), each taking every grid-th output tile, so that its producers copy the next tile's
        first slices while its consumers store this one's; a K split keeps a block per tile and run of slices."""
        if batch in self._geometries:
            return self._geometries[batch]
        grid, workspace, reduce_blocks = super()._geometry(batch)
        if self.splits == 1:
            grid = (min(grid[0] * grid[1], multiprocessors()), 1, 1)
        elif self._links & OUTPUT:  # the reduce's blocks take 32 pixels x 32 maps of a linked Y each
            reduce_blocks = min(-(-columns(self.spec, batch) // 32) * -(-self.spec.out_channels // 32), 65535)
        self._geometries[batch] = grid, workspace, reduce_blocks
        return grid, workspace, reduce_blocks

    def _launch(self, x, weights, y, batch, nonfinite=0):
        import cupy

        r, pro = weights
        grid, workspace, reduce_blocks = self._geometry(batch)
        values = batch * self._channels * self.spec.in_size[0] * self.spec.in_size[1]
        scratch = cupy.empty(workspace, dtype=cupy.float32)  # workspace_bytes: the image(s), then the partial sums
        image_end = -(-self._image_bytes(batch) // 4)
        partial = scratch[image_end:]
        if self._links & INPUT and self._prologue is None:  # X is the channel-last image already
            x_big, x_small = x, np.uint64(0)
        elif self._links & INPUT:  # the prologue on X, channel-last in the format both
            x_big, x_small = scratch[:image_end].view(cupy.uint16), np.uint64(0)
            runs = values // 8
            self._prologue((-(-runs // PROLOGUE_BLOCK), 1, 1), (PROLOGUE_BLOCK, 1, 1), (x, pro, x_big, np.int32(batch)))
        else:
            if self._half:
                x_big, x_small = scratch[:image_end].view(cupy.uint16), np.uint64(0)
            else:
                x_big, x_small = scratch[:values], scratch[values:2 * values]
            pixel_tiles, channel_tiles = self._transpose_tiles
            x_image = x.strides[0] // 4 if batch > 1 else self._image_floats
            self._split((batch * pixel_tiles, channel_tiles, 1), (32, 8, 1), (x, pro, x_big, x_small, np.int32(x_image)))
        target, flag = (partial if self.splits > 1 else np.uint64(0)), np.uint64(nonfinite)
        self._gemm(grid, (self.config.threads, 1, 1),
                   (x_big, x_small, self._w_big, self._w_small, self._b, r, y, target, np.int32(batch), flag), shared_mem=self._shared)
        if self.splits > 1:
            self._reduce((reduce_blocks, 1, 1), (REDUCE_BLOCK, 1, 1), (partial, self._b, r, y, np.int32(batch), flag))


FAMILIES: list[Family] = [WgmmaGemm(), WgmmaFp16Gemm(), WgmmaBf16Gemm()]
