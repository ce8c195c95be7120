"""A Concat along the channels of tensors linked channel-last in a 16-bit format (channel_last.py): uint16
[N][H][W][Ci] in, uint16 [N][H][W][sum Ci] out. It is ConcatKernel's generated copy (kernels.concat_source) with
the pixels as rows and the channels as columns: each input's pixel is one run of Ci values, copied into
[start, start + Ci) of the output's. A thread copies as many channels at once as every width, every start and
every array's address allows, up to 8 (16 bytes); a Concat of multiples of 8 channels copies 16-byte runs."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...errors import PluginError
from ...gpu import cuda
from ..channel_last import channel_last_shape, checked_linked
from .kernels import BLOCK, INT32_LIMIT, LayoutKernel, compiled_concat, concat_source
from .spec import ConcatSpec

# channels a thread copies at once -> the CUDA type of that many 16-bit values, the widest first
UNITS = {8: "uint4", 4: "uint2", 2: "unsigned int", 1: "unsigned short"}


def lanes(widths: Sequence[int], addresses: Sequence[int]) -> int:
    """The most channels (8, 4, 2 or 1) a thread may copy at once: a count that divides every width (and so every
    start) and whose bytes divide every address."""
    return next(n for n in UNITS if all(w % n == 0 for w in widths) and all(a % (2 * n) == 0 for a in addresses))


def linked_concat_source(widths: Sequence[int], n: int, wide: bool) -> str:
    """concat_source for channel-last inputs of `widths` channels, `n` channels an element."""
    units = [w // n for w in widths]
    starts = np.cumsum([0, *units[:-1]])
    segments = [(k, int(start), width) for k, (start, width) in enumerate(zip(starts, units))]
    return concat_source(segments, sum(units), 1, units, sum(units), wide=wide, element=UNITS[n])


class LinkedConcatKernel(LayoutKernel):
    """Concat of channel-last tensors in one launch; call it with every input uint16 [N][H][W][Ci] (contiguous)."""

    out_view = "contiguous"  # __call__ takes a C-contiguous out= (registry.Kernel); never a slice of a larger buffer

    def __init__(self, name: str, bytes_per_image: int, spec: ConcatSpec, size: tuple[int, int], variant: str):
        super().__init__(name, bytes_per_image // 2)  # two bytes a value where the plain kernel moves four
        self.spec, self.size, self.variant = spec, tuple(size), variant

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        if len(inputs) != len(self.spec.widths):
            raise PluginError(f"{self.name}: {len(inputs)} inputs given, the concat takes {len(self.spec.widths)}")
        batch = int(inputs[0].shape[0]) if getattr(inputs[0], "ndim", 0) == 4 else -1
        xs = [checked_linked(cupy, x, (batch, width, *self.size), f"input {k}", self.name)
              for k, (x, width) in enumerate(zip(inputs, self.spec.widths))]
        shape = (batch, sum(self.spec.widths), *self.size)
        with cuda.on_stream(stream):
            if out is None:
                y = cupy.empty(channel_last_shape(shape), dtype=cupy.uint16)
            else:
                checked_linked(cupy, out, shape, "output", self.name)
                if not out.flags.c_contiguous:
                    raise PluginError(f"{self.name}: out must be C-contiguous")
                y = out
            total_values = y.size
            if total_values:
                n = lanes(self.spec.widths, [x.data.ptr for x in xs] + [y.data.ptr])
                wide = total_values // n > INT32_LIMIT
                launch = self._remembered((n, wide), lambda: compiled_concat(linked_concat_source(self.spec.widths, n, wide), (),
                                                                             "layout_concat"))
                elements = total_values // n
                launch((-(-elements // BLOCK),), (BLOCK,), (*xs, y, np.int64(elements)))
        return [y]
