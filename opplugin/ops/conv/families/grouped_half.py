"""`gw_fp16` and `gw_bf16`: a grouped Conv of narrow groups on operands in FP16 or BF16
(kernels/conv_grouped_half.cu), what `--precision fp16|bf16` runs the narrow grouped 3x3s of ResNeXt in: groups of
CG = 2, 4, 8 or 16 input channels and MG = 2, 4, 6 or 8 maps, more than one group. wg_fp16 and wg_bf16 decline a
group of 4 maps and run one of 8 on a GEMM tile of 8 maps, which spends its time staging a group's few channels for a
few multiply-adds each (ResNeXt-50's stage 2: 90 us at batch 32 on an H200); depthwise_half.py's kernel, given a
group's CG channels where it has one, reads each pixel's CG channels once and multiplies them with its VEC maps' taps
in registers. Groups of 16 maps (RegNet's, ResNeXt's stage 3) stay on wg's 16-map tile.

X and W are rounded to the format (W once, at build; X as the kernel loads it, or as the step before wrote it,
channel-last in the format: a link, channel_last.py), each product of two such values is exact in FP32, and the
sums, the bias and the fused epilogue (a residual Add, an activation) run in FP32. Not exact, picked by --precision
alone (never by the heuristic).

`gw_fp16_t<TH>x<TW>_b<BH>x<BW>_p<P>[_v<V>][_h<links>]`: a thread computes TH x TW output pixels of V maps of one group
(8 when the name leaves it out: a 16-byte run of a pixel's maps in the format; 4 or 2: 8 or 4 bytes), a block a
BH x BW tile of pixels of P maps; `_h` the links.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..epilogue import NONE
from ..spec import ConvSpec
from .base import Family
from .channel_last import links_reason
from .depthwise import kernel_reason, tile_reason
from .depthwise_half import (
    DepthwiseHalfConfig,
    DepthwiseHalfKernel,
    WindowRowsHalf,
    block_tile,
    planes_for,
    row_values,
)

GROUP_CHANNELS = (2, 4, 8, 16)  # a pixel's channels of a group: one aligned load of 4, 8 or 16 bytes, or two of 16
# maps a group at most: groups of 16 stay on wg_fp16's tile of 16 maps (ResNeXt-50's 512 channels at 14x14, batch 32: 30
# us on an H200), tensor cores where this family's FFMAs would do 16 taps x channels a map; groups of 8 took 90 us there
MOST_MAPS = 8
BLOCK_MAPS = 32  # maps a block at most: a linked warp's lanes span 64 bytes of a pixel's maps and 8 or more pixels
MAX_THREADS = 512
MOST_SUMS = 32  # FP32 sums a thread
MOST_ROW_VALUES = 32  # input pixels of a thread's window row: the kernel marks those inside the image in one word
# A thread holds its sums, one window row's CG channels a pixel and a tap's VEC weights in registers: past this many
# floats ptxas spilled or left too few threads an SM (a guess at the knee, checked to compile without spills)
MOST_LIVE_FLOATS = 136
# (maps a thread, thread tile) in the heuristic's order. A longer row of outputs shares each tap's CG x VEC weights
# (a load and a conversion each) among more multiply-adds (TW of them); more maps a thread share each input pixel's
# CG channels among more. Not timed yet (.bench/s63/gw_time.py times every one): the order is a guess.
THREAD_TILES = ((8, (1, 4)), (4, (1, 8)), (4, (1, 4)), (8, (1, 2)), (8, (2, 2)), (2, (1, 8)), (4, (1, 2)), (8, (1, 1)))
# The first pick: the first of THREAD_TILES within this many live floats whose launch has at least FULL_LAUNCH
# threads (a wave of 132 SMs of 512 threads, rounded: these tiles take 80 to 200 registers); where none has, the fitting tile of the most threads
LIVE_FLOATS = 96
FULL_LAUNCH = 1 << 16


@dataclass(frozen=True)
class GroupedHalfConfig(DepthwiseHalfConfig):
    """TH x TW output pixels of `vec` maps of one group a thread, a BH x BW pixel tile of P maps a block; `links`, the
    tensors it keeps channel-last in the format (channel_last.py), which only a plan sets."""


def group_widths(spec: ConvSpec) -> tuple[int, int]:
    """(input channels, maps) a group."""
    return spec.in_channels // spec.group, spec.out_channels // spec.group


def takes_groups(spec: ConvSpec) -> bool:
    """Whether the Conv's groups are of the widths the family takes (see narrow_groups_reason)."""
    channels, maps = group_widths(spec)
    return spec.group > 1 and channels in GROUP_CHANNELS and maps % 2 == 0 and maps <= MOST_MAPS


