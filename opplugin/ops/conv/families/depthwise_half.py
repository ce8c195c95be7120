"""`dw_fp16` and `dw_bf16`: a depthwise Conv (one input channel a map, depth multiplier 1) on operands in FP16 or
BF16 (kernels/conv_depthwise_half.cu), what `--precision fp16|bf16` runs the depthwise Convs of MobileNet,
EfficientNet and ConvNeXt in, where wg_fp16 and wg_bf16 (a GEMM of 64 maps at a time) decline one map a group.

X and W are rounded to the format (W once, at build; X as the kernel loads it, or as the step before wrote it,
channel-last in the format: a link, channel_last.py), each product of two such values is exact in FP32, and the
sums, the bias and the fused epilogue (a residual Add, an activation) run in FP32. Not exact, picked by
--precision alone (never by the heuristic).

`dw_fp16_t<TH>x<TW>_b<BH>x<BW>_p<P>[_v<V>][_h<links>]`: a thread computes TH x TW output pixels of V channels (8 when
the name leaves it out: a 16-byte run of a pixel's channels in the format; 4 or 2: 8 or 4 bytes), a block a BH x BW
tile of pixels of P channels; `_h` the links.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....core.number_formats import half_bits
from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, ConvKernel, Family, shape_defines
from .channel_last import (
    INPUT,
    LinkedTensors,
    link_defines,
    links_reason,
    possible_links,
)
from .depthwise import balanced, kernel_reason, plane_tiles, tile_reason

VEC = 8  # channels a thread by default: 16 bytes of a pixel's channels in the format
BLOCK_CHANNELS = 64  # channels a block at most: 128 bytes of a pixel in the format
BLOCK_THREADS = 256  # threads a block aims for
THREADS_ACROSS = 8  # pixel threads along a row of the block tile at most
MAX_THREADS = 512
MOST_ROW_VALUES = 32  # input pixels of a thread's window row: the kernel marks those inside the image in one word
MOST_SUMS = 32  # FP32 sums a thread: 8 channels of 2 x 4 pixels spilled on sm_90 (3x3 stride 2, 5x5, 7x7)
# Thread tiles for each count of channels a thread (VEC), the heuristic's order first: one output row a thread,
# where ptxas kept the fewest registers. Fewer channels leave registers for longer rows, whose pixels and taps
# serve more outputs each (their loads and conversions to FP32 are what a depthwise Conv's time goes to).
THREAD_TILES = {8: ((1, 4), (1, 2), (1, 1), (2, 2), (2, 1)), 4: ((1, 8), (1, 4)), 2: ((1, 8), (1, 16), (2, 8))}
# In a small launch the heuristic takes the first 8-channel tile whose sums and one input row of values stay within
# this many floats: at sm_90, 3x3 1x2 tiles took 72-78 registers, 3x3 1x4 tiles (80 floats) 110-141, 7x7 1x2 tiles
# (80 floats) 140-150. There, warps on each SM count more than reuse in registers: at batch 1 on an H200, these
# tiles were within 1.2x of the fastest on 5 of 11 depthwise layers of MobileNet-V2/V3, EfficientNet and ConvNeXt
# and 1.53x at worst (a 1 x 1 tile was often faster: this rule is not tuned for small launches).
LIVE_FLOATS = 64
# A launch of at least this many outputs fills the GPU with threads of longer rows (large_launch_tile)
LARGE_LAUNCH = 1 << 20


@dataclass(frozen=True)
class DepthwiseHalfConfig(Config):
    """TH x TW output pixels of 8 channels a thread, a BH x BW pixel tile of P channels a block; `links`, the
    tensors it keeps channel-last in the format (channel_last.py), which only a plan sets."""

    thread: tuple[int, int] = tagged("t", 2)
    block: tuple[int, int] = tagged("b", 2)
    planes: int = tagged("p")
    vec: int = tagged("v", default=VEC)
    links: int = tagged("h", default=0)

    @property
    def threads(self) -> int:
        (th, tw), (bh, bw) = self.thread, self.block
        return self.planes // self.vec * (bh // th) * (bw // tw)


def row_values(spec: ConvSpec, thread: tuple[int, int]) -> int:
    """Input pixels of one row a thread of this tile reads."""
    return (thread[1] - 1) * spec.strides[1] + (spec.kernel[1] - 1) * spec.dilations[1] + 1


def live_floats(spec: ConvSpec, thread: tuple[int, int], vec: int = VEC) -> int:
    """A thread's FP32 sums and the values of one input row it holds, `vec` channels each (see LIVE_FLOATS)."""
    return vec * (thread[0] * thread[1] + row_values(spec, thread))


