"""CuPy access: device detection, NVRTC options, the module cache, events, copies.

CuPy is imported lazily, so this module (and everything that imports it)
loads on a machine without CuPy or without a GPU; only the functions that
need a device import it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping, Sequence

from . import registry, resources

# Options every kernel is compiled with. No --use_fast_math: the variants are
# FP32-exact (FMA contraction is allowed; it rounds once instead of twice).
BASE_OPTIONS: tuple[str, ...] = ("--std=c++17",)

_modules: dict[tuple, Any] = {}


def is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device. Never raises."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "not available"
        return False


def device() -> registry.Device:
    """The current CUDA device as a registry.Device (kind "cuda")."""
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return registry.Device(kind="cuda", name=name, compute_capability=f"{props['major']}.{props['minor']}")


def nvrtc_options(defines: Mapping[str, Any]) -> tuple[str, ...]:
    """The NVRTC options for a source specialised by `defines` (name -> value).

    Booleans become 0/1 so that `#if NAME` works in the source.
    """
    macros = tuple(f"-D{name}={int(value) if isinstance(value, bool) else value}" for name, value in defines.items())
    return BASE_OPTIONS + macros


def compile_module(source_file: str, defines: Mapping[str, Any], name_expressions: Sequence[str] | None = None):
    """A cupy.RawModule for kernels/<source_file> specialised by `defines`.

    Cached by (source text, options, name expressions). Note that CuPy itself
    also shares one loaded module between equal (source, options): callers that
    put per-node data in a module's globals (constant memory) must make the
    options differ between nodes whose data differ.
    """
    import cupy

    source = resources.kernel_source(source_file)
    options = nvrtc_options(defines)
    names = tuple(name_expressions) if name_expressions else None
    key = (source, options, names)
    module = _modules.get(key)
    if module is None:
        module = cupy.RawModule(code=source, options=options, name_expressions=names)
        _modules[key] = module
    return module


def event():
    """A CUDA event that records time (cupy.cuda.Event)."""
    import cupy

    return cupy.cuda.Event()


def elapsed_ms(start, end) -> float:
    """Milliseconds between two recorded events (the end one must have completed)."""
    import cupy

    return cupy.cuda.get_elapsed_time(start, end)


def synchronize() -> None:
    """Wait until the current device has finished all its work."""
    import cupy

    cupy.cuda.Device().synchronize()


def to_device(array: Any):
    """A CuPy copy of a host array, on the current device and stream."""
    import cupy

    return cupy.asarray(array)


def to_host(array: Any):
    """A numpy copy of a device array (waits for it)."""
    import cupy

    return cupy.asnumpy(array)


def empty(shape: Sequence[int], dtype: Any):
    """An uninitialised device array."""
    import cupy

    return cupy.empty(tuple(shape), dtype=dtype)


def time_ms(fn: Callable[[], Any], warmup: int = 2, repeat: int = 5, stream: Any = None) -> list[float]:
    """Milliseconds of each of `repeat` calls of fn(), timed with CUDA events.

    The events are recorded on `stream` (None: the current stream), so fn must
    launch its work there.
    """
    for _ in range(warmup):
        fn()
    start, end = event(), event()
    times = []
    for _ in range(repeat):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(elapsed_ms(start, end))
    return times


def on_stream(stream: Any):
    """A context that makes `stream` current (a no-op context for None)."""
    return contextlib.nullcontext() if stream is None else stream
