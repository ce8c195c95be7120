"""Arrays as the layout kernels see them: strides in elements, and whether an array is rows
of contiguous runs (what a Concat reads and writes, and what a view into a Concat's buffer is)."""
from __future__ import annotations

from typing import Any


def element_strides(array: Any) -> tuple[int, ...]:
    return tuple(int(s) // array.itemsize for s in array.strides)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= int(extent)
    return tuple(reversed(strides))


def outer_stride(array: Any, axis: int) -> int | None:
    """The stride between consecutive rows of `array` seen as (rows, shape[axis:]) with each row
    one contiguous run, the axes before `axis` folded into the rows; None where it is not
    (then the caller copies it contiguous first). 0 for a single row."""
    shape, strides = tuple(array.shape), element_strides(array)
    expected = contiguous_strides(shape[axis:])
    if any(d != 1 and s != e for d, s, e in zip(shape[axis:], strides[axis:], expected)):
        return None
    lead = [(d, s) for d, s in zip(shape[:axis], strides[:axis]) if d != 1]
    if not lead:
        return 0
    for (_d, s), (d_next, s_next) in zip(lead, lead[1:]):
        if s != d_next * s_next:
            return None
    return lead[-1][1]
