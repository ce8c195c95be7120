"""Links between half-precision Conv steps (wg_fp16, wg_bf16): a tensor one such step writes and only such
steps read stays in the format, channel-last ([N][H][W][C], as a 16-bit value's bits), instead of going out
to FP32 NCHW and back. Each of those steps otherwise reads FP32 NCHW and rewrites it channel-last in the
format before its GEMM, then writes FP32 NCHW: on ResNet-50 in FP16 at batch 32 that is a read, a write and
a read again of every activation at twice the bytes, between every pair of Convs.

A configuration's `links` (its name's `_h` field) says which of its tensors are so: INPUT (X: the step
skips its rewrite and multiplies X as it is), OUTPUT (Y) and RESIDUAL (a fused Add's operand). The plan
makes the links (plan/channel_last.py); a kernel checks that what it is given is what its links say
(ops/channel_last.py, shared with the other ops' linked kernels).
"""
from __future__ import annotations

from ...channel_last import INPUT, OUTPUT
from ..epilogue import Epilogue
from ..spec import ConvSpec

RESIDUAL = 4  # beside X and Y (ops/channel_last.py), a fused Add's operand
TENSOR_NAMES = {INPUT: "X", OUTPUT: "Y", RESIDUAL: "the residual"}
ALL_LINKS = INPUT | OUTPUT | RESIDUAL


def linked_names(links: int) -> list[str]:
    """The tensors `links` keeps channel-last in the format, by name."""
    return [name for bit, name in TENSOR_NAMES.items() if links & bit]


def links_reason(spec: ConvSpec, links: int, epilogue: Epilogue, image_channels: int) -> str | None:
    """Why a half-precision kernel of `spec` cannot keep these tensors channel-last in the format; None: it can.
    `image_channels`: the channels of the channel-last image it multiplies (a stem's padded to a quad)."""
    if links & ~ALL_LINKS:
        return f"links {links}: a sum of {', '.join(f'{bit} ({name})' for bit, name in TENSOR_NAMES.items())}"
    if links & INPUT and image_channels != spec.in_channels:
        return f"X cannot come in channel-last: the kernel pads its {spec.in_channels} channels to {image_channels}"
    if links & INPUT and epilogue.prologue:
        return "X cannot come in channel-last: the kernel applies its prologue as it rewrites X"
    if links & RESIDUAL and not epilogue.residual:
        return "no residual operand to take channel-last: the kernel fuses no Add"
    maps = spec.out_channels // spec.group
    if links & (OUTPUT | RESIDUAL) and maps % 8:
        return f"a pixel's maps go channel-last 8 at a time (16 bytes); this Conv has {maps} a group"
    return None


def link_defines(links: int, half_format: int) -> dict[str, int]:
    """The kernel's macros for its links (conv_implicit_tiles.cuh): the format of y and of the residual kept
    channel-last; a linked X needs none (the rewrite is not launched)."""
    return ({"Y_CHANNEL_LAST": half_format} if links & OUTPUT else {}) | ({"R_CHANNEL_LAST": half_format} if links & RESIDUAL else {})
