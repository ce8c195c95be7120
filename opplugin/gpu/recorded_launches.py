"""Kernel launches that can be recorded once and replayed from packed arguments.

An eager step launched from Python pays, on every call, for its kernel's checks, for
working out its grid and for CuPy's packing of each argument: 11 to 17 µs of host time
for one small Conv on an H200's host, where cuLaunchKernel on a ready parameter block
took about 3.5 µs and CuPy's launch of the same kernel 6 to 9. A call that runs on the
same buffers as the last one makes the same launches, so the runtime records them once
(`Recording`) and replays them (`Replay`) while the buffers stay the same
(runtime/eager_replay.py; tools/host_step_bench.py measures what a step costs the host).

Every function opplugin compiles (cuda.compile_source) is a `Function`: it launches as
CuPy launches it (or, inside a graph capture, programmatically where the kernel awaits
the previous grid: gpu/dependent_launch.py), and while a Recording is active in the thread
it also keeps the launch with its arguments packed into a ctypes parameter block. A
recording refuses, rather than keeps, a call it cannot reproduce:
- one that allocates device memory (scratch, or a contiguous copy of an input), seen by a
  CuPy memory hook: its pointers would not hold next time;
- an argument other than a CuPy array or a NumPy scalar (a Python int's C type is CuPy's
  choice, not the kernel's);
- a call that launched nothing through a Function (its work went some other way).
A kernel opts in with `replayable = True` (registry.Kernel): its calls must launch device
work only through Functions, and what they launch must follow from the buffers' addresses
and the batch alone.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Sequence

import numpy as np

from . import dependent_launch

# the C type each NumPy scalar argument is passed as, as CuPy passes it
_C_TYPES = {
    np.dtype(np.bool_): ctypes.c_bool,
    np.dtype(np.int8): ctypes.c_int8, np.dtype(np.uint8): ctypes.c_uint8,
    np.dtype(np.int16): ctypes.c_int16, np.dtype(np.uint16): ctypes.c_uint16,
    np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
}

_active = threading.local()  # .recording: the Recording of this thread, if one is active


def packed_argument(value: Any) -> Any:
    """A ctypes value holding what a launch passes for `value`: a CuPy array's device address,
    a NumPy scalar in its own C type. TypeError for anything else."""
    if isinstance(value, np.generic):
        c_type = _C_TYPES.get(value.dtype)
        if c_type is None:
            raise TypeError(f"a NumPy {value.dtype} argument")
        return c_type(value.item())
    data = getattr(value, "data", None)
    pointer = getattr(data, "ptr", None)
    if type(value).__name__ == "ndarray" and isinstance(pointer, int):
        return ctypes.c_void_p(pointer)
    raise TypeError(f"a {type(value).__name__} argument")


def _dim3(extent: Any) -> tuple[int, int, int]:
    sides = (extent,) if isinstance(extent, (int, np.integer)) else tuple(extent)
    if not 1 <= len(sides) <= 3:
        raise TypeError(f"a launch extent of {len(sides)} sides")
    return tuple(int(s) for s in sides) + (1,) * (3 - len(sides))


class Launch:
    """One recorded launch: the function, its geometry, the stream and the packed arguments."""

    __slots__ = ("function", "grid", "block", "shared_mem", "stream", "values", "_parameters")

    def __init__(self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                 stream: int, values: Sequence[Any]):
        self.function, self.grid, self.block, self.shared_mem, self.stream = function, grid, block, shared_mem, stream
        self.values = tuple(values)  # the packed arguments, kept alive: the parameter block points at them
        self._parameters = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))

    @classmethod
    def of(cls, raw: Any, grid: Any, block: Any, args: Sequence[Any], shared_mem: int, stream: Any) -> "Launch":
        """The launch of cupy.RawKernel `raw` as a call makes it; TypeError for an argument without a fixed C type."""
        values = [packed_argument(a) for a in args]
        return cls(raw.kernel.ptr, _dim3(grid), _dim3(block), int(shared_mem), _stream_pointer(stream), values)

    @property
    def parameters(self) -> int:
        """The address of the kernelParams array (one pointer per argument)."""
        return ctypes.addressof(self._parameters)

    def arguments(self) -> tuple[Any, ...]:
        """The packed values, for comparing two recordings."""
        return tuple(v.value for v in self.values)


class Replay:
    """The launches of one recorded call, enqueued again in order."""

    __slots__ = ("launches", "_calls")

    def __init__(self, launches: Sequence[Launch]):
        from cupy.cuda import driver

        self.launches = tuple(launches)
        launch = driver.launchKernel
        self._calls = tuple((launch, (l.function, *l.grid, *l.block, l.shared_mem, l.stream, l.parameters, 0))
                            for l in self.launches)

    def __call__(self) -> None:
        for launch, arguments in self._calls:
            launch(*arguments)


class Recording:
    """While active (`with`), keeps each launch made through a Function in this thread, and
    notes why the call cannot be replayed when it cannot (`refusal`)."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.refusal: str | None = None
        self._watch = None

    def __enter__(self) -> "Recording":
        if getattr(_active, "recording", None) is not None:
            raise RuntimeError("a Recording is already active in this thread")
        self._watch = _allocation_watch(self)
        self._watch.__enter__()
        _active.recording = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _active.recording = None
        self._watch.__exit__(*exc)

    def refuse(self, reason: str) -> None:
        if self.refusal is None:
            self.refusal = reason

    def add(self, raw: Any, grid: Any, block: Any, args: Sequence[Any], shared_mem: int, stream: Any) -> None:
        if self.refusal is not None:
            return
        try:
            launch = Launch.of(raw, grid, block, args, shared_mem, stream)
        except TypeError as err:
            self.refuse(f"it launches {raw.name} with {err}")
            return
        self.launches.append(launch)

    def replay(self) -> Replay | None:
        """The recorded call as a Replay; None when it cannot be replayed (see `refusal`)."""
        if self.refusal is None and not self.launches:
            self.refuse("it launched nothing through opplugin's functions")
        return None if self.refusal is not None else Replay(self.launches)


