"""`dw_fp16` and `dw_bf16`: a depthwise Conv (one input channel a map, depth multiplier 1) on operands in FP16 or
BF16 (kernels/conv_depthwise_half.cu), what `--precision fp16|bf16` runs the depthwise Convs of MobileNet,
EfficientNet and ConvNeXt in, where wg_fp16 and wg_bf16 (a GEMM of 64 maps at a time) decline one map a group.

X and W are rounded to the format (W once, at build; X as the kernel loads it, or as the step before wrote it,
channel-last in the format: a link, channel_last.py), each product of two such values is exact in FP32, and the
sums, the bias and the fused epilogue (a residual Add, an activation) run in FP32. Not exact, picked by
--precision alone (never by the heuristic).

`dw_fp16_t<TH>x<TW>_b<BH>x<BW>_p<P>[_h<links>]`: a thread computes TH x TW output pixels of 8 channels (a 16-byte
run of a pixel's channels in the format), a block a BH x BW tile of pixels of P channels; `_h` the links.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....core.number_formats import half_bits
from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, ConvKernel, Family, shape_defines
from .channel_last import INPUT, LinkedTensors, link_defines, links_reason, possible_links
from .depthwise import balanced, kernel_reason, plane_tiles, tile_reason

VEC = 8  # channels a thread: 16 bytes of a pixel's channels in the format
GROUPS_PER_BLOCK = 8  # 8-channel groups a block at most: 64 channels, 128 bytes of a pixel in the format
BLOCK_THREADS = 256  # threads a block aims for
THREADS_ACROSS = 8  # pixel threads along a row of the block tile at most
MAX_THREADS = 512
MOST_OUTPUTS = 4  # pixels a thread: 32 FP32 sums; 2 x 4 tiles spilled on sm_90 (3x3 stride 2, 5x5, 7x7)
# Thread tiles, the heuristic's order first: one output row a thread, where ptxas kept the fewest registers.
THREAD_TILES = ((1, 4), (1, 2), (1, 1), (2, 2), (2, 1))
# The heuristic takes the first tile whose sums and one input row of values (8 floats each) stay within this
# many floats: at sm_90, 3x3 1x2 tiles took 72-78 registers, 3x3 1x4 tiles (80 floats) 110-141, 7x7 1x2 tiles
# (80 floats) 140-150. A kernel bound by memory wants warps on each SM more than it wants reuse in registers
# (the windows of neighbouring threads meet in L1). Not yet timed on a GPU.
LIVE_FLOATS = 64


@dataclass(frozen=True)
class DepthwiseHalfConfig(Config):
    """TH x TW output pixels of 8 channels a thread, a BH x BW pixel tile of P channels a block; `links`, the
    tensors it keeps channel-last in the format (channel_last.py), which only a plan sets."""

    thread: tuple[int, int] = tagged("t", 2)
    block: tuple[int, int] = tagged("b", 2)
    planes: int = tagged("p")
    links: int = tagged("h", default=0)

    @property
    def threads(self) -> int:
        (th, tw), (bh, bw) = self.thread, self.block
        return self.planes // VEC * (bh // th) * (bw // tw)


def row_values(spec: ConvSpec, thread: tuple[int, int]) -> int:
    """Input pixels of one row a thread of this tile reads."""
    return (thread[1] - 1) * spec.strides[1] + (spec.kernel[1] - 1) * spec.dilations[1] + 1


def live_floats(spec: ConvSpec, thread: tuple[int, int]) -> int:
    """A thread's FP32 sums and the values of one input row it holds, 8 channels each (see LIVE_FLOATS)."""
    return VEC * (thread[0] * thread[1] + row_values(spec, thread))


def planes_for(spec: ConvSpec) -> int:
    """Channels a block: the most 8-channel groups, up to GROUPS_PER_BLOCK, that divide the Conv's, so that no
    block's groups lie past C (144 channels: 48 a block)."""
    groups = spec.in_channels // VEC
    return VEC * max(d for d in range(1, GROUPS_PER_BLOCK + 1) if groups % d == 0)