def planes_for(spec: ConvSpec, vec: int = VEC, most: int = BLOCK_CHANNELS) -> int:
    """Channels (maps) a block: the most `vec`-map runs, up to `most` maps, that divide the Conv's, so that no
    block's runs lie past M (144 channels: 48 a block)."""
    runs = spec.out_channels // vec
    return vec * max(d for d in range(1, most // vec + 1) if runs % d == 0)


def block_tile(spec: ConvSpec, thread: tuple[int, int], planes: int, vec: int = VEC) -> tuple[int, int]:
    """The pixel tile of a block of about BLOCK_THREADS threads over `planes` channels: up to THREADS_ACROSS thread
    tiles along a row, the plane split evenly (as the FP32 depthwise family splits it)."""
    (oh, ow), (th, tw) = spec.out_size, thread
    across = balanced(ow, tw, THREADS_ACROSS)
    down = balanced(oh, th, max(1, BLOCK_THREADS // (planes // vec) // across))
    return down * th, across * tw


def large_launch_tile(spec: ConvSpec) -> tuple[int, tuple[int, int]] | None:
    """(channels a thread, thread tile) that the heuristic takes for a launch of at least LARGE_LAUNCH outputs; None:
    the small launch's rule. Timed at batch 32 on an H200, X and Y linked, against the small launch's tile:
    - stride 1, a window of 5 or 7 columns, a row of at most 16 outputs (or 32, in whole 64-channel blocks): 16 outputs
      of 2 channels a thread, each pixel and tap loaded once for up to 16 of them (ConvNeXt's 7x7 at 14x14: 26 -> 9
      us; EfficientNet's 5x5 672 channels at 14x14: 22 -> 11 us);
    - other stride-1 windows: 4 outputs of 4 channels (ConvNeXt's 7x7 96 channels at 56x56: 109 -> 63 us; a 3x3 of
      144 channels at 56x56: 38 -> 33 us);
    - stride 2, a window of 5 or more columns: 8 outputs of 2 channels (24 -> 19 us);
    - a stride-2 3x3 keeps the small launch's tile (within 1% of the fastest)."""
    if spec.batch * spec.out_channels * int(np.prod(spec.out_size)) < LARGE_LAUNCH:
        return None
    stride, columns, row = spec.strides[1], spec.kernel[1], spec.out_size[1]
    if stride == 1 and columns >= 5 and (row <= 16 or (row <= 32 and spec.in_channels % BLOCK_CHANNELS == 0)):
        return 2, (1, 16)
    if stride == 1:
        return 4, (1, 4)
    return (2, (1, 8)) if columns >= 5 else None


def tap_major_weights(w: np.ndarray) -> np.ndarray:
    """W [C][1][KH][KW] as the kernel reads it, [KH][KW][C]: a tap's 8 channels side by side."""
    return np.ascontiguousarray(np.asarray(w, np.float32)[:, 0].transpose(1, 2, 0))


class DepthwiseHalfKernel(LinkedTensors, ConvKernel):
    """The kernel on the weights (in the format) and bias it was built with; W and B among a call's inputs are not
    read. The tensors its configuration links come and go as uint16 [N][H][W][C] in the format."""

    reads_weights = False
    residual_parameter = True
    flags_nonfinite = True  # store_outputs flags each output as stored

    def __init__(self, spec: ConvSpec, config: DepthwiseHalfConfig, function, epilogue, weights, half: str):
        import cupy

        super().__init__(spec, config, [function], epilogue)
        self._function = function
        self._links = config.links
        w, b = weights
        self._w = cupy.asarray(half_bits(self.arranged_weights(w), half))
        self._b = cupy.asarray(np.asarray(b, dtype=np.float32)) if b is not None else np.uint64(0)
        # a copy from pageable memory may still be on its way when the call returns; a launch on another stream
        # must find the weights whole
        cupy.cuda.get_current_stream().synchronize()
        self._tiles = plane_tiles(spec, config.block)
        self._channel_blocks = -(-spec.out_channels // config.planes)

    @staticmethod
    def arranged_weights(w: np.ndarray) -> np.ndarray:
        """W as the kernel reads it (FP32 values, rounded to the format after)."""
        return tap_major_weights(w)

    @property
    def nonfinite_exact(self) -> bool:
        """Never: a value past FP16's range turns into an infinity, so a chunk that meets NaN or Inf runs again
        in FP32 (runtime/exact.py), told so by the flag the kernel raises as it stores."""
        return False

    def _launch(self, x, weights, y, batch, nonfinite=0):
        [r] = weights
        self._function((batch * self._tiles, self._channel_blocks, 1), (self.config.threads, 1, 1),
                       (x, self._w, self._b, r, y, np.int32(batch), np.uint64(nonfinite)))


class WindowRowsHalf(Family):
    """What dw_* and gw_* (grouped_half.py) share: a kernel of `source` that walks each thread's window rows, a few
    outputs of VEC channels or maps a thread, its tensors linked channel-last as its configuration says."""

    source = function = ""
    kernel_type: type = None  # its Kernel

    def channel_last_links(self, spec, epilogue):
        """X, Y and a fused residual: a thread's channels (or a group's) are whole runs of the format."""
        return possible_links(lambda links: links_reason(links, epilogue))

    def compile_units(self, spec, config, epilogue=NONE):
        (th, tw), (bh, bw) = config.thread, config.block
        defines = shape_defines(spec, epilogue) | dict(HALF_OPERANDS=self.half_format, VEC=config.vec, TH=th, TW=tw, BH=bh, BW=bw,
                                                       PLANES=config.planes)
        defines |= link_defines(config.links, self.half_format) | ({"X_CHANNEL_LAST": self.half_format} if config.links & INPUT else {})
        return [CompileUnit(self.source, self.function, defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return self.kernel_type(spec, config, function, epilogue, weights, self.precision)


class DepthwiseHalf(WindowRowsHalf):
    """The kernel in one format (`half_format` 1 FP16, 2 BF16: kernels' HALF_OPERANDS)."""

    exact = False
    exact_by = "construction"
    fuses = True
    weights_at_build = True  # W converted to the format once
    config_type = DepthwiseHalfConfig
    half_format = 0
    source, function, kernel_type = "conv_depthwise_half.cu", "conv_depthwise_half", DepthwiseHalfKernel

    def configs(self, spec, epilogue=NONE):
        """Each thread tile of each count of channels a thread that divides the Conv's, over planes_for's channels;
        first large_launch_tile's, else the first 8-channel tile within LIVE_FLOATS."""
        if self._shape_reason(spec, epilogue):
            return []
        tiles = [(vec, t) for vec, vec_tiles in THREAD_TILES.items() if spec.in_channels % vec == 0 for t in vec_tiles]
        small = next((tile for tile in tiles if live_floats(spec, tile[1], tile[0]) <= LIVE_FLOATS), tiles[0])
        preferred = [tile for tile in (large_launch_tile(spec), small) if tile in tiles]
        configs = [self._config(spec, vec, thread) for vec, thread in dict.fromkeys([*preferred, *tiles])]
        return [c for c in configs if self.reason(spec, c, epilogue) is None]

    def _config(self, spec: ConvSpec, vec: int, thread: tuple[int, int]) -> DepthwiseHalfConfig:
        planes = planes_for(spec, vec)
        return DepthwiseHalfConfig(self.name, thread, block_tile(spec, thread, planes, vec), planes, vec)

    def unconfigured_reason(self, spec, epilogue):
        return self._shape_reason(spec, epilogue) or f"no {self.name} tile fits this Conv"

    def _shape_reason(self, spec: ConvSpec, epilogue) -> str | None:
        channels, maps = spec.in_channels // spec.group, spec.out_channels // spec.group
        if channels != 1:
            return f"{self.name} is depthwise: each map reads one input channel (this Conv has {channels} a group)"
        if maps != 1:
            return f"{self.name} takes a depth multiplier of 1 (one map a channel); this Conv has {maps} a channel"
        if spec.in_channels % min(THREAD_TILES):
            return f"{self.name} reads a pixel's channels at least {min(THREAD_TILES)} at a time (4 bytes); this Conv has {spec.in_channels}"
        return kernel_reason(self.name, spec, epilogue)

    def reason(self, spec, config, epilogue):
        why = self._shape_reason(spec, epilogue) or tile_reason(config) or self._block_reason(config)
        if not why and spec.in_channels % config.vec:
            why = f"{config}: {config.vec} channels a thread do not divide this Conv's {spec.in_channels}"
        if not why and row_values(spec, config.thread) > MOST_ROW_VALUES:
            why = f"{config}: a thread's window rows of {row_values(spec, config.thread)} pixels are more than {MOST_ROW_VALUES}"
        links = links_reason(config.links, epilogue)
        return why or (f"{self.name}: {links}" if links else None)

    def _block_reason(self, config: DepthwiseHalfConfig) -> str | None:
        th, tw = config.thread
        if config.vec not in THREAD_TILES:
            return f"{config}: a thread computes {' or '.join(map(str, sorted(THREAD_TILES)))} channels, one run of the format"
        if config.planes % config.vec:
            return f"{config}: a block's channels are whole runs of {config.vec}"
        if th * tw * config.vec > MOST_SUMS:
            return f"{config}: a thread tile of {th} x {tw} pixels of {config.vec} channels does not fit in registers (at most {MOST_SUMS} sums)"
        if config.threads > MAX_THREADS:
            return f"{config}: {config.threads} threads a block, at most {MAX_THREADS}"
        return None


class DepthwiseFp16(DepthwiseHalf):
    name, precision, half_format = "dw_fp16", "fp16", 1
    expected_relative_error, max_relative_error = 3e-4, 2e-3  # as wg_fp16's: one rounding of each operand dominates
    summary = (
        "depthwise in FP16 (not exact; what --precision fp16 runs a depthwise Conv in, multiplier 1, an even count of "
        "channels): X and W rounded to FP16, FP32 sums; a thread computes a few pixels of 2, 4 or 8 channels from one load "
        "of a pixel's, "
        "X read as FP32 NCHW or channel-last in FP16 (a link); fuses bias, a residual Add and an activation"
    )


class DepthwiseBf16(DepthwiseHalf):
    name, precision, half_format = "dw_bf16", "bf16", 2
    expected_relative_error, max_relative_error = 2e-3, 1e-2
    summary = "dw_fp16 in BF16 (not exact; what --precision bf16 runs a depthwise Conv in): FP32's range, an 8-bit mantissa"


FAMILIES: list[Family] = [DepthwiseFp16(), DepthwiseBf16()]
