"""Host-side bulk work split over a few threads: copies into and out of pinned
buffers, and filling large arrays with random data.

One thread copies memory at a fraction of what the memory system delivers; numpy
releases the GIL for plain copies and random fills, so a few threads together
get close to it. The runtime's copies and data's random inputs share one pool,
which lives for the process.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

# Pieces smaller than this are not worth a thread hand-off.
MIN_PIECE_BYTES = 4 << 20
THREADS = max(1, min(8, os.cpu_count() or 1))

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="opplugin-host")
        return _pool


def pieces(length: int, item_bytes: int, min_piece_bytes: int = MIN_PIECE_BYTES) -> list[slice]:
    """Ranges over [0, length) of at least `min_piece_bytes` each, at most one per thread; one
    empty range where there is nothing (a tensor with an axis of size 0)."""
    if length <= 0:
        return [slice(0, 0)]
    total = length * max(1, item_bytes)
    count = int(max(1, min(THREADS, total // max(1, min_piece_bytes), length)))
    step = -(-length // count)
    return [slice(start, min(start + step, length)) for start in range(0, length, step)]


def for_pieces(length: int, item_bytes: int, work: Callable[[slice], None], min_piece_bytes: int = MIN_PIECE_BYTES) -> None:
    """Call work(piece) for pieces covering [0, length), in parallel when there is enough work."""
    parts = pieces(length, item_bytes, min_piece_bytes)
    if len(parts) == 1:
        work(parts[0])
        return
    for future in [pool().submit(work, part) for part in parts]:
        future.result()


def copy(destination: np.ndarray, source: np.ndarray) -> None:
    """destination[...] = source, split along the first axis over the pool's threads."""
    if destination.shape != source.shape:
        raise ValueError(f"copy: shapes differ, {destination.shape} and {source.shape}")
    if destination.ndim == 0 or destination.shape[0] == 0:
        np.copyto(destination, source)
        return
    row_bytes = destination.nbytes // destination.shape[0]
    for_pieces(destination.shape[0], row_bytes, lambda part: np.copyto(destination[part], source[part]))
