"""Pools between half-precision steps (plan/channel_last.py). A pool is exact in any 16-bit format: the max of
rounded values is the rounded max, and an average sums the values in FP32 and rounds once, as it stores. So a
pool names no format of its own (registry.ChannelLast.format None) and takes that of the tensors it is linked
with: X as the format's bits channel-last, and for a window pool (MaxPool, AveragePool) Y so too. A global
pool (and ReduceMean over H and W) writes its [N, C] output in FP32 for what follows it (a Flatten and a Gemm):
channel-last or not, that is one order. The kernels take 8 channels (16 bytes) at a time, so only a pool of a
multiple of 8 channels is linked.

A linked pool's variant names its format and its links in the grammar of every configuration
(config_grammar.py): "cuda_fp16_h3" (X and Y in FP16), "cuda_bf16_h1" (X alone, in BF16); "cuda" is the plain
kernel on FP32 NCHW tensors. Only the plan makes them (Plugin.linked_variant).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...gpu.device import Device
from ...registry import ChannelLast
from ..channel_last import INPUT, OUTPUT, LinkedPlain, linked_plain, named_linked_plain
from ..channel_last import PLAIN as PLAIN  # the plain kernel, on FP32 NCHW tensors (kernel.py): the only one the plan links
from .spec import PoolSpec

LANES = 8  # channels a thread takes at once: 16 bytes of the format


@dataclass(frozen=True)
class LinkedPool(LinkedPlain):
    """A pool's kernel on tensors kept channel-last in a 16-bit format (kernels/pool_channel_last.cu): `links`,
    which (ops/channel_last.py's INPUT, OUTPUT)."""


def offered(spec: PoolSpec, device: Device) -> ChannelLast | None:
    """What a pool's kernel on a GPU can keep channel-last, in any format: X, and Y but for a global pool's;
    None on the CPU device or for a count of channels that is no multiple of LANES."""
    if not device.is_cuda or links_reason(spec, INPUT):
        return None
    return ChannelLast(None, frozenset({0}), not links_reason(spec, OUTPUT))


def linked(spec: PoolSpec, fmt: str, inputs: frozenset[int], output: bool) -> LinkedPool:
    """The configuration that keeps X (where `inputs` holds 0) and Y (where `output`) channel-last in `fmt`;
    a PluginError where the pool cannot."""
    return linked_plain(LinkedPool, fmt, inputs, output, "pool", lambda links: links_reason(spec, links))


def linked_config(spec: PoolSpec, device: Device, variant: str | None) -> LinkedPool | None:
    """The configuration a linked pool's `variant` names; None for any name of no linked family (the plain
    kernel's are check_one_kernel's to judge); a PluginError for links the pool cannot keep or no GPU."""
    return named_linked_plain(LinkedPool, variant, device.is_cuda, "pool", lambda links: links_reason(spec, links))


def links_reason(spec: PoolSpec, links: int) -> str | None:
    """Why a pool's kernel cannot keep these tensors channel-last; None: it can."""
    if not links or links & ~(INPUT | OUTPUT):
        return f"links {links}: {INPUT} (X), {OUTPUT} (Y) or both"
    if spec.channels % LANES:
        return f"a pixel's channels go {LANES} at a time (16 bytes); this pool has {spec.channels}"
    if links & OUTPUT and spec.is_global:
        return "a global pool writes its [N, C] output in FP32"
    return None
