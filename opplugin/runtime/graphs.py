"""CUDA graphs for runs of plugin steps: each kernel launch costs the host tens of
microseconds of Python, which at batch 1 is longer than the kernel itself. A run of
consecutive plugin steps is captured once (per lane and chunk size) into a CUDA graph and
replayed after that as a single launch.

A graph bakes in every device address it touched, so:
- the run's inputs from outside (a chunk's upload, an onnxruntime step's output) are copied
  into the graph's own input buffers before each replay; the runner's constants stay put
  for its lifetime and are read in place;
- what the kernels allocate during the capture comes from a memory pool of the graph's
  own, which nothing else draws on afterwards, so a buffer the capture freed and reused is
  the graph's alone; its outputs are arrays of that pool, overwritten by the next replay
  on the same lane (a lane finishes a chunk before it starts the next).

A run is captured the second time it is met, so the first pass runs eagerly: it compiles
and loads what the kernels need lazily. A run whose capture fails (a kernel that
synchronises, say) stays eager, and the reason is kept.

Each step keeps its own time inside a replay: the capture records CUDA events between the
steps as nodes of the graph (`StepClock`, cudaEventRecordExternal), so every replay records
them again, and the step spans are read from them once the lane has waited for the replay.
The replay itself is timed as one span of kind GRAPH too (its input copies included), which
the step table leaves out. Where events cannot be recorded in a capture, a replay is one
span of kind "plugin", a row of its own.

Those event nodes cost the device several microseconds each, so a run of steps may have two
graphs: a timed one (with the event nodes) and an untimed one, captured over the same input
buffers and the same memory pool. A run asks for one or the other (Runner.run's
`step_times`): `profile` times host to host with untimed replays and takes the step table
from timed ones. An untimed graph's kernels that await the previous grid are launched
programmatically (gpu/dependent_launch.py): each may start while the kernel before it
ends. The two never run at once (one lane, one chunk at a time), so they may share the
pool's blocks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import first_line
from ..gpu import dependent_launch
from .nonfinite import slot_runs


@dataclass(frozen=True)
class SegmentGraph:
    """One captured run of plugin steps: its graph, its input buffers and its outputs."""

    name: str  # the span's name in the timeline: "graph FIRST..LAST (N steps)"
    steps: tuple[str, ...]
    graph: Any
    inputs: dict[str, Any]  # outside tensor -> the buffer the graph reads it from
    outputs: dict[str, Any]  # tensor -> the array the graph writes it to
    pool: Any  # the graph's own memory pool: alive as long as the graph
    # the NaN/Inf flags of the run's watched outputs, which the graph zeroes and raises (nonfinite.raise_flag,
    # or the step's kernel as it stores: Kernel.flags_nonfinite),
    # and the flag columns they are copied to after each replay: (first column, first flag, count) runs
    flags: Any = None
    flag_runs: tuple[tuple[int, int, int], ...] = ()
    # each step's (name, start event, end event), recorded by the graph at every replay (see StepClock)
    step_marks: tuple[tuple[str, Any, Any], ...] = ()
    timed: bool = True  # captured with the step events (which it may still lack: see can_record_in_capture)

    def replay(self, values: dict[str, Any], stream: Any) -> dict[str, Any]:
        """Copy the outside inputs in, launch the graph on `stream`; returns the outputs."""
        for name, buffer in self.inputs.items():
            value = values[name]
            if value.data.ptr != buffer.data.ptr and value.nbytes:
                buffer.data.copy_from_device_async(value.data, value.nbytes, stream)
        self.graph.launch(stream)
        return self.outputs


# a run of steps as one lane meets it: its first step, the chunk's rows, and the tensors among
# its steps' outputs that the run must return although no later step reads them (kept ones)
GraphKey = tuple[int, int, frozenset]


class SegmentGraphs:
    """The graphs of one lane, by key (GraphKey) and whether they time their steps,
    and the runs that could not be captured. A run gets its graph the second time it is met
    (see `due`); its timed and untimed graphs are captured as runs ask for them."""

    def __init__(self) -> None:
        self._graphs: dict[tuple[int, int, frozenset, bool], SegmentGraph] = {}
        self._seen: set[GraphKey] = set()
        self._failed: dict[GraphKey, str] = {}

    def get(self, key: GraphKey, timed: bool = True) -> SegmentGraph | None:
        return self._graphs.get((*key, timed))

    def sibling(self, key: GraphKey, timed: bool) -> SegmentGraph | None:
        """The run's graph of the other kind, whose input buffers and pool a new capture shares."""
        return self._graphs.get((*key, not timed))

    def due(self, key: GraphKey, timed: bool = True) -> bool:
        """Whether to capture the run at `key` (timed or not) now: not the first time it is met
        (that pass runs eagerly), nor after its capture failed, nor when it has that graph."""
        if key in self._failed or (*key, timed) in self._graphs:
            return False
        if key not in self._seen:
            self._seen.add(key)
            return False
        return True

    def add(self, key: GraphKey, segment: SegmentGraph) -> None:
        self._graphs[(*key, segment.timed)] = segment

    def fail(self, key: GraphKey, why: str) -> None:
        """The run at `key` cannot be captured (`why`): it stays eager."""
        self._failed[key] = why

    def captured(self) -> list[GraphKey]:
        """The keys of the runs that have a graph."""
        return list(dict.fromkeys(key[:-1] for key in self._graphs))

    def failures(self) -> dict[GraphKey, str]:
        return dict(self._failed)

    def named_steps(self) -> dict[str, tuple[str, ...]]:
        """Each graph's span name -> the plan steps it runs."""
        return {segment.name: segment.steps for segment in self._graphs.values()}

    def clear(self) -> None:
        self._graphs.clear()
        self._seen.clear()
        self._failed.clear()


