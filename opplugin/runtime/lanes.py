"""Lanes: where the work of one chunk runs, with its copies and timings.

A `HostLane` runs everything on the CPU in the calling thread. A `CudaLane` owns
a CUDA stream and pinned staging buffers: a chunk's input goes up by DMA (from
the caller's array when it is already pinned, else through a staging buffer
filled by a few threads), its kernels run on the lane's stream, and its outputs
come down into a staging buffer that is copied out once the lane has waited
for its stream. Several lanes work at once, each on its own chunk, so one
chunk's copies overlap another's compute.

Copies in one direction go through one copy engine in enqueue order anyway;
`Chains` makes that order explicit across lanes (each copy waits for the one
enqueued before it), so the events around a copy time that copy alone. Each
lane's run of kernels waits for the previous run likewise, so a kernel's events
do not count time it spent queued behind another lane's kernels.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from ..gpu import cuda
from ..core import host_threads
from .graphs import SegmentGraphs
from .output_reuse import PreboundOutputs
from .eager_replay import StepReplays
from .timeline import COPY, GRAPH, Timeline

# Pageable inputs below this size go up directly: the driver's own staging is as quick.
STAGE_MIN_BYTES = 1 << 20
# what a lane working alone orders its copies and kernels with: its stream does it (made once, reentrant)
_UNORDERED = contextlib.nullcontext()


class Chains:
    """Per kind of work ("h2d", "d2h", "compute"), the event of the last item any lane enqueued."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, Any] = {}
        self._shared = True  # whether more than one lane works in this run

    def reset(self, lanes: int = 2) -> None:
        """A new run, on `lanes` lanes at once: with one, its stream keeps the order by itself."""
        with self._lock:
            self._last.clear()
            self._shared = lanes > 1

    def ordered(self, chain: str, stream: Any, events: "EventPool") -> contextlib.AbstractContextManager:
        """Work enqueued inside starts after the previous item of `chain` has finished. The event
        that marks its end comes from the enqueuing lane's `events` (recorded again next run)."""
        return self._ordered(chain, stream, events) if self._shared else _UNORDERED

    @contextlib.contextmanager
    def _ordered(self, chain: str, stream: Any, events: "EventPool") -> Iterator[None]:
        with self._lock:
            previous = self._last.get(chain)
            if previous is not None:
                stream.wait_event(previous)
            yield
            self._last[chain] = events.record(stream)


class EventPool:
    """The timing events of one lane, made once and recorded again run after run. Runs take
    turns between two sets: a run's events stay as they were through the next run, which
    reads them while it waits for the device (see Runner._run_chunks); the run after that
    records them again. Creating an event costs the host more than recording one."""

    def __init__(self) -> None:
        self._sets: tuple[list[Any], list[Any]] = ([], [])
        self._events = self._sets[0]
        self._used = 0

    def record(self, stream: Any) -> Any:
        if self._used == len(self._events):
            self._events.append(cuda.event())
        event = self._events[self._used]
        self._used += 1
        event.record(stream)
        return event

    def take(self, count: int) -> list[Any]:
        """`count` events for the caller to record (by their pointers), in order."""
        while len(self._events) < self._used + count:
            self._events.append(cuda.event())
        taken = self._events[self._used: self._used + count]
        self._used += count
        return taken

    def rewind(self, generation: int) -> None:
        """A new run starts, with the set of `generation` (0 or 1): the run before the last one's
        timings have been read, and its events may be recorded again."""
        self._events = self._sets[generation % 2]
        self._used = 0


