"""Running a plan over the chunks of one batch: each chunk goes through every step
on one lane (PlanExecutor), several lanes at a time (ChunkScheduler, which owns
the lanes' threads), and its outputs land in their rows of the result arrays.

A chunk's tensors live only as long as a later step reads them, so one chunk
keeps little more than its largest step's inputs and outputs alive. Runs of
consecutive plugin steps are enqueued together (their inputs uploaded first),
so the kernels of one chunk follow each other on the device without a gap.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import onnxruntime as ort

from ..gpu import cuda
from ..core import host_threads
from ..errors import PluginError
from ..ort.sessions import quiet
from ..plan.partition import OrtStep, Plan, PluginStep
from ..registry import Kernel
from .buffers import InPlace
from .chunking import BatchLayout
from .graphs import GraphKey, SegmentGraph, StepClock, capture, capture_failure
from .lanes import Lane
from .nonfinite import clear_flags, raise_flag
from .output_reuse import owns
from .eager_replay import RunReplay, address
from .timeline import GRAPH, Timeline

Progress = Callable[[str, int, int], None]
_EXECUTOR_TOKENS = itertools.count()


class FlagSink(Protocol):
    """Where a chunk's watched outputs are checked for NaN and Inf (exact.NonFiniteFlags)."""

    def record(self, chunk: int, slot: int, value: Any) -> None: ...

    def address(self, chunk: int, slot: int) -> int:
        """The device address of a flag a kernel may raise itself; 0: none."""
        ...

    def copy_in(self, chunk: int, runs: Sequence[tuple[int, int, int]], source: Any) -> None: ...

    def send_home(self, chunk: int) -> None:
        """The chunk's flags to the host, after its work on its lane's stream."""
        ...


