"""Links between half-precision Conv steps (wg_fp16, wg_bf16, dw_fp16, dw_bf16): a tensor one such step writes and
only such steps read stays in the format, channel-last ([N][H][W][C], as a 16-bit value's bits), instead of going
out to FP32 NCHW and back. Each of those steps otherwise reads FP32 NCHW and rewrites it channel-last in the
format before its GEMM (or rounds each value as it loads it: the depthwise kernel), then writes FP32 NCHW: on
ResNet-50 in FP16 at batch 32 that is a read, a write and a read again of every activation at twice the bytes,
between every pair of Convs.

A configuration's `links` (its name's `_h` field) says which of its tensors are so: INPUT (X: the step
skips its rewrite and multiplies X as it is), OUTPUT (Y) and RESIDUAL (a fused Add's operand). A family says
which it can make on a Conv (Family.channel_last_links), the plan makes them (plan/channel_last.py), and a
kernel checks that what it is given is what its links say (LinkedTensors, through ops/channel_last.py, shared
with the other ops' linked kernels).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...channel_last import INPUT, OUTPUT, channel_last_shape, checked_linked
from ..epilogue import RESIDUAL_INPUT, Epilogue

RESIDUAL = 4  # beside X and Y (ops/channel_last.py), a fused Add's operand
TENSOR_NAMES = {INPUT: "X", OUTPUT: "Y", RESIDUAL: "the residual"}
ALL_LINKS = INPUT | OUTPUT | RESIDUAL


def linked_names(links: int) -> list[str]:
    """The tensors `links` keeps channel-last in the format, by name."""
    return [name for bit, name in TENSOR_NAMES.items() if links & bit]


def links_reason(links: int, epilogue: Epilogue) -> str | None:
    """Why no half-precision kernel can keep these tensors channel-last in the format; None: a kernel that
    stores whole 16-byte runs of a pixel's maps can (each family adds its own limits)."""
    if links & ~ALL_LINKS:
        return f"links {links}: a sum of {', '.join(f'{bit} ({name})' for bit, name in TENSOR_NAMES.items())}"
    if links & RESIDUAL and not epilogue.residual:
        return "no residual operand to take channel-last: the kernel fuses no Add"
    return None


def possible_links(reason: Callable[[int], str | None]) -> int:
    """The links a kernel can make, each tensor on its own: those `reason` (of a links value) finds no fault with."""
    return sum(bit for bit in TENSOR_NAMES if reason(bit) is None)


def link_defines(links: int, half_format: int) -> dict[str, int]:
    """The kernel's macros for its links (conv_implicit_tiles.cuh, conv_depthwise_half.cu): the format of y and of the
    residual kept channel-last; a linked X needs none in the GEMM (its rewrite is not launched), and the depthwise
    kernel, which loads X itself, adds X_CHANNEL_LAST."""
    return ({"Y_CHANNEL_LAST": half_format} if links & OUTPUT else {}) | ({"R_CHANNEL_LAST": half_format} if links & RESIDUAL else {})


class LinkedTensors:
    """What a half-precision Conv kernel whose configuration links tensors (`_links`) takes and gives: a linked X,
    residual operand and output as the format's bits channel-last (checked_linked), the others as ConvKernel
    takes them. Mixed in before ConvKernel (or a subclass of it), which supplies the rest."""

    _links = 0

    def bytes_moved(self, batch: int) -> int:
        """As ConvKernel's, with two bytes a value of each linked tensor rather than four."""
        saved = 0
        if self._links & INPUT:
            saved += 2 * batch * self.spec.in_channels * self.spec.in_size[0] * self.spec.in_size[1]
        outputs = int(np.prod(self.spec.output_shape(batch)))
        saved += 2 * outputs * bin(self._links & (OUTPUT | RESIDUAL)).count("1")
        return super().bytes_moved(batch) - saved

    def _checked_input(self, cupy, x):
        if not self._links & INPUT:
            return super()._checked_input(cupy, x)
        return checked_linked(cupy, x, (x.shape[0] if getattr(x, "ndim", 0) == 4 else -1, *self._input_image), "input X", self.name)

    def _input_array(self, cupy, x):
        if not self._links & INPUT:
            return super()._input_array(cupy, x)
        if x.dtype == cupy.uint16:  # only _checked_input passes one (the common check takes FP32 alone): checked
            return x
        # the common check passes an FP32 NCHW X of the Conv's shape: the format's bits are what this one takes
        return checked_linked(cupy, x, (x.shape[0], *self._input_image), "input X", self.name)

    def _residual_arg(self, cupy, inputs, batch):
        if not self._links & RESIDUAL:
            return super()._residual_arg(cupy, inputs, batch)
        r = inputs[RESIDUAL_INPUT] if len(inputs) > RESIDUAL_INPUT else None
        return checked_linked(cupy, r, self.spec.output_shape(batch), "the residual operand", self.name)

    def _output(self, cupy, out, batch):
        if not self._links & OUTPUT:
            return super()._output(cupy, out, batch)
        shape = channel_last_shape(self.output_shape(batch))
        if out is None:
            return cupy.empty(shape, dtype=cupy.uint16)
        return checked_linked(cupy, out, self.output_shape(batch), "output", self.name)