class _Recording:
    """The run and chunk a lane is working on, and the position of its next span."""

    def __init__(self, lane: int = 0) -> None:
        self.lane = lane  # the lane's number, which names its track in a trace
        self.timeline: Timeline | None = None
        self.chunk = 0
        self.order = 0

    def start(self, timeline: Timeline, chunk: int) -> None:
        self.timeline, self.chunk, self.order = timeline, chunk, 0

    def next(self) -> int:
        self.order += 1
        return self.order

    def host_timed(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        order = self.next()
        begin = self.timeline.now()
        out = fn()
        self.timeline.host(name, kind, self.chunk, order, begin, self.timeline.now(), self.lane)
        return out


class Lane(Protocol):
    """Where one chunk at a time runs: what the executor, the scheduler and the runner use."""

    on_device: bool  # tensors live on a CUDA device (else numpy arrays on the host)
    stream: Any  # the CUDA stream its work goes on (None on the host)
    device_id: int | None
    graphs: SegmentGraphs  # runs of plugin steps captured as CUDA graphs on this lane (none on the host)
    prebound: PreboundOutputs | None  # eager steps' output arrays kept for the next run (none on the host)
    replays: StepReplays | None  # eager steps' launches on those arrays, replayed next run (none on the host)

    def activate(self) -> contextlib.AbstractContextManager:
        """Makes this lane current in the calling thread for the time of a run."""
        ...

    def start_chunk(self, timeline: Timeline, chunk: int, copies_timed: bool = True) -> None:
        """A chunk starts on this lane; with `copies_timed` off its copies get no spans."""
        ...

    def upload(self, name: str, rows: np.ndarray, pinned: bool, reuse: bool = False, into: Any = None) -> Any:
        """A chunk's input rows where its kernels read them: in `into` where given and of their
        shape (a CUDA graph's input buffer); with `reuse`, in the array they went into last time
        at this shape (an eager run's replays find them there)."""
        ...

    def to_host(self, name: str, value: Any) -> np.ndarray:
        """A host copy of a tensor for host work (onnxruntime's CPU provider)."""
        ...

    def to_device(self, name: str, value: np.ndarray) -> Any:
        """A host result where the kernels read it."""
        ...

    def download(self, name: str, value: Any, target: np.ndarray, staged: bool) -> None:
        """Copy a tensor into `target` (a host view), complete after finish_chunk()."""
        ...

    def segment(self) -> contextlib.AbstractContextManager:
        """A run of kernels enqueued together."""
        ...

    def run_kernel(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        """fn(), which enqueues device work, timed as step `name`."""
        ...

    def run_host(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        """fn(), which enqueues no device work, timed by the host clock."""
        ...

    def run_graph(self, name: str, step_marks: Sequence[tuple[str, Any, Any]], fn: Callable[[], Any], kind: str = GRAPH) -> Any:
        """fn(), which replays CUDA graph `name`: timed as a whole, a span of `kind` (GRAPH, or
        "plugin" where the replay is a step of its own), and each of its steps by the events
        the graph records (`step_marks`: step, start, end), if any."""
        ...

    def run_replayed(self, names: Sequence[str], replays: Sequence[Callable[[], None]]) -> None:
        """Plugin steps `names` replayed from their recorded launches (eager_replay.py), each timed as a step."""
        ...

    def untimed(self, fn: Callable[[], Any]) -> Any:
        """fn(), device work between steps that belongs to none (a NaN/Inf flag)."""
        ...

    def start_run(self, generation: int = 0) -> None:
        """A new run starts, timed with the event set of `generation` (0 or 1): the timings of
        the last run that used it have been read."""
        ...

    def run_blocking(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        """fn(), host work that reads the lane's results so far, timed by the host clock."""
        ...

    def finish_chunk(self, while_waiting: Callable[[], None] | None = None) -> None:
        """The chunk's work is done once this returns; `while_waiting` is host work done
        while the device finishes it."""
        ...

    def staging_bytes(self) -> int:
        """Bytes of pinned staging memory this lane holds."""
        ...


class _Current:
    """A device and stream made current in the calling thread, and the earlier ones again after:
    a plain context manager, which a run at batch 1 finds quicker than an ExitStack of two."""

    __slots__ = ("_device", "_stream")

    def __init__(self, device_id: int, stream: Any):
        import cupy

        self._device, self._stream = cupy.cuda.Device(device_id), stream

    def __enter__(self) -> "_Current":
        self._device.__enter__()
        self._stream.__enter__()
        return self

    def __exit__(self, *error: Any) -> None:
        self._stream.__exit__(*error)
        self._device.__exit__(*error)


class HostLane(Lane):
    """Runs a chunk on the CPU: no copies, host-clock timings."""

    on_device = False
    stream = None
    device_id = None

    def __init__(self, index: int = 0) -> None:
        self.recording = _Recording(index)
        self.graphs = SegmentGraphs()  # stays empty: CUDA graphs need a device
        self.prebound = None  # numpy outputs are cheap to allocate
        self.replays = None

    def activate(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def start_chunk(self, timeline: Timeline, chunk: int, copies_timed: bool = True) -> None:
        self.recording.start(timeline, chunk)

    def upload(self, name: str, rows: np.ndarray, pinned: bool, reuse: bool = False, into: Any = None) -> np.ndarray:
        return rows

    def to_host(self, name: str, value: np.ndarray) -> np.ndarray:
        return value

    def to_device(self, name: str, value: np.ndarray) -> np.ndarray:
        return value

    def download(self, name: str, value: np.ndarray, target: np.ndarray, staged: bool) -> None:
        host_threads.copy(target, np.asarray(value))

    def segment(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def run_kernel(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        # NaN and Inf in the data are results to pass on, as onnxruntime does, not warnings
        with np.errstate(all="ignore"):
            return self.recording.host_timed(name, kind, fn)

    def run_blocking(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        return self.recording.host_timed(name, kind, fn)

    run_host = run_kernel

    def run_graph(self, name: str, step_marks: Sequence[tuple[str, Any, Any]], fn: Callable[[], Any], kind: str = GRAPH) -> Any:
        raise RuntimeError("CUDA graphs need a CUDA device")

    def run_replayed(self, names: Sequence[str], replays: Sequence[Callable[[], None]]) -> None:
        raise RuntimeError("recorded launches need a CUDA device")

    def untimed(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def start_run(self, generation: int = 0) -> None:
        pass

    def finish_chunk(self, while_waiting: Callable[[], None] | None = None) -> None:
        if while_waiting is not None:
            while_waiting()

    def staging_bytes(self) -> int:
        return 0


class PinnedStaging:
    """Named page-locked buffers of one lane, grown to the largest chunk seen and then reused."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def view(self, key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = self._buffers.get(key)
        if buffer is None or buffer.nbytes < nbytes:
            self._buffers.pop(key, None)  # free the smaller one first: pinned memory is scarce
            buffer = cuda.pinned_empty((max(nbytes, 1),), np.uint8)
            self._buffers[key] = buffer
        return buffer[:nbytes].view(dtype).reshape(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())


class CudaLane(Lane):
    """Runs a chunk on one CUDA stream, with its own pinned staging buffers."""

    on_device = True

    def __init__(self, device_id: int, chains: Chains, index: int = 0):
        self.device_id = device_id
        self.stream = cuda.new_stream()
        self.chains = chains
        self.staging = PinnedStaging()
        self.recording = _Recording(index)
        self._unstage: list[tuple[str, np.ndarray, np.ndarray]] = []
        self._copies_timed = True
        self.graphs = SegmentGraphs()  # runs of plugin steps captured on this lane's stream
        self.prebound = PreboundOutputs()  # eager steps' outputs, reused run after run
        self.replays = StepReplays()  # and the launches that wrote them, made again from packed arguments
        # the steps of this chunk's replays: (step, order, start, end), read once the stream is done
        self._graph_steps: list[tuple[str, int, Any, Any]] = []
        self.events = EventPool()
        # the end event of the kernel step just enqueued: the next one starts there, since nothing
        # runs on the stream between two steps of a segment (None after any other work)
        self._step_end: Any = None

    def activate(self) -> contextlib.AbstractContextManager:
        """Makes this lane's device and stream current in the calling thread."""
        return _Current(self.device_id, self.stream)

    def start_chunk(self, timeline: Timeline, chunk: int, copies_timed: bool = True) -> None:
        """A chunk starts here; `copies_timed` off, its copies get no events (the quickest run)."""
        if self.recording.timeline is not timeline and timeline.origin_event is not None:
            self.stream.wait_event(timeline.origin_event)  # the run's first chunk here: nothing of it before the origin
        self.recording.start(timeline, chunk)
        self._copies_timed = copies_timed
        self._unstage.clear()
        self._graph_steps.clear()

    # --- timing ---------------------------------------------------------------------

    def _event_timed(self, name: str, kind: str, fn: Callable[[], Any], start: Any = None) -> Any:
        self._step_end = None
        order = self.recording.next()
        start = start if start is not None else self.events.record(self.stream)
        out = fn()
        end = self.events.record(self.stream)
        self.recording.timeline.device(name, kind, self.recording.chunk, order, start, end, self.recording.lane)
        return out, end

    def _chained_copy(self, chain: str, name: str, fn: Callable[[], Any]) -> None:
        with self.chains.ordered(chain, self.stream, self.events):
            self._copy(name, fn)

    def _copy(self, name: str, fn: Callable[[], Any]) -> None:
        """A copy, timed by events unless this chunk's copies are not (start_chunk)."""
        if self._copies_timed:
            self._event_timed(name, COPY, fn)
        else:
            self._step_end = None
            fn()

    @contextlib.contextmanager
    def segment(self) -> Iterator[None]:
        """A run of kernels that starts after the previous lane's run has finished."""
        self._step_end = None
        with self.chains.ordered("compute", self.stream, self.events):
            yield
        self._step_end = None

    def run_kernel(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        out, self._step_end = self._event_timed(name, kind, fn, start=self._step_end)
        return out

    def run_replayed(self, names: Sequence[str], replays: Sequence[Callable[[], None]]) -> None:
        """Plugin steps replayed from their recorded launches (eager_replay.py), back to back, each timed
        by the CUDA events recorded between them, as run_kernel times a step: one loop for them all."""
        import cupy

        record, stream = cupy.cuda.runtime.eventRecord, self.stream.ptr
        start = self._step_end
        events = self.events.take(len(names) + (start is None))
        if start is None:
            start, events = events[0], events[1:]
            record(start.ptr, stream)
        recording = self.recording
        spans = []
        for name, replay, end in zip(names, replays, events):
            replay()
            record(end.ptr, stream)
            spans.append((name, "plugin", recording.chunk, recording.next(), start, end, recording.lane))
            start = end
        recording.timeline.device_spans(spans)
        self._step_end = start

    def run_host(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        """Work that enqueues nothing on the device (a reshape view), timed by the host clock."""
        self._step_end = None
        return self.recording.host_timed(name, kind, fn)

    def untimed(self, fn: Callable[[], Any]) -> Any:
        self._step_end = None
        return fn()

    def start_run(self, generation: int = 0) -> None:
        self.events.rewind(generation)
        self._step_end = None

    def run_graph(self, name: str, step_marks: Sequence[tuple[str, Any, Any]], fn: Callable[[], Any], kind: str = GRAPH) -> Any:
        """A replay, timed as a whole (a span of `kind`) and per step by the graph's own events, if
        it has them. Those are recorded again by the next replay of the graph, which on this lane
        comes in a later chunk: finish_chunk reads them after waiting for the stream."""
        out, _end = self._event_timed(name, kind, fn)
        if step_marks:
            self._graph_steps.extend((step, self.recording.next(), start, end) for step, start, end in step_marks)
        return out

    def run_blocking(self, name: str, kind: str, fn: Callable[[], Any]) -> Any:
        """Host work that reads this lane's device results (onnxruntime): wait for them first."""
        self._step_end = None
        self.stream.synchronize()
        return self.recording.host_timed(name, kind, fn)

    # --- copies ---------------------------------------------------------------------

    def upload(self, name: str, rows: np.ndarray, pinned: bool, reuse: bool = False, into: Any = None) -> Any:
        """A device copy of input rows: by DMA straight from pinned rows, else through
        this lane's staging buffer (filled by a few threads), small ones directly. It lands
        in `into` where that fits (a CUDA graph's input buffer: no copy at the replay), else
        with `reuse` in the array the rows went into last time (_input_buffer), else in a new one."""
        import cupy

        source = rows
        if not rows.flags.c_contiguous or (not pinned and rows.nbytes >= STAGE_MIN_BYTES):
            source = self.staging.view(f"in {name}", rows.shape, rows.dtype)
            self.recording.host_timed(f"stage H2D {name}", COPY, lambda: host_threads.copy(source, rows))
        if into is not None and tuple(into.shape) == rows.shape and into.dtype == rows.dtype and into.flags.c_contiguous:
            device = into
        elif reuse:
            device = self._input_buffer(cupy, name, rows.shape, rows.dtype)
        else:
            device = cupy.empty(rows.shape, rows.dtype)
        if rows.nbytes:
            self._chained_copy("h2d", f"copy H2D {name}",
                               lambda: device.data.copy_from_host_async(source.ctypes.data, rows.nbytes, self.stream))
        return device

    def _input_buffer(self, cupy: Any, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The array input `name` went up into last time at this shape, kept with the prebound outputs
        (within their budget), so that the steps reading it find it where they did (eager_replay.py). Safe
        for the reason reusing those is: everything that read it was enqueued on this stream."""
        key, size = ("input", name), (tuple(shape), np.dtype(dtype))
        kept = self.prebound.get(key, size)
        if kept is None:
            kept = cupy.empty(shape, dtype)
            self.prebound.keep(key, size, kept)
        return kept

    def to_host(self, name: str, value: Any) -> np.ndarray:
        """A host copy of a device tensor for host work (onnxruntime's CPU provider).
        It lands in this lane's pinned staging buffer, which the host work reads in
        place: valid until the lane's next chunk."""
        import cupy

        value = cupy.ascontiguousarray(value)
        host = self.staging.view(f"host {name}", value.shape, value.dtype)
        if value.nbytes:
            self._chained_copy("d2h", f"copy D2H {name}",
                               lambda: value.data.copy_to_host_async(host.ctypes.data, value.nbytes, self.stream))
            self.stream.synchronize()
        return host

    def to_device(self, name: str, value: np.ndarray) -> Any:
        """A device copy of a host result (onnxruntime's CPU provider), staged like an input."""
        return self.upload(name, np.ascontiguousarray(value), pinned=False)

    def download(self, name: str, value: Any, target: np.ndarray, staged: bool) -> None:
        """Copy a device tensor into `target` (a host view), complete after finish_chunk()."""
        import cupy

        value = cupy.ascontiguousarray(value)
        if tuple(value.shape) != tuple(target.shape) or not target.flags.c_contiguous:
            raise ValueError(f"download of {name}: device shape {value.shape} does not fit the host view {target.shape}")
        if not value.nbytes:
            return
        if staged:
            stage = self.staging.view(f"out {name}", value.shape, value.dtype)
            self._chained_copy("d2h", f"copy D2H {name}",
                               lambda: value.data.copy_to_host_async(stage.ctypes.data, value.nbytes, self.stream))
            self._unstage.append((name, stage, target))
        else:
            self._copy(f"copy D2H {name}", lambda: value.data.copy_to_host_async(target.ctypes.data, value.nbytes, self.stream))

    def finish_chunk(self, while_waiting: Callable[[], None] | None = None) -> None:
        """Wait for the lane's stream (doing `while_waiting` first), then copy staged outputs to their targets."""
        if while_waiting is not None:
            while_waiting()
        self.stream.synchronize()
        recording = self.recording
        for step, order, start, end in self._graph_steps:
            recording.timeline.device_settled(step, "plugin", recording.chunk, order, start, end, recording.lane)
        self._graph_steps.clear()
        for name, stage, target in self._unstage:
            self.recording.host_timed(f"stage D2H {name}", COPY, lambda s=stage, t=target: host_threads.copy(t, s))
        self._unstage.clear()

    def staging_bytes(self) -> int:
        return self.staging.nbytes
