"""A cost model for the default pick: a variant's predicted time is its device time plus
the host's time to launch it, and the host's part vanishes under a CUDA graph.

At batch 1 a layer's kernels take a few microseconds, less than the Python that launches
one; a K split (the pipelined GEMMs' `splits`) is a second launch and a scratch buffer
for the partial sums. Eagerly that costs the host about as much as the kernel itself, so
the split is worth it only where it saves more device time than that; under a graph only
its device cost remains (the reduce kernel's start and the partial sums' round trip).

The device term models what differs between the K splits and tiles of one family: waves of
blocks over the SMs, each block walking its share of K in slices at a rate that grows with
its tile's operand reuse. It ranks the splits of one
configuration, not families against each other; that stays the heuristic's order, and
`opplugin tune` stays the way to measure.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from .spec import ConvSpec

# Host time per kernel launch and per scratch allocation, eager (tools/host_step_bench.py:
# about 28 µs per plugin step of one launch on an H200 before this model, of which the launch
# through CuPy and the output's allocation are the largest parts).
LAUNCH_HOST_US = 8.0
ALLOCATION_HOST_US = 2.0
# A kernel's start on the device after the one before it, in a graph or not.
LAUNCH_DEVICE_US = 2.0
# FP32 rate of one SM in multiply-adds x 2 per µs (an H100's 128 FP32 lanes at about 1.7 GHz),
# and the memory bandwidth the partial sums go through (HBM3, in bytes per µs).
SM_FLOP_PER_US = 435e3
BANDWIDTH_BYTES_PER_US = 3.0e6
# A block tile's multiply-adds per operand value loaded (BM x BN / (BM + BN)) at which its slices
# run at half the SM's FP32 rate: a small tile reloads its operands for few multiply-adds each.
# Fitted to the K splits and tiles of six 3x3 layers at batch 1 on an H200 (tools/pick_study.py,
# graphed): without it the model put VGG's 512->512 at 14x14 on 32x64 tiles split 4 ways, 56 µs,
# against 38 µs for 128x64 tiles split 15 ways; with it every layer's pick was within 1.13x of the best.
HALF_RATE_INTENSITY = 30.0


@dataclasses.dataclass(frozen=True)
class Cost:
    """A variant's predicted time in µs: on the device and, when launched eagerly, on the host."""

    device_us: float
    host_us: float

    @property
    def total_us(self) -> float:
        return self.device_us + self.host_us


def launches(config) -> int:
    """Kernel launches per call: a K split adds the reduce kernel."""
    return 2 if getattr(config, "splits", 1) > 1 else 1


def allocations(config) -> int:
    """Scratch buffers a call allocates besides its output: a K split's partial sums."""
    return 1 if getattr(config, "splits", 1) > 1 else 0


def host_us(config, graphed: bool) -> float:
    """The host's time to launch one call eagerly; nothing when a CUDA graph replays it (`graphed`)."""
    if graphed:
        return 0.0
    return launches(config) * LAUNCH_HOST_US + allocations(config) * ALLOCATION_HOST_US


def device_us(spec: ConvSpec, config, sms: int) -> float:
    """Waves of (tile x split) blocks, each walking K / splits in slices, then the K split's
    second launch and its partial sums written and read back."""
    from .families.pipelined import TAP_SLICE, columns, grid_blocks, k_slices

    splits = getattr(config, "splits", 1)
    blocks = grid_blocks(spec, config) * splits
    slots = sms * config.min_blocks
    waves = -(-blocks // slots)
    intensity = config.bm * config.bn / (config.bm + config.bn)
    rate = SM_FLOP_PER_US * intensity / (intensity + HALF_RATE_INTENSITY)
    slice_us = 2 * config.bm * config.bn * TAP_SLICE * config.min_blocks / rate  # slots share an SM
    compute = waves * -(-k_slices(spec) // splits) * slice_us
    if splits == 1:
        return LAUNCH_DEVICE_US + compute
    partial_bytes = 4 * splits * spec.out_channels * columns(spec)
    return 2 * LAUNCH_DEVICE_US + compute + 2 * partial_bytes / BANDWIDTH_BYTES_PER_US


def under_one_wave(spec: ConvSpec, config, sms: int) -> bool:
    """Whether the configuration's grid (K split included) leaves block slots of the SMs empty."""
    from .families.pipelined import grid_blocks

    return grid_blocks(spec, config) * getattr(config, "splits", 1) < sms * config.min_blocks


def predict(spec: ConvSpec, config, sms: int, graphed: bool) -> Cost:
    """The configuration's cost, launched from CUDA graphs (`graphed`) or eagerly."""
    return Cost(device_us(spec, config, sms), host_us(config, graphed))


def split_alternatives(config) -> list:
    """The configuration and, for a K split, the same tile unsplit and at half the split."""
    splits = getattr(config, "splits", 1)
    if splits == 1:
        return [config]
    return list(dict.fromkeys([config, dataclasses.replace(config, splits=max(1, splits // 2)),
                               dataclasses.replace(config, splits=1)]))


def cheapest(spec: ConvSpec, candidates: Sequence, sms: int, graphed: bool):
    """The candidate of least predicted time, launched from CUDA graphs (`graphed`) or eagerly (the
    first of equals: the heuristic's order)."""
    return min(candidates, key=lambda config: predict(spec, config, sms, graphed).total_us)
