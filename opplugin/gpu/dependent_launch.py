"""Programmatic dependent launch (sm_90): kernels captured into a CUDA graph that start while the kernel
before them still runs.

In a graph, each kernel's launch, the placing of its blocks and its first instructions follow the end of the
kernel before it: on an H200, 1.5 us a kernel in a graph of 100 small ones. Batch-1 CNNs are made of such
kernels (ResNet-50 in FP16: 102 kernels in 0.56 ms). Launched with cuLaunchKernelEx's programmatic stream
serialization, a kernel's blocks are placed as soon as every block of the one before has begun; each then waits
(griddepcontrol.wait) for that kernel to finish and its writes to be seen before it touches memory: 0.76 us a
kernel in the same graph.

Only a kernel that waits may be launched so: one that declares AWAITS_PREVIOUS_GRID(name) and calls
await_previous_grid() first (kernels/grid_dependency.cuh), compiled for sm_90 on with `compile_options()`.
It is on unless OPPLUGIN_DEPENDENT_LAUNCH=0 (SWITCH). `awaits_previous_grid` finds the declaration in a
loaded module; `launch` launches such a kernel programmatically. The runtime's untimed graph captures
(runtime/graphs.py) turn that on for their thread with `enabled`; a timed graph records an event between its
steps, whose times must not overlap.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from typing import Any, Iterator, Sequence

MARKER = "_awaits_previous_grid"  # the suffix of AWAITS_PREVIOUS_GRID's symbol
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
FIRST_ARCH = 90  # griddepcontrol: sm_90 on
# "0" turns it off: the kernels are then compiled without their waits (DEFINE), the same code as before it, and
# launched as CuPy launches them. On by default: the GPU suite passes with it, and ResNet-50 FP16 at batch 1 takes
# a tenth less time on an H200
SWITCH = "OPPLUGIN_DEPENDENT_LAUNCH"
DEFINE = "AWAIT_PREVIOUS_GRIDS"  # kernels/grid_dependency.cuh's

_state = threading.local()  # .on: programmatic launches enabled in this thread


class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value (a union)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attributes", ctypes.POINTER(_Attribute)), ("attribute_count", ctypes.c_uint)]


@functools.lru_cache(maxsize=None)
def _driver_launch() -> Any:
    """cuLaunchKernelEx from the driver library; None where the driver has none (before CUDA 12)."""
    try:
        return ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None


def awaits_previous_grid(module: Any, name: str) -> bool:
    """Whether kernel `name` of the loaded cupy.RawModule `module` declares AWAITS_PREVIOUS_GRID."""
    try:
        module.get_global(name + MARKER)
    except Exception:  # CUDA_ERROR_NOT_FOUND: it does not
        return False
    return True


def switched_on() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def compile_options() -> tuple[str, ...]:
    """What every kernel is compiled with for it: DEFINE where switched on, which builds the waits in."""
    return (f"-D{DEFINE}=1",) if switched_on() else ()


def supported_arch(arch: str) -> bool:
    """Whether code for `arch` ("sm_90", "sm_90a") has griddepcontrol."""
    try:
        return int(arch.removeprefix("sm_").rstrip("a")) >= FIRST_ARCH
    except ValueError:
        return False


def supported(arch: str) -> bool:
    """Whether it is switched on, and a device of architecture `arch` and this driver launch programmatically."""
    return switched_on() and supported_arch(arch) and _driver_launch() is not None


@contextlib.contextmanager
def enabled(arch: str) -> Iterator[None]:
    """Launches in this thread of kernels that await the previous grid go programmatic, where the device's `arch`
    supports it."""
    before = getattr(_state, "on", False)
    _state.on = supported(arch)
    try:
        yield
    finally:
        _state.on = before


def active() -> bool:
    return getattr(_state, "on", False)


def launch(function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, stream: int,
           values: Sequence[Any]) -> None:
    """cuLaunchKernelEx of CUfunction `function` with the packed argument `values` (ctypes), programmatically
    serialized after the stream's previous kernel."""
    attribute = _Attribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
    config = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_mem, stream, ctypes.pointer(attribute), 1)
    parameters = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))
    status = _driver_launch()(ctypes.byref(config), ctypes.c_void_p(function), parameters, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUDA driver error {status}")
