"""CuPy access: device detection, NVRTC options, the module cache, the CUDA-event
timer, streams, pinned host memory and device-memory figures.

CuPy is imported lazily, so this module (and everything that imports it)
loads on a machine without CuPy or without a GPU; only the functions that
need a device import it. Which device a run uses is device.py's business.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from . import dependent_launch, kernel_cache, recorded_launches, nvrtc
from ..core import paths

# Options every kernel is compiled with. No --use_fast_math: the variants are
# FP32-exact (FMA contraction is allowed; it rounds once instead of twice).
BASE_OPTIONS: tuple[str, ...] = ("--std=c++17",)
# Set (to anything): every kernel is also compiled with -lineinfo, so that profilers and sanitizers
# name source lines (`opplugin profile`, --sanitize); the machine code is the same
LINEINFO_ENV = "OPPLUGIN_LINEINFO"


def line_info_options() -> tuple[str, ...]:
    return ("-lineinfo",) if os.environ.get(LINEINFO_ENV) else ()

_modules: dict[tuple, Any] = {}


def is_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device. Never raises."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "not available"
        return False


def device_count() -> int:
    """How many CUDA devices CuPy sees; 0 without CuPy, a driver or a device. Never raises."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # as in is_available
        return 0


def current_properties() -> tuple[str, str]:
    """(name, compute capability "9.0") of the current CUDA device."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return name, f"{props['major']}.{props['minor']}"


def total_memory_bytes() -> int:
    """Total memory of the current CUDA device."""
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["totalGlobalMem"])


def nvrtc_options(defines: Mapping[str, Any]) -> tuple[str, ...]:
    """The NVRTC options for a source specialised by `defines` (name -> value).

    Booleans become 0/1 so that `#if NAME` works in the source.
    """
    macros = tuple(f"-D{name}={int(value) if isinstance(value, bool) else value}" for name, value in defines.items())
    return BASE_OPTIONS + line_info_options() + dependent_launch.compile_options() + macros


def module_job(source_file: str, defines: Mapping[str, Any], arch: str, *,
               arch_specific: bool = False) -> kernel_cache.CompileJob:
    """The compile of kernels/<source_file> specialised by `defines` for `arch` ("sm_90"): what
    compile_module loads on a device of that architecture."""
    return source_job(paths.kernel_source(source_file), nvrtc_options(defines), source_file, arch, arch_specific=arch_specific)


def source_job(source: str, options: tuple[str, ...], label: str, arch: str, *,
               arch_specific: bool = False) -> kernel_cache.CompileJob:
    """The compile of CUDA `source` with `options` for `arch`; `arch_specific` targets the
    architecture-specific variant ("sm_90a"), whose instructions (wgmma) run on that compute
    capability alone. `label` names it in errors."""
    return kernel_cache.CompileJob(label, source, tuple(options), arch + ("a" if arch_specific else ""))


def compile_module(source_file: str, defines: Mapping[str, Any], *, arch_specific: bool = False):
    """A cupy.RawModule for kernels/<source_file> specialised by `defines` (see `load`)."""
    return load(module_job(source_file, defines, device_arch(), arch_specific=arch_specific))


def compile_source(source: str, options: tuple[str, ...], label: str, *, arch_specific: bool = False):
    """A cupy.RawModule of CUDA `source` compiled with `options` for the current device (see `load`)."""
    return load(source_job(source, options, label, device_arch(), arch_specific=arch_specific))


def load(job: kernel_cache.CompileJob):
    """The module of `job` (compiled for the current device's architecture), loaded from the kernel
    cache (kernel_cache.py: compiled there first when missing; KernelCompileError naming the job's
    label when NVRTC rejects it).

    Loaded once per (source, options, architecture): equal compiles share one module, and so one
    set of module globals. Callers that put per-node data in a module's globals (constant memory)
    must make the options differ between nodes whose data differ.

    The module comes wrapped (recorded_launches.Module), so that the launches of its functions can be
    recorded and replayed.
    """
    key = (job.source, job.options, job.arch)
    module = _modules.get(key)
    if module is None:
        path = kernel_cache.binary_path(job)
        import cupy

        module = recorded_launches.Module(cupy.RawModule(path=str(path)))
        _modules[key] = module
    return module


def device_arch() -> str:
    """The architecture the current device's kernels are compiled for ("sm_90")."""
    return _arch_for(device_id())


@functools.lru_cache(maxsize=None)
def _arch_for(device: int) -> str:
    return arch_of(current_properties()[1])


@functools.lru_cache(maxsize=None)
def arch_of(compute_capability: str) -> str:
    """The architecture kernels are compiled for on a GPU of `compute_capability` ("9.0"): its own,
    or the highest one below it that the installed NVRTC knows (a cubin runs on later minor
    versions of its major one), as CuPy chooses it."""
    major, minor = compute_capability.split(".")
    capability = int(major) * 10 + int(minor)
    known = [arch for arch in nvrtc.supported_archs() if arch <= capability]
    return f"sm_{max(known) if known else capability}"


def event():
    """A CUDA event that records time (cupy.cuda.Event)."""
    import cupy

    return cupy.cuda.Event()


def elapsed_ms(start, end) -> float:
    """Milliseconds between two recorded events (the end one must have completed)."""
    import cupy

    return cupy.cuda.get_elapsed_time(start, end)


# cudaEventRecordExternal (CU_EVENT_RECORD_EXTERNAL): recorded during a stream capture, the event
# becomes a node of the graph, recorded again at each replay, rather than a capture-time dependency
EVENT_RECORD_EXTERNAL = 1


def record_in_capture(event, stream) -> None:
    """Records `event` on `stream`, which is capturing a CUDA graph, as an event-record node of
    that graph: after each replay the event holds the time the replay reached this point, so
    two such events time the work captured between them."""
    import cupy

    runtime = cupy.cuda.runtime
    if hasattr(runtime, "eventRecordWithFlags"):
        runtime.eventRecordWithFlags(event.ptr, stream.ptr, EVENT_RECORD_EXTERNAL)
        return
    status = _driver_event_record_with_flags()(event.ptr, stream.ptr, EVENT_RECORD_EXTERNAL)
    if status:
        raise RuntimeError(f"cuEventRecordWithFlags failed with CUresult {status}")


@functools.lru_cache(maxsize=None)
def _driver_event_record_with_flags():
    """The driver's cuEventRecordWithFlags, for a CuPy whose runtime module lacks the call. The
    driver library is the one CuPy's runtime runs on, so its events and streams are ours; going
    through cuda-bindings' runtime instead would load a CUDA runtime of its own major version."""
    import ctypes

    library = ctypes.CDLL("nvcuda.dll" if os.name == "nt" else "libcuda.so.1")
    function = library.cuEventRecordWithFlags
    function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


def can_record_in_capture() -> str | None:
    """None when events can be recorded inside a captured graph (record_in_capture), else why not."""
    import cupy

    if hasattr(cupy.cuda.runtime, "eventRecordWithFlags"):
        return None
    try:
        _driver_event_record_with_flags()
    except (OSError, AttributeError) as err:
        return f"no cudaEventRecordWithFlags in CuPy and none in the CUDA driver library ({err})"
    return None


def synchronize() -> None:
    """Wait until the current device has finished all its work."""
    import cupy

    cupy.cuda.Device().synchronize()


def to_device(array: Any):
    """A CuPy copy of a host array, on the current device and stream."""
    import cupy

    return cupy.asarray(array)


def empty(shape: Sequence[int], dtype: Any):
    """An uninitialised device array."""
    import cupy

    return cupy.empty(tuple(shape), dtype=dtype)


def time_ms(fn: Callable[[], Any], warmup: int = 2, repeat: int = 5, stream: Any = None, calls: int = 1) -> list[float]:
    """Milliseconds per call of fn(), one reading per sample: `warmup` untimed calls,
    then `repeat` samples of `calls` back-to-back calls between two CUDA events.

    The events are recorded on `stream` (None: the current stream, CuPy's and
    PyTorch's legacy default stream unless one was made current), so fn must
    launch its work there. This is opplugin's one CUDA-event timer.
    """
    for _ in range(warmup):
        fn()
    start, end = event(), event()
    times = []
    for _ in range(repeat):
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        end.synchronize()
        times.append(elapsed_ms(start, end) / calls)
    return times


_ALREADY = contextlib.nullcontext()


def on_stream(stream: Any):
    """A context that makes `stream` current (a no-op context for None, or when it is already:
    a lane makes its stream current for a whole run, and entering it again per kernel call
    cost the host about 0.5 µs a step)."""
    if stream is None:
        return _ALREADY
    import cupy

    return _ALREADY if cupy.cuda.get_current_stream() is stream else stream


# --- streams, pinned host memory, device memory ------------------------------------------


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])  # reads every attribute: once per device


