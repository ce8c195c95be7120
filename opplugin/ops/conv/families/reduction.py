"""Input-channel reduction: the C/G channels of one output are split over SL
threads (channel slices), each summing its channels' KH x KW windows.
`reduce_tree_c<SL>` adds the partial sums by a tree in shared memory;
`reduce_atomic_c<SL>` adds them into the output with atomicAdd, after a first
kernel has set the output to the bias (the order of the additions then varies
from run to run). Filters in __constant__ memory. With one channel per group
there is nothing to split, and neither family is offered."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import BLOCK, UNROLL_BUDGET, CompileUnit, ConvKernel, Family, filter_constants, shape_defines
from .direct import pixels

# 2, 4 or 8 slices: a block row of BLOCK/SL >= 32 threads is whole warps, so each
# warp belongs to one slice and reads one filter address at a time (a broadcast)
SLICES = (2, 4, 8)


@dataclass(frozen=True)
class SlicesConfig(Config):
    """The input channels of one output are split over `slices` threads."""

    slices: int = tagged("c")


def channels_per_group(spec: ConvSpec) -> int:
    return spec.in_channels // spec.group


def unroll_passes(spec: ConvSpec, slices: int) -> int:
    """Unroll a slice's channel loop fully when its body stays small, else not at all."""
    passes = -(-channels_per_group(spec) // slices)
    return passes if passes * int(np.prod(spec.kernel)) <= UNROLL_BUDGET else 1


class ChannelReduction(Family):
    """Shared by the two ways of adding the slices' partial sums."""

    source = ""
    constant_weights = True
    config_type = SlicesConfig

    def configs(self, spec, epilogue=NONE):
        """Every slice count that fits, fewest first: splitting only adds parallelism, which a
        large batch already has (lenet86 conv2 at batch 10000: s2 faster than s4 for both families)."""
        return [SlicesConfig(self.name, s) for s in SLICES if s <= channels_per_group(spec)]

    def unconfigured_reason(self, spec, epilogue):
        return f"{self.name}: C/G = {channels_per_group(spec)} input channel per output map, nothing to reduce"

    def reason(self, spec, config, epilogue):
        channels = channels_per_group(spec)
        if channels < 2:
            return self.unconfigured_reason(spec, epilogue)
        if config.slices not in SLICES:
            return f"{config}: the channel slices must be one of {', '.join(map(str, SLICES))}"
        if config.slices > channels:
            return f"{config}: {config.slices} slices for {channels} input channels per group leave slices idle"
        return None

    def defines(self, spec: ConvSpec, config: SlicesConfig) -> dict[str, int | str]:
        return shape_defines(spec) | {"SL": config.slices, "UNROLL_K": unroll_passes(spec, config.slices)}

    def module_constants(self, spec, config, weights):
        return filter_constants(weights)


class ReduceTree(ChannelReduction):
    name = "reduce_tree"
    summary = (
        "input channels of one output split over thread slices, partial sums added by a tree in shared "
        "memory; filters in __constant__ memory (needs C/G >= 2)"
    )
    source = "conv_reduce_tree.cu"

    def compile_units(self, spec, config, epilogue=NONE):
        return [CompileUnit(self.source, "conv_reduce_tree", self.defines(spec, config))]

    def build(self, spec, config, weights, epilogue=NONE):
        [summed] = self.load(spec, config, weights, epilogue)
        return SlicedKernel(spec, config, summed)


class ReduceAtomic(ChannelReduction):
    name = "reduce_atomic"
    summary = (
        "input channels of one output split over thread slices, partial sums atomicAdd-ed into the output "
        "(set to the bias first); FP32 but the summation order varies run to run (needs C/G >= 2)"
    )
    source = "conv_reduce_atomic.cu"

    def compile_units(self, spec, config, epilogue=NONE):
        defines = self.defines(spec, config)
        return [
            CompileUnit(self.source, "conv_reduce_atomic_init", defines),
            CompileUnit(self.source, "conv_reduce_atomic", defines),
        ]

    def build(self, spec, config, weights, epilogue=NONE):
        init, summed = self.load(spec, config, weights, epilogue)
        return SlicedKernel(spec, config, summed, init=init)


class SlicedKernel(ConvKernel):
    """Blocks of (BLOCK/SL pixels) x (SL channel slices), one output map per grid row;
    `init`, when given, first sets every output element to its bias (same stream)."""

    def __init__(self, spec, config: SlicesConfig, function, init=None):
        super().__init__(spec, config, [function] + ([init] if init is not None else []))
        self._function = function
        self._slices = config.slices
        self._init = init

    def _launch(self, x, weights, y, batch):
        outputs = batch * pixels(self.spec)
        maps = self.spec.out_channels
        if self._init is not None:
            self._init((-(-outputs // BLOCK), maps, 1), (BLOCK, 1, 1), (y, np.int32(batch)))
        per_block = BLOCK // self._slices
        self._function((-(-outputs // per_block), maps, 1), (per_block, self._slices, 1), (x, y, np.int32(batch)))


FAMILIES: list[Family] = [ReduceTree(), ReduceAtomic()]