def block_tile(spec: ConvSpec, thread: tuple[int, int], planes: int) -> tuple[int, int]:
    """The pixel tile of a block of about BLOCK_THREADS threads over `planes` channels: up to THREADS_ACROSS thread
    tiles along a row, the plane split evenly (as the FP32 depthwise family splits it)."""
    (oh, ow), (th, tw) = spec.out_size, thread
    across = balanced(ow, tw, THREADS_ACROSS)
    down = balanced(oh, th, max(1, BLOCK_THREADS // (planes // VEC) // across))
    return down * th, across * tw


class DepthwiseHalf(Family):
    """The kernel in one format (`half_format` 1 FP16, 2 BF16: kernels' HALF_OPERANDS)."""

    exact = False
    exact_by = "construction"
    fuses = True
    weights_at_build = True  # W converted to the format once
    config_type = DepthwiseHalfConfig
    half_format = 0

    def configs(self, spec, epilogue=NONE):
        """Each thread tile over planes_for's channels; first the first of THREAD_TILES within LIVE_FLOATS."""
        if self._shape_reason(spec, epilogue):
            return []
        planes = planes_for(spec)
        first = next((t for t in THREAD_TILES if live_floats(spec, t) <= LIVE_FLOATS), (1, 1))
        configs = [DepthwiseHalfConfig(self.name, t, block_tile(spec, t, planes), planes) for t in dict.fromkeys([first, *THREAD_TILES])]
        return [c for c in configs if self.reason(spec, c, epilogue) is None]

    def unconfigured_reason(self, spec, epilogue):
        return self._shape_reason(spec, epilogue) or f"no {self.name} tile fits this Conv"

    def _shape_reason(self, spec: ConvSpec, epilogue) -> str | None:
        channels, maps = spec.in_channels // spec.group, spec.out_channels // spec.group
        if channels != 1:
            return f"{self.name} is depthwise: each map reads one input channel (this Conv has {channels} a group)"
        if maps != 1:
            return f"{self.name} takes a depth multiplier of 1 (one map a channel); this Conv has {maps} a channel"
        if spec.in_channels % VEC:
            return f"{self.name} reads a pixel's channels {VEC} at a time (16 bytes); this Conv has {spec.in_channels}"
        return kernel_reason(self.name, spec, epilogue)

    def reason(self, spec, config, epilogue):
        why = self._shape_reason(spec, epilogue) or tile_reason(config) or self._block_reason(config)
        links = links_reason(config.links, epilogue)
        return why or (f"{self.name}: {links}" if links else None)

    def _block_reason(self, config: DepthwiseHalfConfig) -> str | None:
        th, tw = config.thread
        if config.planes % VEC:
            return f"{config}: a block's channels are whole runs of {VEC}"
        if th * tw > MOST_OUTPUTS:
            return f"{config}: a thread tile of {th} x {tw} pixels of {VEC} channels does not fit in registers (at most {MOST_OUTPUTS} pixels)"
        if config.threads > MAX_THREADS:
            return f"{config}: {config.threads} threads a block, at most {MAX_THREADS}"
        return None

    def channel_last_links(self, spec, epilogue):
        """X, Y and a fused residual: every one of its Convs has whole 16-byte runs of channels."""
        return possible_links(lambda links: links_reason(links, epilogue))

    def compile_units(self, spec, config, epilogue=NONE):
        (th, tw), (bh, bw) = config.thread, config.block
        defines = shape_defines(spec, epilogue) | dict(HALF_OPERANDS=self.half_format, TH=th, TW=tw, BH=bh, BW=bw, PLANES=config.planes)
        defines |= link_defines(config.links, self.half_format) | ({"X_CHANNEL_LAST": self.half_format} if config.links & INPUT else {})
        return [CompileUnit("conv_depthwise_half.cu", "conv_depthwise_half", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return DepthwiseHalfKernel(spec, config, function, epilogue, weights, self.precision)


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
        self._w = cupy.asarray(half_bits(tap_major_weights(w), half))
        self._b = cupy.asarray(np.asarray(b, dtype=np.float32)) if b is not None else np.uint64(0)
        # a copy from pageable memory may still be on its way when the call returns; a launch on another stream
        # must find the weights whole
        cupy.cuda.get_current_stream().synchronize()
        self._tiles = plane_tiles(spec, config.block)
        self._channel_blocks = -(-spec.out_channels // config.planes)

    @property
    def nonfinite_exact(self) -> bool:
        """Never: a value past FP16's range turns into an infinity, so a chunk that meets NaN or Inf runs again
        in FP32 (runtime/exact.py), told so by the flag the kernel raises as it stores."""
        return False

    def _launch(self, x, weights, y, batch, nonfinite=0):
        [r] = weights
        self._function((batch * self._tiles, self._channel_blocks, 1), (self.config.threads, 1, 1),
                       (x, self._w, self._b, r, y, np.int32(batch), np.uint64(nonfinite)))


class DepthwiseFp16(DepthwiseHalf):
    name, precision, half_format = "dw_fp16", "fp16", 1
    expected_relative_error, max_relative_error = 3e-4, 2e-3  # as wg_fp16's: one rounding of each operand dominates
    summary = (
        "depthwise in FP16 (not exact; what --precision fp16 runs a depthwise Conv in, multiplier 1, channels a multiple "
        "of 8): X and W rounded to FP16, FP32 sums; a thread computes a few pixels of 8 channels from 16-byte loads, "
        "X read as FP32 NCHW or channel-last in FP16 (a link); fuses bias, a residual Add and an activation"
    )


class DepthwiseBf16(DepthwiseHalf):
    name, precision, half_format = "dw_bf16", "bf16", 2
    expected_relative_error, max_relative_error = 2e-3, 1e-2
    summary = "dw_fp16 in BF16 (not exact; what --precision bf16 runs a depthwise Conv in): FP32's range, an 8-bit mantissa"


FAMILIES: list[Family] = [DepthwiseFp16(), DepthwiseBf16()]
