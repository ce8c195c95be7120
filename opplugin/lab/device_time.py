"""The device time of one call of a short kernel, launched from Python.

A call shorter than the host's ~20 µs to launch it would otherwise be timed as the host's launch:
the GPU idles between calls and the events see the gaps. So such calls are timed CALLS at a time
behind a fill of a large `ballast` array, which keeps the GPU busy while the host enqueues them."""
from __future__ import annotations

import statistics
from typing import Any, Callable

from ..gpu import cuda

BALLAST_BYTES = 2 << 30  # ~0.7 ms of fill on a Hopper GPU: longer than the host takes to enqueue the timed calls
CALLS = 10  # calls per sample behind the fill, for calls shorter than HOST_BOUND_MS
HOST_BOUND_MS = 0.5


def make_ballast() -> Any:
    import cupy

    return cupy.empty(BALLAST_BYTES // 4, dtype=cupy.float32)


def device_ms(fn: Callable[[], Any], warmup: int, repeat: int, ballast: Any) -> float:
    """Median device time of one call of fn(), which launches its work on the current stream."""
    alone = statistics.median(cuda.time_ms(fn, warmup=warmup, repeat=3))
    if alone >= HOST_BOUND_MS:
        return statistics.median(cuda.time_ms(fn, warmup=0, repeat=repeat))
    start, end = cuda.event(), cuda.event()
    samples = []
    for _ in range(repeat):
        ballast.fill(0)
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        samples.append(cuda.elapsed_ms(start, end) / CALLS)
    return statistics.median(samples)