def narrow_groups(spec: ConvSpec) -> bool:
    """Whether the Conv is grouped in groups of a few channels and maps, as the family is made for: more than one
    group, 2 to 16 channels and at most MOST_MAPS maps each (whether or not it takes their exact count)."""
    channels, maps = group_widths(spec)
    return spec.group > 1 and 1 < channels <= GROUP_CHANNELS[-1] and maps <= MOST_MAPS


def live_floats(spec: ConvSpec, thread: tuple[int, int], vec: int) -> int:
    """A thread's FP32 sums, one window row's CG channels a pixel and a tap's `vec` weights (see MOST_LIVE_FLOATS)."""
    return vec * (thread[0] * thread[1] + 1) + group_widths(spec)[0] * row_values(spec, thread)


def launch_threads(spec: ConvSpec, thread: tuple[int, int], vec: int) -> int:
    """Threads of a launch of this tile (each a tile of pixels of `vec` maps; overhanging tiles counted whole)."""
    (oh, ow), (th, tw) = spec.out_size, thread
    return spec.batch * -(-oh // th) * -(-ow // tw) * spec.out_channels // vec


def channel_major_weights(w: np.ndarray) -> np.ndarray:
    """W [M][CG][KH][KW] as the kernel reads it, [KH][KW][CG][M]: a tap's channel's maps side by side, so that a
    thread's VEC maps are one load beside its neighbour's."""
    return np.ascontiguousarray(np.asarray(w, np.float32).transpose(2, 3, 1, 0))


class GroupedHalfKernel(DepthwiseHalfKernel):
    """The depthwise kernel's launch, flag and links, on weights in channel_major_weights' layout."""

    arranged_weights = staticmethod(channel_major_weights)


class GroupedHalf(WindowRowsHalf):
    """The kernel in one format (`half_format` 1 FP16, 2 BF16: kernels' HALF_OPERANDS)."""

    exact = False
    exact_by = "construction"
    fuses = True
    weights_at_build = True  # W converted to the format once
    config_type = GroupedHalfConfig
    half_format = 0
    source, function, kernel_type = "conv_grouped_half.cu", "conv_grouped_half", GroupedHalfKernel

    def configs(self, spec, epilogue=NONE):
        """Each tile of THREAD_TILES whose maps a thread divide a group's, over planes_for's maps; first_tile's first."""
        if self._shape_reason(spec, epilogue):
            return []
        configs = [self._config(spec, vec, thread) for vec, thread in THREAD_TILES]
        configs = [c for c in configs if self.reason(spec, c, epilogue) is None]
        first = first_tile(spec, [(c.vec, c.thread) for c in configs])
        return sorted(configs, key=lambda c: (c.vec, c.thread) != first)

    def _config(self, spec: ConvSpec, vec: int, thread: tuple[int, int]) -> GroupedHalfConfig:
        planes = planes_for(spec, vec, BLOCK_MAPS)
        return GroupedHalfConfig(self.name, thread, block_tile(spec, thread, planes, vec), planes, vec)

    def unconfigured_reason(self, spec, epilogue):
        return self._shape_reason(spec, epilogue) or f"no {self.name} tile fits this Conv"

    def _shape_reason(self, spec: ConvSpec, epilogue) -> str | None:
        channels, maps = group_widths(spec)
        if spec.group == 1:
            return f"{self.name} runs grouped Convs; this one has one group"
        if channels not in GROUP_CHANNELS:
            widths = ", ".join(map(str, GROUP_CHANNELS[:-1])) + f" or {GROUP_CHANNELS[-1]}"
            return f"{self.name} takes groups of {widths} input channels (a pixel's in one or two loads); this Conv has {channels} a group"
        if maps % 2 or maps > MOST_MAPS:
            return f"{self.name} takes groups of an even count of maps up to {MOST_MAPS}; this Conv has {maps} a group"
        return kernel_reason(self.name, spec, epilogue)

    def reason(self, spec, config, epilogue):
        why = self._shape_reason(spec, epilogue) or tile_reason(config) or self._block_reason(spec, config)
        links = links_reason(config.links, epilogue)
        return why or (f"{self.name}: {links}" if links else None)

    def _block_reason(self, spec: ConvSpec, config: GroupedHalfConfig) -> str | None:
        (th, tw), maps = config.thread, group_widths(spec)[1]
        if config.vec not in (2, 4, 8):
            return f"{config}: a thread computes 2, 4 or 8 maps, one run of the format"
        if maps % config.vec:
            return f"{config}: {config.vec} maps a thread do not divide a group's {maps}"
        if config.planes % config.vec:
            return f"{config}: a block's maps are whole runs of {config.vec}"
        if th * tw * config.vec > MOST_SUMS:
            return f"{config}: a thread tile of {th} x {tw} pixels of {config.vec} maps does not fit in registers (at most {MOST_SUMS} sums)"
        if live_floats(spec, config.thread, config.vec) > MOST_LIVE_FLOATS:
            return (f"{config}: a thread's sums, window row and taps need {live_floats(spec, config.thread, config.vec)} "
                    f"floats in registers, at most {MOST_LIVE_FLOATS}")
        if row_values(spec, config.thread) > MOST_ROW_VALUES:
            return f"{config}: a thread's window rows of {row_values(spec, config.thread)} pixels are more than {MOST_ROW_VALUES}"
        if config.threads > MAX_THREADS:
            return f"{config}: {config.threads} threads a block, at most {MAX_THREADS}"
        return None


def first_tile(spec: ConvSpec, tiles: list[tuple[int, tuple[int, int]]]) -> tuple[int, tuple[int, int]] | None:
    """The heuristic's (maps a thread, thread tile) of `tiles` (THREAD_TILES' order): see LIVE_FLOATS."""
    fitting = [tile for tile in tiles if live_floats(spec, tile[1], tile[0]) <= LIVE_FLOATS] or tiles
    full = [tile for tile in fitting if launch_threads(spec, tile[1], tile[0]) >= FULL_LAUNCH]
    return full[0] if full else max(fitting, key=lambda tile: launch_threads(spec, tile[1], tile[0]), default=None)


class GroupedFp16(GroupedHalf):
    name, precision, half_format = "gw_fp16", "fp16", 1
    expected_relative_error, max_relative_error = 3e-4, 2e-3  # as dw_fp16's: one rounding of each operand dominates
    summary = (
        "grouped in FP16 (not exact; what --precision fp16 runs a Conv of 2 to 16 channels and 2 to 8 maps a group in): X and "
        "W rounded to FP16, FP32 sums; a thread computes a few pixels of 2 to 8 maps of one group from each pixel's "
        "channels of the group loaded once, X read as FP32 NCHW or channel-last in FP16 (a link); fuses bias, a "
        "residual Add and an activation"
    )


class GroupedBf16(GroupedHalf):
    name, precision, half_format = "gw_bf16", "bf16", 2
    expected_relative_error, max_relative_error = 2e-3, 1e-2
    summary = "gw_fp16 in BF16 (not exact; what --precision bf16 runs narrow groups in): FP32's range, an 8-bit mantissa"


FAMILIES: list[Family] = [GroupedFp16(), GroupedBf16()]