def multiprocessor_count() -> int:
    """Streaming multiprocessors of the current CUDA device."""
    return _multiprocessors(device_id())


def runtime_major() -> int:
    """The major version of the CUDA runtime CuPy was built for (12, 13, ...)."""
    import cupy

    return cupy.cuda.runtime.runtimeGetVersion() // 1000


def device_id() -> int:
    """The id of the current CUDA device."""
    import cupy

    return cupy.cuda.Device().id


def new_stream():
    """A stream that does not synchronise with the legacy default stream."""
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


_pinned_lock = threading.Lock()
_pinned_live = {"bytes": 0, "buffers": 0}


def _pinned_released(nbytes: int) -> None:
    with _pinned_lock:
        _pinned_live["bytes"] -= nbytes
        _pinned_live["buffers"] -= 1


def pinned_empty(shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """A numpy array in page-locked host memory: the GPU copies it by DMA, with no
    staging and asynchronously. Freed when the array (and every view of it) is gone."""
    import cupy

    shape = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    memory = cupy.cuda.PinnedMemory(nbytes)  # cudaHostAlloc, outside CuPy's pinned pool
    raw = np.frombuffer(cupy.cuda.PinnedMemoryPointer(memory, 0), dtype=np.uint8, count=nbytes)
    with _pinned_lock:
        _pinned_live["bytes"] += nbytes
        _pinned_live["buffers"] += 1
    # every view of the result has `raw` as its base, so it lives exactly as long as the memory is used
    weakref.finalize(raw, _pinned_released, nbytes)
    return raw[: int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)


def pinned_bytes() -> int:
    """Bytes of page-locked host memory that opplugin holds right now."""
    with _pinned_lock:
        return _pinned_live["bytes"]


def is_pinned(array: np.ndarray) -> bool:
    """True when the array's memory is page-locked (cudaHostAlloc'd or registered)."""
    if not is_available() or array.size == 0:
        return False
    import cupy

    try:
        return bool(cupy.cuda.pinned_memory.is_memory_pinned(array.ctypes.data))
    except Exception:  # an address CUDA does not know is simply not pinned
        return False


def free_device_bytes() -> int:
    """Bytes a new allocation can still get: free device memory plus what CuPy's
    pool holds unused, capped by the pool's limit when one is set."""
    import cupy

    pool = cupy.get_default_memory_pool()
    free, _total = cupy.cuda.runtime.memGetInfo()
    available = free + pool.free_bytes()
    limit = pool.get_limit()
    if limit:
        available = min(available, max(0, limit - pool.used_bytes()))
    return int(available)


def memory_figures() -> dict[str, int]:
    """Device and pinned memory opplugin can account for: CuPy's pool (used and
    held), CuPy's pinned pool (free blocks) and opplugin's own pinned buffers."""
    import cupy

    pool = cupy.get_default_memory_pool()
    return {
        "device_used_bytes": int(pool.used_bytes()),
        "device_pool_bytes": int(pool.total_bytes()),
        "pinned_pool_free_blocks": int(cupy.get_default_pinned_memory_pool().n_free_blocks()),
        "pinned_bytes": pinned_bytes(),
    }


def release_cached_memory() -> None:
    """Return the blocks CuPy's pool keeps for reuse to the device (after an out-of-memory)."""
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()


def is_out_of_memory(error: BaseException) -> bool:
    """Whether an error means memory ran out: CuPy's OutOfMemoryError (a MemoryError),
    a CUDA allocation failure, or onnxruntime's CUDA provider failing to allocate."""
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return "cudaErrorMemoryAllocation" in text or "CUDA out of memory" in text or "Failed to allocate memory" in text
