"""A LayerNormalization over the channel axis between half-precision steps (plan/channel_last.py): ConvNeXt's
`Transpose > LayerNormalization(axis -1) > Transpose`, which the graph passes turn into one over axis 1 of an
NCHW tensor (opplugin::LayerNormalization, axes [1]). Channel-last, each pixel's C channels are one contiguous
row. Like a pool, the normalisation computes in FP32 and rounds once, as it stores, so it is as exact in one
16-bit format as in the other: it names no format of its own (registry.ChannelLast.format None) and takes that
of the tensors it is linked with, X (input 0) and Y. Its scale and bias are per channel, constants in FP32.

The kernel (linked_kernel.py) takes 8 channels (16 bytes) at a time and keeps a pixel's channels in the
registers of a few threads, so only a multiple of 8 channels, up to MAX_CHANNELS, is linked. A linked
normalisation's variant names its format and links as a linked pool's does ("cuda_fp16_h3"); "cuda" is the
plain kernel (kernels/reduce.cu) on FP32 NCHW tensors. Only the plan makes them (Plugin.linked_variant).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ...gpu.device import Device
from ...registry import ChannelLast, NodeInfo, PrecisionChoice
from ..channel_last import FORMAT_CODES, INPUT, OUTPUT, PLAIN, LinkedPlain, check_offered, linked_plain, named_linked_plain, plain_offer
from ..specs import spec_of
from .spec import LAYER, NormSpec

LANES = 8  # channels a thread takes at once: 16 bytes of the format
MAX_CHANNELS = 2048  # a pixel's channels in the registers of a warp, 64 a thread


@dataclass(frozen=True)
class LinkedNorm(LinkedPlain):
    """A normalisation's kernel on tensors kept channel-last in a 16-bit format (kernels/norm_channel_last.cu):
    `links`, which (ops/channel_last.py's INPUT, OUTPUT)."""


def normalises_channels(spec: Any) -> bool:
    """Whether the node is a LayerNormalization over the channel axis alone of an N x C x H x W tensor."""
    return isinstance(spec, NormSpec) and spec.kind == LAYER and len(spec.input_shape) == 4 and spec.first == 1 \
        and spec.rows.extent == spec.input_shape[1]


def channel_reason(spec: Any) -> str | None:
    """Why the linked kernel cannot normalise this node; None: it can (any links)."""
    if not normalises_channels(spec):
        return "channel-last in 16 bits, it normalises over the channel axis of an N x C x H x W tensor alone"
    if spec.channels % LANES:
        return f"a pixel's channels go {LANES} at a time (16 bytes); this LayerNormalization has {spec.channels}"
    if spec.channels > MAX_CHANNELS:
        return f"a pixel's channels stay in a warp's registers: at most {MAX_CHANNELS}, this LayerNormalization has {spec.channels}"
    return None


def links_reason(spec: Any, links: int) -> str | None:
    """Why the linked kernel cannot keep these tensors channel-last; None: it can."""
    if not links or links & ~(INPUT | OUTPUT):
        return f"links {links}: {INPUT} (X), {OUTPUT} (Y) or both"
    return channel_reason(spec)


def offered(spec: Any, device: Device) -> ChannelLast | None:
    """X and Y, in any format, on a GPU, for a normalisation the kernel takes; else None."""
    if not device.is_cuda or channel_reason(spec):
        return None
    return ChannelLast(None, frozenset({0}), True)


def linked(spec: Any, fmt: str, inputs: frozenset[int], output: bool) -> LinkedNorm:
    """The configuration that keeps X (where `inputs` holds 0) and Y (where `output`) channel-last in `fmt`;
    a PluginError where the normalisation cannot."""
    return linked_plain(LinkedNorm, fmt, inputs, output, "normalisation", lambda links: links_reason(spec, links))


def linked_config(spec: Any, device: Device, variant: str | None) -> LinkedNorm | None:
    """The configuration a linked normalisation's `variant` names; None for any name of no linked family (the
    plain kernel's are check_one_kernel's to judge); a PluginError for links it cannot keep or no GPU."""
    return named_linked_plain(LinkedNorm, variant, device.is_cuda, "normalisation", lambda links: links_reason(spec, links))


class ChannelLastNorms:
    """Plugin.channel_last, linked_variant, precision_variant, variant_precision and nonfinite_exact_variant for
    the normalisation plugins (their specs NormSpecs; the linked kernel takes a LayerNormalization's alone)."""

    def channel_last(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = ()) -> ChannelLast | None:
        """X and Y channel-last: in any 16-bit format with the plain kernel, in its own with a linked variant (whose
        links the plan makes again)."""
        spec = spec_of(node, self.make_spec)
        if fused or prologue:
            return None
        return plain_offer(offered(spec, device), variant, linked_config(spec, device, variant))

    def linked_variant(self, node: NodeInfo, device: Device, variant: str | None, inputs: frozenset[int], output: bool,
                       format: str, fused: Sequence[NodeInfo] = (), prologue: Sequence[NodeInfo] = ()) -> str:
        check_offered(self.channel_last(node, device, variant, fused, prologue), output, format, f"{node.op_type} {node.name}", variant)
        return linked(spec_of(node, self.make_spec), format, inputs, output).name()

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """None: the plain kernel computes in FP32. Under fp16 or bf16, for a normalisation over the channels on a
        GPU, the reason says whether the step can run in the format of 16-bit neighbours it is linked with
        (plan/channel_last.py), and if not, why."""
        spec = spec_of(node, self.make_spec)
        if precision not in FORMAT_CODES or not device.is_cuda or not normalises_channels(spec):
            return PrecisionChoice(None)
        why = channel_reason(spec)
        if why:
            return PrecisionChoice(None, f"no {precision} kernel for {node.op_type}: {why}")
        return PrecisionChoice(None, f"no {precision} kernel for {node.op_type} alone: it runs in {precision} linked channel-last "
                                     "with 16-bit neighbours")

    def variant_precision(self, node: NodeInfo, device: Device, variant: str | None) -> str:
        """A linked variant's format: it stores its output rounded to it (and reads its X in it); else fp32."""
        config = named_linked_plain(LinkedNorm, variant, True, "normalisation")
        return config.format if config is not None else "fp32"

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        """The plain kernel, on a GPU, for a normalisation the linked kernel may run: one rounding an FP32 result into
        FP16 as it stores may pass its range (linked_kernel.py)."""
        return PLAIN if offered(spec_of(node, self.make_spec), device) is not None else None
