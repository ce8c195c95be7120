"""gpu/dependent_launch.py and kernels/grid_dependency.cuh on the CPU: the driver structures' layout, which kernels
may be launched programmatically, and when a Function launches so."""
from __future__ import annotations

import contextlib
import ctypes
import re

import numpy as np
import pytest

from opplugin.core.paths import kernels_dir
from opplugin.gpu import cuda, dependent_launch, nvrtc, recorded_launches

DECLARED = re.compile(r"^AWAITS_PREVIOUS_GRID\((\w+)\)$", re.M)
KERNEL = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


def test_the_launch_structures_lie_as_the_driver_reads_them():
    # cuda.h: CUlaunchAttribute is a 4-byte id padded to 8 and a 64-byte union; CUlaunchConfig is seven unsigned
    # ints, the stream, the attributes' pointer and their count
    assert ctypes.sizeof(dependent_launch._Attribute) == 72
    assert dependent_launch._Attribute.value.offset == 8
    config = dependent_launch._Config
    assert (config.stream.offset, config.attributes.offset, config.attribute_count.offset) == (32, 40, 48)
    assert ctypes.sizeof(config) == 56


def _kernel_bodies(text: str) -> dict[str, str]:
    """Each kernel's name -> its body's text from the opening brace on."""
    bodies = {}
    for match in KERNEL.finditer(text):
        brace = text.index("{", match.end())
        bodies[match.group(1)] = text[brace + 1:]
    return bodies


def _sources():
    return sorted(p for p in kernels_dir().iterdir() if p.suffix in (".cu", ".cuh"))


def test_a_kernel_that_declares_it_awaits_the_previous_grid_does_so_first():
    # a programmatic launch runs a declared kernel while the one before it may still be writing: anything it did
    # before await_previous_grid() could read a stale value or overwrite one still being read
    declared_anywhere = 0
    for path in _sources():
        text = path.read_text()
        bodies = _kernel_bodies(text)
        for name in DECLARED.findall(text):
            assert name in bodies, f"{path.name}: AWAITS_PREVIOUS_GRID({name}) names no kernel of the file"
            first = bodies[name].lstrip().split(";", 1)[0]
            assert first == "await_previous_grid()", f"{path.name}: {name} begins with {first!r}"
            declared_anywhere += 1
        for name, body in bodies.items():
            if "await_previous_grid();" in body.split("\n}", 1)[0]:
                assert name in DECLARED.findall(text), f"{path.name}: {name} awaits the previous grid undeclared"
    assert declared_anywhere >= 12


class _Pointer:
    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray:  # noqa: N801 - stands in for a CuPy array (packed_argument reads its type's name and data.ptr)
    def __init__(self, ptr: int):
        self.data = _Pointer(ptr)


class _Raw:
    """Stands in for a cupy.RawKernel: notes the launches CuPy would make."""

    class kernel:  # noqa: N801
        ptr = 0x4321

    name = "step"

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.calls.append((grid, block, tuple(args), shared_mem))


class _Stream:
    ptr = 0x77


@pytest.fixture
def programmatic(monkeypatch):
    """dependent_launch on, its driver call replaced by a list of what it was given."""
    launched = []
    monkeypatch.setattr(dependent_launch, "active", lambda: True)
    monkeypatch.setattr(dependent_launch, "launch", lambda *a: launched.append(a))
    return launched


def test_an_awaiting_function_launches_programmatically_while_enabled(programmatic):
    raw = _Raw()
    recorded_launches.Function(raw, awaits_previous_grid=True)((4, 2), 128, (ndarray(0xA0), np.int32(5)), shared_mem=1024, stream=_Stream())
    assert raw.calls == []
    [(function, grid, block, shared, stream, values)] = programmatic
    assert (function, grid, block, shared, stream) == (0x4321, (4, 2, 1), (128, 1, 1), 1024, 0x77)
    assert [v.value for v in values] == [0xA0, 5]


@pytest.mark.parametrize("awaits, args", [(False, (ndarray(0xA0), np.int32(5))), (True, (ndarray(0xA0), 5))],
                         ids=["not declared", "a Python int argument"])
def test_other_launches_stay_as_cupy_makes_them(programmatic, awaits, args):
    raw = _Raw()
    recorded_launches.Function(raw, awaits_previous_grid=awaits)((4,), (128,), args, stream=_Stream())
    assert programmatic == [] and len(raw.calls) == 1


def test_a_recorded_launch_stays_as_cupy_makes_it(programmatic, monkeypatch):
    # eager replays (runtime/eager_replay.py) launch what they recorded with cuLaunchKernel, plainly
    monkeypatch.setattr(recorded_launches, "_allocation_watch", lambda recording: contextlib.nullcontext())
    raw = _Raw()
    with recorded_launches.Recording() as recording:
        recorded_launches.Function(raw, awaits_previous_grid=True)((4,), (128,), (ndarray(0xA0), np.int32(5)), stream=_Stream())
    assert programmatic == [] and len(raw.calls) == 1 and len(recording.launches) == 1


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "compute"])
def test_before_hopper_nothing_is_launched_programmatically(arch):
    with dependent_launch.enabled(arch):
        assert not dependent_launch.active()


def test_enabled_lasts_as_long_as_its_block(monkeypatch):
    monkeypatch.setattr(dependent_launch, "_driver_launch", lambda: object())
    monkeypatch.setenv(dependent_launch.SWITCH, "1")
    assert not dependent_launch.active()
    with dependent_launch.enabled("sm_90a"):
        assert dependent_launch.active()
    assert not dependent_launch.active()


@pytest.mark.parametrize(("switch", "on"), [(None, True), ("1", True), ("yes", True), ("0", False)])
def test_it_is_on_unless_switched_off(monkeypatch, switch, on):
    monkeypatch.setattr(dependent_launch, "_driver_launch", lambda: object())
    if switch is None:
        monkeypatch.delenv(dependent_launch.SWITCH, raising=False)
    else:
        monkeypatch.setenv(dependent_launch.SWITCH, switch)
    with dependent_launch.enabled("sm_90"):
        assert dependent_launch.active() is on
    assert (f"-D{dependent_launch.DEFINE}=1" in cuda.nvrtc_options({"C": 3})) is on


def test_switched_off_the_kernels_compile_without_their_waits(monkeypatch):
    monkeypatch.setenv(dependent_launch.SWITCH, "0")
    assert dependent_launch.compile_options() == () and cuda.nvrtc_options({"C": 3})[-1] == "-DC=3"


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="cuda-bindings' NVRTC is not importable")
@pytest.mark.parametrize("arch, define, declared", [("sm_90a", True, True), ("sm_90", True, True), ("sm_90a", False, False),
                                                    ("sm_90", False, False), ("sm_80", True, False)])
def test_the_declaration_is_compiled_in_only_with_the_waits(arch, define, declared):
    # the runtime launches programmatically only a kernel whose module holds the declaration: it must never be there
    # without the wait (code for sm_90 on, built with the define)
    source = ('#include "grid_dependency.cuh"\nAWAITS_PREVIOUS_GRID(step)\n'
              'extern "C" __global__ void step(float* y)\n{\n    await_previous_grid();\n    y[threadIdx.x] = 1.0f;\n}\n')
    options = ("--std=c++17", f"-I{kernels_dir()}") + ((f"-D{dependent_launch.DEFINE}=1",) if define else ())
    cubin, _ = nvrtc.compile_cubin(source, options, arch)
    assert (b"step" + dependent_launch.MARKER.encode() in cubin) is declared
