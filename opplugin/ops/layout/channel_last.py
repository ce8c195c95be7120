"""Concat between half-precision steps (plan/channel_last.py). A Concat copies values as they are, so it is exact in
any 16-bit format and names none of its own (registry.ChannelLast.format None): it takes that of its producers. Its
output holds its inputs as they come, so it links all of them and its output in one format, or none
(ChannelLast.all_or_none): the plan keeps it FP32 where one input comes from an FP32 step, and says why.

Linked, each tensor is uint16 [N][H][W][C] (ops/channel_last.py): a Concat along the channels copies each input's
pixels into [..., start:start + Ci] of the output's last axis (linked_concat.py). Only along the channels (axis 1
of an NCHW tensor) is that a Concat of channel-last tensors. A linked Concat's output is its own: the runtime
writes no producer into it in place, nor makes it a view of a later Concat's (runtime/buffers.py).

A linked Concat's variant names its format and its links in the grammar of every configuration (config_grammar.py):
"cuda_fp16_h3" (every input and the output in FP16), "cuda_bf16_h3"; "cuda" is the plain kernel on FP32 NCHW
tensors. Only the plan makes them (Plugin.linked_variant).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import PluginError
from ...gpu.device import Device
from ...registry import ChannelLast
from ..channel_last import FORMAT_CODES, INPUT, OUTPUT
from ..config_grammar import Config, parse, tagged
from .spec import ConcatSpec

PLAIN = "cuda"  # the kernel on FP32 NCHW tensors (kernels.ConcatKernel)
FAMILIES = {f"{PLAIN}_{fmt}": fmt for fmt in FORMAT_CODES}  # a linked Concat's family -> the format of its tensors
ALL_LINKS = INPUT | OUTPUT  # every input and the output: a Concat links all of them or none
CHANNELS, RANK = 1, 4  # the one axis, of NCHW tensors, along which a Concat of channel-last tensors stays one


@dataclass(frozen=True)
class LinkedConcat(Config):
    """A Concat's kernel on tensors kept channel-last in a 16-bit format (linked_concat.py): `links`, always
    ALL_LINKS (ops/channel_last.py's INPUT and OUTPUT), named so that the name reads as the pools' do."""

    links: int = tagged("h")

    @property
    def format(self) -> str:
        return FAMILIES[self.family]


def links_reason(spec: ConcatSpec, rank: int) -> str | None:
    """Why this Concat cannot run on channel-last tensors; None: it can."""
    if (spec.axis, rank) != (CHANNELS, RANK):
        return f"a Concat is linked channel-last along the channels alone (axis {CHANNELS} of {RANK}); this one joins axis {spec.axis} of {rank}"
    return None


def offered(spec: ConcatSpec, rank: int, device: Device) -> ChannelLast | None:
    """Every input and the output, in any format, all or none; None on the CPU device or along another axis."""
    if not device.is_cuda or links_reason(spec, rank):
        return None
    return ChannelLast(None, frozenset(range(len(spec.widths))), True, all_or_none=True)


def linked(spec: ConcatSpec, fmt: str, inputs: frozenset[int], output: bool) -> LinkedConcat:
    """The configuration that keeps every input and the output channel-last in `fmt`; a PluginError for
    anything less (a Concat links all of them or none) or a format there is no kernel for."""
    family = f"{PLAIN}_{fmt}"
    if family not in FAMILIES:
        raise PluginError(f"a Concat is linked in {' or '.join(FORMAT_CODES)}, not {fmt}")
    if inputs != frozenset(range(len(spec.widths))) or not output:
        raise PluginError(f"a Concat links all of its inputs and its output or none, not inputs {sorted(inputs)}"
                          f"{' and its output' if output else ''}")
    return LinkedConcat(family, ALL_LINKS)


def linked_config(spec: ConcatSpec, rank: int, device: Device, variant: str | None) -> LinkedConcat | None:
    """The configuration a linked Concat's `variant` names; None for the plain kernel's names (None, "cuda",
    "reference"); a PluginError for other links, another axis or no GPU."""
    if variant is None or not variant.startswith(tuple(FAMILIES)):
        return None
    _, config = parse(variant, dict.fromkeys(FAMILIES, LinkedConcat), "Concat")
    if config is None:
        raise PluginError(f"{variant!r} names no links: {LinkedConcat.form(variant)} ({LinkedConcat.meanings()})")
    if config.links != ALL_LINKS:
        raise PluginError(f"variant {variant!r}: a Concat links all of its inputs and its output (h{ALL_LINKS}) or none")
    if not device.is_cuda:
        raise PluginError(f"variant {variant!r} needs a CUDA device; the CPU device runs the numpy reference")
    why = links_reason(spec, rank)
    if why:
        raise PluginError(f"variant {variant!r}: {why}")
    return config
