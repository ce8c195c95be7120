"""A batch cut into consecutive row ranges: the runtime's chunks and check's slices
are both cut this way (and a batch shared over devices, split_even); neither side imports the other for it."""
from __future__ import annotations

from ..errors import positive_int


def split_rows(batch: int, chunk: int) -> list[slice]:
    """Consecutive row ranges of at most `chunk` rows covering [0, batch)."""
    batch, chunk = positive_int(batch, "batch"), positive_int(chunk, "chunk")
    return [slice(start, min(start + chunk, batch)) for start in range(0, batch, chunk)]


def split_even(batch: int, parts: int) -> list[slice]:
    """At most `parts` consecutive row ranges covering [0, batch), their sizes within one of
    each other (the larger first); fewer ranges when the batch has fewer rows than `parts`."""
    batch, parts = positive_int(batch, "batch"), positive_int(parts, "parts")
    size, larger = divmod(batch, parts)
    ranges, start = [], 0
    for index in range(min(parts, batch)):
        stop = start + size + (index < larger)
        ranges.append(slice(start, stop))
        start = stop
    return ranges