def _stream_pointer(stream: Any) -> int:
    if stream is None:
        import cupy

        stream = cupy.cuda.get_current_stream()
    return int(stream.ptr)


def _allocation_watch(recording: Recording) -> Any:
    """A CuPy memory hook that refuses the recording at the first device allocation."""
    from cupy.cuda import memory_hook

    class AllocationWatch(memory_hook.MemoryHook):
        name = "opplugin-recording"

        def alloc_preprocess(self, **kwargs: Any) -> None:
            recording.refuse("it allocates device memory on each call")

        malloc_preprocess = alloc_preprocess

    return AllocationWatch()


class Function:
    """A compiled CUDA function (a cupy.RawKernel), launched as CuPy launches it; while a
    Recording is active in the thread, each launch is also recorded. Its other attributes
    (registers, shared-memory limits) are the RawKernel's."""

    __slots__ = ("raw", "awaits_previous_grid")

    def __init__(self, raw: Any, awaits_previous_grid: bool = False):
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "awaits_previous_grid", awaits_previous_grid)  # launches programmatically in a capture

    def __call__(self, grid: Any, block: Any, args: Sequence[Any], *, shared_mem: int = 0, stream: Any = None) -> None:
        recording = getattr(_active, "recording", None)
        if self.awaits_previous_grid and recording is None and dependent_launch.active():
            try:
                launch = Launch.of(self.raw, grid, block, args, shared_mem, stream)
            except TypeError:  # an argument whose C type is CuPy's choice: launched as CuPy launches it
                pass
            else:
                dependent_launch.launch(launch.function, launch.grid, launch.block, launch.shared_mem, launch.stream,
                                        launch.values)
                return
        self.raw(grid, block, args, shared_mem=shared_mem, stream=stream)
        if recording is not None:
            recording.add(self.raw, grid, block, args, shared_mem, stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.raw, name, value)


class Module:
    """A loaded cupy.RawModule whose functions are `Function`s; its other members (get_global) are the module's."""

    def __init__(self, raw: Any):
        self.raw = raw
        self._functions: dict[str, Function] = {}

    def get_function(self, name: str) -> Function:
        found = self._functions.get(name)
        if found is None:
            raw = self.raw.get_function(name)
            found = self._functions[name] = Function(raw, dependent_launch.awaits_previous_grid(self.raw, name))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)
