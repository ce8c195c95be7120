"""A batch cut into consecutive row ranges: the runtime's chunks and check's slices
are both cut this way, and neither side imports the other for it."""
from __future__ import annotations

from .errors import positive_int


def split_rows(batch: int, chunk: int) -> list[slice]:
    """Consecutive row ranges of at most `chunk` rows covering [0, batch)."""
    batch, chunk = positive_int(batch, "batch"), positive_int(chunk, "chunk")
    return [slice(start, min(start + chunk, batch)) for start in range(0, batch, chunk)]