class Results:
    """The host arrays a run returns, filled chunk by chunk (from several threads)."""

    def __init__(self, batch: int, chunked: bool, single: bool):
        self.batch, self.chunked, self.single = batch, chunked, single
        self.arrays: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _target(self, name: str, rows: slice, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        with self._lock:
            array = self.arrays.get(name)
            if array is None:
                full = (self.batch, *shape[1:]) if self.chunked else tuple(shape)
                array = self.arrays[name] = np.empty(full, dtype)
        return array[rows] if self.chunked else array

    def place(self, name: str, rows: slice, value: Any, lane: Lane, staged: bool) -> None:
        if isinstance(value, np.ndarray):
            if self.single:  # the chunk is the whole batch: keep the array itself
                with self._lock:
                    self.arrays[name] = value
                return
            host_threads.copy(self._target(name, rows, value.shape, value.dtype), value)
            return
        lane.download(name, value, self._target(name, rows, tuple(value.shape), value.dtype), staged)

    def share(self, rows: slice) -> "SharedRows":
        """The part of these (chunked) arrays that one run over `rows` of the batch fills."""
        return SharedRows(self, rows)


class SharedRows:
    """One run's rows of a Results that several runs fill at once (multi_device.py: a
    runner per device): each chunk lands straight in the whole batch's arrays, so nothing
    is gathered afterwards. Rows given to `place` count from the start of this run."""

    def __init__(self, whole: Results, rows: slice):
        if not whole.chunked or whole.single:
            raise ValueError("only a chunked, multi-part Results can be shared by rows")
        self.whole, self.rows = whole, rows

    def place(self, name: str, rows: slice, value: Any, lane: Lane, staged: bool) -> None:
        start = self.rows.start
        self.whole.place(name, slice(start + rows.start, start + rows.stop), value, lane, staged)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """This run's rows of every array placed so far (views of the whole batch's)."""
        return {name: array[self.rows] for name, array in self.whole.arrays.items()}


class _Values:
    """Where each tensor of one chunk is: on the host, on the device, or both. The runner's
    `constants` (weights, on the device where there is one) are read in place: putting
    hundreds of them into every chunk's dicts cost a large model tens of microseconds a run."""

    def __init__(self, lane: Lane, constants: dict[str, Any], reuse_inputs: bool = False):
        self.lane = lane
        self.constants = constants
        self.reuse_inputs = reuse_inputs  # feeds go up into the arrays they went into last run (eager runs)
        self.host: dict[str, Any] = {}
        self.device: dict[str, Any] = {}
        self.pinned_feeds: dict[str, bool] = {}

    def put(self, name: str, value: Any) -> None:
        self.drop(name)
        if self.lane.on_device and not isinstance(value, np.ndarray):
            self.device[name] = value
        else:
            self.host[name] = value

    def put_feed(self, name: str, rows: np.ndarray, pinned: bool) -> None:
        self.put(name, rows)
        self.pinned_feeds[name] = pinned

    def get(self, name: str) -> Any:
        if name in self.device:
            return self.device[name]
        return self.host[name] if name in self.host else self.constants[name]

    def on_host(self, name: str) -> np.ndarray:
        if name not in self.host:
            if name not in self.device and name in self.constants and not self.lane.on_device:
                return self.constants[name]
            self.host[name] = self.lane.to_host(name, self.device[name] if name in self.device else self.constants[name])
        return self.host[name]

    def on_device(self, name: str, into: Any = None) -> Any:
        """The tensor on the device; a feed not there yet goes up into `into` where given (a CUDA
        graph's input buffer, which the replay then reads in place)."""
        if not self.lane.on_device:
            return self.on_host(name)
        if name not in self.device:
            if name in self.constants:
                return self.constants[name]
            if name in self.pinned_feeds:
                self.device[name] = self.lane.upload(name, self.host[name], self.pinned_feeds[name], self.reuse_inputs, into)
            else:
                self.device[name] = self.lane.to_device(name, self.host[name])
        return self.device[name]

    def drop(self, name: str) -> None:
        self.host.pop(name, None)
        self.device.pop(name, None)


@dataclass
class ChunkInputs:
    """What every chunk of one run reads."""

    feeds: dict[str, np.ndarray]
    pinned: dict[str, bool]
    keep: tuple[str, ...]
    outputs: Results | SharedRows
    kept: Results
    # where fused steps flag NaN or Inf per chunk (None: no fused steps, or not watched)
    flags: FlagSink | None = None
    # whether CUDA graphs replay with the events that time each step, and copies are timed (Runner.run's `step_times`)
    step_times: bool = True
    # host work for a lane to do while it waits for its chunk on the device (reading the last run's timings)
    while_waiting: Callable[[], None] | None = None


class PlanExecutor:
    """Runs every step of a plan on one chunk of rows, on one lane.

    `watched` maps a step's index to the NonFiniteFlags columns of its outputs:
    those are checked for NaN and Inf as the chunk runs (see exact.py). With `cuda_graphs`,
    runs of plugin steps on a device are captured and replayed as CUDA graphs (see graphs.py).
    With `in_place`, producers write into their slices of Concat outputs (see buffers.py)."""

    def __init__(
        self,
        plan: Plan,
        layout: BatchLayout,
        kernels: dict[str, Kernel],
        sessions: dict[str, ort.InferenceSession],
        constants: dict[str, Any],
        ort_on_gpu: bool,
        watched: dict[int, list[int]] | None = None,
        cuda_graphs: bool = False,
        in_place: InPlace | None = None,
    ):
        self.plan, self.layout, self.kernels, self.sessions = plan, layout, kernels, sessions
        self.constants, self.ort_on_gpu = constants, ort_on_gpu
        self.watched = watched or {}
        self.cuda_graphs = cuda_graphs
        self.in_place = in_place
        self._quiet = quiet()  # a step onnxruntime fails raises its error, without a log line too
        # whether captures record events between steps; None: decided at the first capture (see _steps_timed_in_graphs)
        self.step_times_in_graphs: bool | None = None
        self._outside: dict[tuple[int, int], list[str]] = {}  # (first, stop) of a run of plugin steps -> its outside inputs
        self._dying: dict[tuple[int, int, frozenset[str]], list[str]] = {}  # (first, stop, held) -> what a replay frees
        self._kept: dict[tuple[int, int, frozenset[str]], frozenset[str]] = {}  # (first, stop, held) -> what it returns kept
        self._runs = _runs_of_steps(plan)
        self._outputs = frozenset(plan.model.outputs)
        self._single_output = frozenset(index for index, step in enumerate(plan.steps) if len(step.outputs) == 1)
        # each step's key in a lane's per-step stores (prebound outputs, replays): the exact path's executor
        # runs its split plan on the same lanes, and its step 5 is not ours
        token = next(_EXECUTOR_TOKENS)
        self._step_keys = [(token, index) for index in range(len(plan.steps))]
        self._parts: dict[tuple[int, int], list[tuple[range, bool]]] = {}  # a run's steps cut by _eager_parts
        # after which step each tensor is read for the last time
        self.last_use: dict[str, int] = {}
        for index, step in enumerate(plan.steps):
            for name in step.inputs:
                self.last_use[name] = index

    def run_chunk(self, lane: Lane, timeline: Timeline, chunk: int, rows: slice, inputs: ChunkInputs) -> None:
        lane.start_chunk(timeline, chunk, copies_timed=inputs.step_times)
        values = _Values(lane, self.constants, reuse_inputs=not self.cuda_graphs)
        for name, array in inputs.feeds.items():
            values.put_feed(name, array[rows] if name in self.layout.batched_inputs else array, inputs.pinned[name])
        batch = rows.stop - rows.start
        held = self._outputs | frozenset(inputs.keep) if inputs.keep else self._outputs
        for indices in self._runs:
            if isinstance(self.plan.steps[indices.start], PluginStep):
                self._plugin_run(lane, values, indices, held, chunk, batch, inputs.flags, inputs.step_times)
            else:
                self._ort(lane, values, self.plan.steps[indices.start], batch)
                self._drop_dead(values, indices.start, held)
        for name in self.plan.model.outputs:
            inputs.outputs.place(name, rows, values.get(name), lane, staged=True)
        for name in inputs.keep:
            inputs.kept.place(name, rows, values.get(name), lane, staged=False)
        if inputs.flags is not None:
            inputs.flags.send_home(chunk)
        lane.finish_chunk(inputs.while_waiting)

    def _drop_dead(self, values: _Values, index: int, held: frozenset[str]) -> None:
        for name in self.plan.steps[index].inputs:
            if self.last_use.get(name) == index and name not in held and name not in self.constants:
                values.drop(name)

    def _plugin_run(self, lane: Lane, values: _Values, indices: range, held: frozenset[str], chunk: int, batch: int,
                    flags: FlagSink | None, step_times: bool = True) -> None:
        """Consecutive plugin steps: inputs from outside the run go to the device first,
        then the kernels are enqueued back to back (or replayed as one CUDA graph). A
        watched step's output is checked for NaN and Inf right after its kernel, on the
        same stream and untimed."""
        outside = self._outside_inputs(indices)
        if self.cuda_graphs and lane.on_device and self._graph_run(lane, values, indices, held, chunk, batch, flags, outside,
                                                                   step_times):
            return
        for name in outside:
            if name not in self.constants:  # the constants are on the device already
                values.on_device(name)
        pending: dict[str, Any] = {}  # Concat buffers written in place before their Concat runs
        with lane.segment():
            for part, whole in self._eager_parts(lane, indices, flags):
                if whole:
                    self._replayable_part(lane, values, part, held, batch, pending)
                else:
                    self._eager_steps(lane, values, part, held, chunk, batch, flags, pending)

    def _eager_steps(self, lane: Lane, values: _Values, indices: range, held: frozenset[str], chunk: int, batch: int,
                     flags: FlagSink | None, pending: dict[str, Any]) -> None:
        """Steps launched one by one from Python, each timed by the lane."""
        for index in indices:
            step = self.plan.steps[index]
            kernel = self.kernels[step.name]
            args = [values.on_device(n) if n else None for n in step.inputs]
            run = lane.run_kernel if kernel.device_work else lane.run_host
            watched = flags is not None and index in self.watched
            # a kernel that flags as it stores needs no pass over its output (which may be in 16 bits, channel-last)
            flag = flags.address(chunk, self.watched[index][0]) if watched and self._flags_itself(index, kernel) else 0
            if flag:
                call = lambda k=kernel, a=args, f=flag: k(a, lane.stream, nonfinite=f)  # noqa: E731
            else:
                call = lambda i=index, k=kernel, a=args: self._call(i, k, a, lane, pending, batch)  # noqa: E731
            outs = self._checked(step, run(step.name, "plugin", call))
            for name, value in zip(step.outputs, outs):
                values.put(name, value)
            if watched and not flag:
                for slot, value in zip(self.watched[index], outs):
                    lane.untimed(lambda s=slot, v=value: flags.record(chunk, s, v))
            self._drop_dead(values, index, held)

    def _replayable_part(self, lane: Lane, values: _Values, indices: range, held: frozenset[str], batch: int,
                         pending: dict[str, Any]) -> None:
        """Steps whose kernels can all be replayed (eager_replay.py): in one go when the lane kept them
        as a RunReplay on the buffers they now read, else one by one, after which they are kept
        so when every one of them replayed."""
        part_key = (self._step_keys[indices.start], indices.stop, batch, held)
        inputs_key = (batch, *(address(values.get(name)) for name in self._outside_inputs(indices)))
        kept = lane.replays.runs.get(part_key)
        if kept is not None and kept.inputs_key == inputs_key:
            lane.run_replayed(kept.names, kept.replays)
            for name, value in kept.exported.items():
                values.put(name, value)
            for name in self._dying_in(indices, held):
                values.drop(name)
            return
        hits = lane.replays.hits
        self._eager_steps(lane, values, indices, held, 0, batch, None, pending)
        lane.replays.runs.pop(part_key, None)
        if lane.replays.hits - hits == len(indices):  # every step replayed: next time, the part goes in one go
            produced = [name for index in indices for name in self.plan.steps[index].outputs]
            lane.replays.runs[part_key] = RunReplay(
                [self.plan.steps[index].name for index in indices],
                [lane.replays.replay_of(self._step_keys[index]) for index in indices], inputs_key,
                {name: values.device[name] for name in produced if name in values.device})

    def _eager_parts(self, lane: Lane, indices: range, flags: FlagSink | None) -> list[tuple[range, bool]]:
        """A run of steps cut where steps that may be kept whole as a RunReplay (a replayable kernel
        writing its one output into an array of its own, not in place in a Concat's buffer) meet
        steps that may not; (part, whether it may be). Not on the host, nor for a run whose steps are watched."""
        if self.cuda_graphs or lane.replays is None or flags is not None:
            return [(indices, False)]
        parts = self._parts.get((indices.start, indices.stop))
        if parts is None:
            wholes = [index in self._single_output and self.kernels[self.plan.steps[index].name].replayable
                      and not (self.in_place is not None and self.in_place.places(index)) for index in indices]
            parts, first = [], indices.start
            for index in indices:
                if index + 1 == indices.stop or wholes[index + 1 - indices.start] != wholes[index - indices.start]:
                    parts.append((range(first, index + 1), wholes[index - indices.start]))
                    first = index + 1
            self._parts[(indices.start, indices.stop)] = parts
        return parts

    def _call(self, index: int, kernel: Kernel, args: list[Any], lane: Lane, pending: dict[str, Any], batch: int) -> list[Any]:
        """The step's kernel on `args`, writing in place where the buffer assignment says so, else
        (eager, on a device) into the array it wrote at this chunk size last time (output_reuse.py),
        replaying the launches it made there last time when the buffers are the same (eager_replay.py)."""
        if self.in_place is not None and self.in_place.places(index):
            return self.in_place.call(index, kernel, args, lane.stream, pending, batch)
        prebound = lane.prebound if not self.cuda_graphs and index in self._single_output and kernel.out_view else None
        if prebound is None:
            return kernel(args, lane.stream)
        step = self._step_keys[index]
        out = prebound.get(step, batch)
        if out is not None:
            outs = lane.replays.call(step, kernel, args, lane.stream, out, batch)
            if len(outs) != 1 or outs[0] is not out:
                prebound.drop(step)
                lane.replays.drop(step)
            return outs
        outs = kernel(args, lane.stream)
        if len(outs) == 1 and owns(outs[0], args):
            prebound.keep(step, batch, outs[0])
            lane.replays.drop(step)
        return outs

    def _checked(self, step: PluginStep, outs: list[Any]) -> list[Any]:
        """A kernel's outputs, one per output of its step."""
        if len(outs) != len(step.outputs):
            kernel = self.kernels[step.name]
            raise PluginError(f"kernel {kernel.name} of step {step.name} returned {len(outs)} outputs, expected {len(step.outputs)}")
        return outs

    def _outside_inputs(self, indices: range) -> list[str]:
        """The tensors a run of steps reads that none of its steps writes, in order of first use."""
        known = self._outside.get((indices.start, indices.stop))
        if known is not None:
            return known
        produced: set[str] = set()
        outside: dict[str, None] = {}
        for index in indices:
            step = self.plan.steps[index]
            outside.update((name, None) for name in step.inputs if name and name not in produced)
            produced.update(step.outputs)
        known = self._outside[(indices.start, indices.stop)] = list(outside)
        return known

    def _graph_run(self, lane: Lane, values: _Values, indices: range, held: frozenset[str], chunk: int, batch: int,
                   flags: FlagSink | None, outside: list[str], step_times: bool) -> bool:
        """Runs the steps as this lane's CUDA graph for them at this chunk size, timed step by step
        or not (`step_times`), captured the second time they are met; False (run them eagerly) the
        first time and when the capture failed."""
        key = (indices.start, batch, self._kept_in(indices, held))
        timed = step_times and self._steps_timed_in_graphs()
        segment = lane.graphs.get(key, timed)
        if segment is None and lane.graphs.due(key, timed):
            segment = self._capture(lane, values, indices, held, outside, key, flags is not None, timed)
        if segment is None:
            return False
        current = {name: values.on_device(name, into=buffer) for name, buffer in segment.inputs.items()}
        # a replay stands for its steps (a row of its own) only where steps were asked for and cannot be timed inside it
        kind = "plugin" if step_times and not segment.step_marks else GRAPH
        with lane.segment():
            outputs = lane.run_graph(segment.name, segment.step_marks, lambda: segment.replay(current, lane.stream), kind)
        if flags is not None and segment.flag_runs:
            flags.copy_in(chunk, segment.flag_runs, segment.flags)  # the graph flagged its watched outputs itself
        for name, value in outputs.items():
            values.put(name, value)
        for name in self._dying_in(indices, held):
            values.drop(name)
        return True

    def _kept_in(self, indices: range, held: frozenset[str]) -> frozenset[str]:
        """The outputs of the steps that `held` keeps, found once. A graph returns only what is read
        after its steps: a run that keeps one of their intermediates (run(keep=...), check) needs a
        graph of its own that returns it too."""
        key = (indices.start, indices.stop, held)
        kept = self._kept.get(key)
        if kept is None:
            steps = self.plan.steps[indices.start:indices.stop]
            kept = self._kept[key] = frozenset(name for step in steps for name in step.outputs if name in held)
        return kept

    def _dying_in(self, indices: range, held: frozenset[str]) -> list[str]:
        """The tensors from outside a replayed run of steps that it reads for the last time, found once
        (the run's own intermediates live in its graph, never among a chunk's values)."""
        key = (indices.start, indices.stop, held)
        dying = self._dying.get(key)
        if dying is None:
            dying = self._dying[key] = [name for name in self._outside_inputs(indices) if name not in self.constants
                                        and name not in held and indices.start <= self.last_use.get(name, -1) < indices.stop]
        return dying

    def _capture(self, lane: Lane, values: _Values, indices: range, held: frozenset[str], outside: list[str],
                 key: GraphKey, flagged: bool, timed: bool) -> SegmentGraph | None:
        """The steps' graph (`timed`: with the events that time each step), kept in lane.graphs, or None
        (the reason kept there) when they cannot be captured. With `flagged`, the graph flags its watched
        outputs (NaN or Inf) into a buffer of its own, copied out after each replay. A run's second graph
        shares the first one's input buffers, pool and flag buffer."""
        import cupy

        sibling = lane.graphs.sibling(key, timed)
        constants = {name: values.on_device(name) for name in outside if name in self.constants}
        copied = {name: values.on_device(name) for name in outside if name not in self.constants}
        slots = [slot for index in indices for slot in self.watched.get(index, ())] if flagged else []
        if sibling is not None and sibling.flags is not None:
            flag_buffer = sibling.flags
        else:
            flag_buffer = cupy.empty(len(slots), dtype=cupy.bool_) if slots else None
        enqueue = self._enqueue_steps(lane, indices, held, constants, flag_buffer, key[1])
        names = [self.plan.steps[index].name for index in indices]
        try:
            segment = capture(names, copied, enqueue, lane.stream, flag_buffer, slots, timed=timed, sibling=sibling)
        except Exception as err:
            if cuda.is_out_of_memory(err):
                raise
            lane.graphs.fail(key, capture_failure(err))
            return None
        lane.graphs.add(key, segment)
        return segment

    def _steps_timed_in_graphs(self) -> bool:
        """Whether captures record events between steps (see graphs.StepClock), so that each
        step keeps its time in a replay."""
        if self.step_times_in_graphs is None:
            self.step_times_in_graphs = cuda.can_record_in_capture() is None
        return self.step_times_in_graphs

    def _flags_itself(self, index: int, kernel: Kernel) -> bool:
        """Whether watched step `index` raises its own NaN/Inf flag as its kernel stores (registry.Kernel's
        `flags_nonfinite`): one output, written where the kernel puts it (not in place in a Concat's buffer)."""
        in_place = self.in_place is not None and self.in_place.places(index)
        return len(self.watched[index]) == 1 and kernel.flags_nonfinite and not in_place

    def _enqueue_steps(self, lane: Lane, indices: range, held: frozenset[str], constants: dict[str, Any],
                       flag_buffer: Any, batch: int) -> Callable[[dict[str, Any], StepClock], dict[str, Any]]:
        """What a capture runs: the steps' kernels on the lane's stream, each between the clock's
        events, each watched output flagged into `flag_buffer`; returns the tensors read after the run."""
        after = {name for index in indices for name in self.plan.steps[index].outputs
                 if self.last_use.get(name, -1) >= indices.stop or name in held}

        def enqueue(local: dict[str, Any], clock: StepClock) -> dict[str, Any]:
            local.update(constants)
            position, pending = 0, {}
            if flag_buffer is not None:
                clear_flags(flag_buffer)  # once, before the first step's clock: each flag is then only raised
            for index in indices:
                step = self.plan.steps[index]
                kernel = self.kernels[step.name]
                args = [local[n] if n else None for n in step.inputs]
                watched = flag_buffer is not None and bool(self.watched.get(index))
                flags_itself = watched and self._flags_itself(index, kernel)
                clock.start()
                if flags_itself:  # its flag raised as it stores
                    outs = self._checked(step, kernel(args, lane.stream, nonfinite=flag_buffer[position].data.ptr))
                    position += 1
                else:
                    outs = self._checked(step, self._call(index, kernel, args, lane, pending, batch))
                clock.stop(step.name)
                local.update(zip(step.outputs, outs))
                if watched and not flags_itself:
                    clock.pause()  # the flags are untimed, as in an eager run
                    for _slot, value in zip(self.watched[index], outs):
                        raise_flag(flag_buffer[position], value)
                        position += 1
                for name in step.inputs:  # freed inside the capture: its memory serves later steps of the graph
                    if self.last_use.get(name) == index and name not in after and name not in constants:
                        local.pop(name, None)
            return {name: local[name] for name in after}

        return enqueue

    def _ort(self, lane: Lane, values: _Values, step: OrtStep, batch: int) -> None:
        session = self.sessions[step.name]
        if self.ort_on_gpu and lane.on_device:
            self._ort_bound(lane, values, step, session, batch)
            return
        feeds = {name: values.on_host(name) for name in step.inputs}
        outs = lane.run_blocking(step.name, "onnxruntime", lambda: session.run(step.outputs, feeds, self._quiet))
        for name, value in zip(step.outputs, outs):
            values.put(name, value)

    def _ort_bound(self, lane: Lane, values: _Values, step: OrtStep, session: ort.InferenceSession, batch: int) -> None:
        """CUDA provider with IOBinding: inputs and outputs stay in device memory."""
        binding = session.io_binding()
        device_id = lane.device_id
        for name in step.inputs:
            array = values.on_device(name)
            binding.bind_input(name, "cuda", device_id, array.dtype, list(array.shape), array.data.ptr)
        outputs = {}
        for name in step.outputs:
            info = self.plan.tensors[name]
            shape = self.layout.shape_at(name, batch) if self.layout.chunkable and self.layout.is_batched(name) else info.shape
            outputs[name] = cuda.empty(shape, info.dtype)
            binding.bind_output(name, "cuda", device_id, info.dtype, list(shape), outputs[name].data.ptr)
        lane.run_blocking(step.name, "onnxruntime", lambda: session.run_with_iobinding(binding, self._quiet))
        for name, value in outputs.items():
            values.put(name, value)


def _runs_of_steps(plan: Plan) -> list[range]:
    """The plan's steps in runs: each onnxruntime step alone, consecutive plugin steps together."""
    runs: list[range] = []
    for index, step in enumerate(plan.steps):
        if runs and isinstance(step, PluginStep) and isinstance(plan.steps[runs[-1].start], PluginStep):
            runs[-1] = range(runs[-1].start, index + 1)
        else:
            runs.append(range(index, index + 1))
    return runs


class ChunkScheduler:
    """Hands the chunks of a run to the lanes: one thread per lane, lane k taking chunks
    k, k + n, k + 2n, ... of n lanes; the calling thread is lane 0's, so the first chunk starts
    with no hand-over between threads. A fixed hand-out balances about as well as a first-free
    one (the chunks are equal but for a tail of smaller ones, which a copy-bound pipeline waits
    on anyway), and a batch size always meets the same lanes with the same chunk sizes: their
    CUDA graphs (one per lane and chunk size) are all captured by the time a batch size has run
    twice. The threads are made at first need and live as long as the scheduler."""

    def __init__(self, lanes: Sequence[Lane]):
        self.lanes = list(lanes)
        self._pool: ThreadPoolExecutor | None = None

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.lanes) - 1), thread_name_prefix="opplugin-lane")
            weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def run(self, chunks: Sequence[slice], work: Callable[[Lane, int, slice], None], progress: Progress | None = None) -> None:
        """Calls work(lane, index, rows) for every chunk. With one chunk or one lane the
        calling thread does it all. The first error stops the hand-out and is raised
        once every lane has finished the chunk it had."""
        done = _ImagesDone(chunks[-1].stop if chunks else 0, progress)
        if len(chunks) == 1 or len(self.lanes) == 1:
            with self.lanes[0].activate():
                for index, rows in enumerate(chunks):
                    work(self.lanes[0], index, rows)
                    done.add(rows)
            return
        self._run_on_threads(chunks, work, done)

    def _run_on_threads(self, chunks: Sequence[slice], work: Callable[[Lane, int, slice], None], done: _ImagesDone) -> None:
        lanes = self.lanes[: len(chunks)]
        stop = threading.Event()
        errors: list[BaseException] = []

        def lane_loop(first: int) -> None:
            lane = lanes[first]
            with lane.activate():
                for index in range(first, len(chunks), len(lanes)):
                    if stop.is_set():
                        return
                    try:
                        work(lane, index, chunks[index])
                    except BaseException as err:  # handed to the caller below
                        stop.set()
                        errors.append(err)
                        return
                    done.add(chunks[index])

        futures = [self._threads().submit(lane_loop, first) for first in range(1, len(lanes))]
        lane_loop(0)  # its errors go to `errors` like the others'
        try:
            for future in futures:
                future.result()
        except BaseException:  # an interrupt in the caller: let the lanes finish their chunk, then go
            stop.set()
            for future in futures:
                future.exception()
            raise
        if errors:
            raise errors[0]


class _ImagesDone:
    """The images of a run finished so far, told to `progress` as "run" (from any lane's thread)."""

    def __init__(self, total: int, progress: Progress | None):
        self.total, self.progress = total, progress
        self.images = 0
        self._lock = threading.Lock()

    def add(self, rows: slice) -> None:
        if self.progress:
            with self._lock:
                self.images += rows.stop - rows.start
                self.progress("run", self.images, self.total)
