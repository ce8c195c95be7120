"""When each step and copy of one run happened, on one clock, and how much of the
copy time was hidden behind compute.

On a GPU, kernels and copies are timed by CUDA events and host work (onnxruntime
on the CPU, copies into pinned buffers) by the host clock; both are placed on
one time line that starts at an origin event, recorded on the caller's stream as
the host clock is read, so they line up to within tens of microseconds. The host does
not wait for the origin: each lane's stream does (`CudaLane.start_chunk`), which
also orders what the run enqueued on the caller's stream before it (the NaN/Inf
flags' reset) ahead of the lanes' work. Readings are taken after the run has finished.
"""
from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

from ..gpu import cuda

COPY = "copy"
# a CUDA graph's replay as a whole; its steps have spans of their own (see graphs.py)
GRAPH = "graph"
HOST, DEVICE = "host", "device"


class Span(NamedTuple):
    """One step or copy of one chunk, in milliseconds from the start of the run. (A named
    tuple: a run makes one per step, and a frozen dataclass took three times as long to build.)"""

    name: str
    kind: str  # "plugin", "onnxruntime", "copy" or GRAPH
    chunk: int
    order: int  # position within its chunk
    start_ms: float
    end_ms: float
    lane: int = 0  # the lane (stream) that ran it
    clock: str = HOST  # HOST (timed by the host clock) or DEVICE (by CUDA events on the lane's stream)

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


class Timeline:
    """Collects the spans of one run from every stream and thread."""

    def __init__(self, on_gpu: bool, origin: Any = None):
        """`origin`: the CUDA event to record as the origin (a new one if None), free to record
        again once the spans of the timeline that last used it have been read."""
        self.on_gpu = on_gpu
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._pending: list[tuple[str, str, int, int, Any, Any, int]] = []
        self._settled: list[Span] = []
        self.origin_event = None
        if on_gpu:
            self.origin_event = origin if origin is not None else cuda.event()
            self.origin_event.record()
        self._origin_host = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter()

    def host(self, name: str, kind: str, chunk: int, order: int, start: float, end: float, lane: int = 0) -> None:
        """A span timed by the host clock (perf_counter readings)."""
        with self._lock:
            self._pending.append((name, kind, chunk, order, start, end, lane))

    def device(self, name: str, kind: str, chunk: int, order: int, start: Any, end: Any, lane: int = 0) -> None:
        """A span timed by two recorded CUDA events."""
        with self._lock:
            self._pending.append((name, kind, chunk, order, start, end, lane))

    def device_spans(self, spans: list[tuple[str, str, int, int, Any, Any, int]]) -> None:
        """Spans timed by recorded CUDA events, as `device` takes them, several at once."""
        with self._lock:
            self._pending.extend(spans)

    def device_settled(self, name: str, kind: str, chunk: int, order: int, start: Any, end: Any, lane: int = 0) -> None:
        """A span timed by two CUDA events that have completed and will be recorded again (a
        CUDA graph's own, at its next replay): read now."""
        begin_ms = cuda.elapsed_ms(self.origin_event, start)
        end_ms = cuda.elapsed_ms(self.origin_event, end)
        with self._lock:
            self._settled.append(Span(name, kind, chunk, order, begin_ms, max(begin_ms, end_ms), lane, DEVICE))

    def spans(self) -> list[Span]:
        """Every span, in chunk order and within a chunk in execution order (waits for the device)."""
        self.settle()
        return sorted(self._settled, key=lambda s: (s.chunk, s.order))

    def settle(self, wait: bool = True) -> None:
        """Read every span timed so far (waiting for the device where it must): the events that
        timed them may be recorded again afterwards. Calling it again reads only what came since.
        A second caller waits for the first one's readings (`wait`), or leaves them to it."""
        if not self._reading.acquire(blocking=wait):
            return
        try:
            self._settle()
        finally:
            self._reading.release()

    def _settle(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        if self.on_gpu:
            # each lane's last event, not the whole device: another runner's stream may be capturing
            # a graph (run --devices 0,0), and a device-wide wait is not allowed while one does
            last = {lane: end for _name, _kind, _chunk, _order, start, end, lane in pending if not isinstance(start, float)}
            for end in last.values():
                end.synchronize()
        spans = []
        read: dict[int, float] = {}  # event -> ms: consecutive steps share an event, read once

        def at(event: Any) -> float:
            found = read.get(id(event))
            if found is None:
                found = read[id(event)] = cuda.elapsed_ms(self.origin_event, event)
            return found

        for name, kind, chunk, order, start, end, lane in pending:
            if isinstance(start, float):
                clock = HOST
                begin_ms, end_ms = (start - self._origin_host) * 1e3, (end - self._origin_host) * 1e3
            else:
                clock = DEVICE
                begin_ms, end_ms = at(start), at(end)
            spans.append(Span(name, kind, chunk, order, begin_ms, max(begin_ms, end_ms), lane, clock))
        with self._lock:
            self._settled.extend(spans)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the overlap of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def copy_figures(spans: list[Span]) -> tuple[float, float, float]:
    """(copy, hidden, exposed) in ms. copy: the summed duration of every copy (what the
    copy rows add up to). hidden: time during which some copy ran while a step computed.
    exposed: time during which some copy ran and no step did, which adds to the run's
    wall time. hidden + exposed is less than copy when copies overlapped each other."""
    copies = [(s.start_ms, s.end_ms) for s in spans if s.kind == COPY]
    compute = _union([(s.start_ms, s.end_ms) for s in spans if s.kind != COPY])
    copying = _union(copies)
    hidden = _intersection(copying, compute)
    return sum(end - start for start, end in copies), hidden, max(0.0, _length(copying) - hidden)