def graph_name(step_names: Sequence[str]) -> str:
    first, last = step_names[0], step_names[-1]
    return f"graph {first}" if len(step_names) == 1 else f"graph {first}..{last} ({len(step_names)} steps)"


class StepClock:
    """Events recorded between the steps of a capture, as nodes of the graph. Consecutive steps
    share an event; untimed work between two steps (a NaN/Inf flag) breaks the chain, so it
    counts in neither, as in an eager run. Without a stream it records nothing."""

    def __init__(self, stream: Any = None):
        self.stream = stream
        self.marks: list[tuple[str, Any, Any]] = []
        self._last: Any = None  # the event the next step starts at, if it follows a step directly
        self._started: Any = None

    def start(self) -> None:
        if self.stream is not None:
            self._started = self._last if self._last is not None else self._record()

    def stop(self, step: str) -> None:
        if self.stream is not None:
            self._last = self._record()
            self.marks.append((step, self._started, self._last))

    def pause(self) -> None:
        """Untimed work follows: the next step gets an event of its own."""
        self._last = None

    def _record(self) -> Any:
        from ..gpu import cuda

        event = cuda.event()
        cuda.record_in_capture(event, self.stream)
        return event


def capture(
    step_names: Sequence[str],
    outside: dict[str, Any],
    run_steps: Callable[[dict[str, Any], StepClock], dict[str, Any]],
    stream: Any,
    flags: Any = None,
    flag_slots: Sequence[int] = (),
    timed: bool = True,
    sibling: SegmentGraph | None = None,
) -> SegmentGraph:
    """Captures `run_steps(values, clock)` on `stream` into a graph. `outside` maps each tensor the
    run reads from outside (its current device array) to be copied into an input buffer; the
    rest of what it reads (constants) must keep its address. `run_steps` enqueues the steps'
    kernels, each between clock.start() and clock.stop(name) (which record events into the
    graph when `timed`), and returns the tensors the graph must keep (those read after the
    run); it writes the NaN/Inf `flags` of the watched outputs, if any, for `flag_slots`.
    With `sibling` (the same run's graph of the other kind), the new graph reads the sibling's
    input buffers and draws on its pool."""
    import cupy

    from ..gpu import cuda

    if sibling is not None:
        inputs, pool = sibling.inputs, sibling.pool
    else:
        inputs, pool = {name: cupy.empty_like(value) for name, value in outside.items()}, cupy.cuda.MemoryPool()
    clock = StepClock(stream if timed else None)
    # an untimed graph's kernels may start while the one before them ends; a timed one's steps must not overlap
    overlapping = contextlib.nullcontext() if timed else dependent_launch.enabled(cuda.device_arch())
    with cupy.cuda.using_allocator(pool.malloc), overlapping:
        stream.begin_capture()
        try:
            outputs = run_steps(dict(inputs), clock)
        except BaseException:
            abandon_capture(stream)
            raise
        graph = stream.end_capture()
    return SegmentGraph(graph_name(step_names), tuple(step_names), graph, inputs, outputs, pool, flags, slot_runs(flag_slots),
                        tuple(clock.marks), timed)


def abandon_capture(stream: Any) -> None:
    """End a capture that failed part-way, dropping what it recorded."""
    try:
        if stream.is_capturing():
            stream.end_capture()
    except Exception:  # an invalidated capture reports its error on ending; the original error is what matters
        pass


def capture_failure(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err)}"
