"""gpu/recorded_launches.py and runtime/eager_replay.py on the CPU: how a launch's arguments are packed, when a
recording is refused, and when a step's call is replayed, recorded again or left alone."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from opplugin.gpu import recorded_launches
from opplugin.runtime.eager_replay import RECORDINGS_WITHOUT_REPLAY, StepReplays, buffers_key


class _Pointer:
    def __init__(self, ptr: int):
        self.ptr = ptr


class ndarray:  # noqa: N801 - stands in for a CuPy array: what packing reads is its type's name and data.ptr
    def __init__(self, ptr: int):
        self.data = _Pointer(ptr)


class _RawKernel:
    name = "fill"

    class kernel:  # noqa: N801
        ptr = 0x1234


def _parameter_values(launch: recorded_launches.Launch, c_types: list) -> list:
    """What the launch's kernelParams array points at, read back through ctypes."""
    table = (ctypes.c_void_p * len(c_types)).from_address(launch.parameters)
    return [c_type.from_address(address).value for c_type, address in zip(c_types, table)]


def test_arguments_are_packed_in_the_c_type_the_kernel_takes():
    values = [ndarray(0xABC0), np.int32(-7), np.int64(1 << 40), np.uint64(0), np.float32(1.5), np.float64(-2.25), np.bool_(True)]
    launch = recorded_launches.Launch(0x10, (3, 1, 1), (128, 1, 1), 0, 0x20, [recorded_launches.packed_argument(v) for v in values])
    read = _parameter_values(launch, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float,
                                      ctypes.c_double, ctypes.c_bool])
    assert read == [0xABC0, -7, 1 << 40, 0, 1.5, -2.25, True]
    assert launch.arguments()[0] == 0xABC0


@pytest.mark.parametrize("value, what", [(3, "int"), (2.0, "float"), (None, "NoneType"), (np.complex64(1j), "complex64"),
                                         (np.zeros(3), "ndarray")])
def test_arguments_without_a_fixed_c_type_are_refused(value, what):
    recording = recorded_launches.Recording()
    recording.add(_RawKernel, (1,), (32,), (ndarray(0x100), value), 0, _Stream(7))
    assert recording.launches == [] and what in recording.refusal and "fill" in recording.refusal
    assert recording.replay() is None


class _Stream:
    def __init__(self, ptr: int):
        self.ptr = ptr


def test_a_recording_keeps_each_launch_with_its_geometry_and_stream():
    recording = recorded_launches.Recording()
    recording.add(_RawKernel, (4, 2), 256, (ndarray(0x100), np.int32(3)), 4096, _Stream(0x77))
    [launch] = recording.launches
    assert (launch.function, launch.grid, launch.block, launch.shared_mem, launch.stream) == (0x1234, (4, 2, 1), (256, 1, 1), 4096, 0x77)
    assert launch.arguments() == (0x100, 3) and recording.refusal is None


def test_a_call_that_launched_nothing_or_allocated_is_refused():
    empty = recorded_launches.Recording()
    assert empty.replay() is None and "launched nothing" in empty.refusal
    allocating = recorded_launches.Recording()
    allocating.add(_RawKernel, (1,), (32,), (ndarray(0x100),), 0, _Stream(1))
    allocating.refuse("it allocates device memory on each call")
    allocating.refuse("a later reason")
    assert allocating.replay() is None and allocating.refusal == "it allocates device memory on each call"


def test_the_buffers_key_names_the_addresses_and_the_batch():
    x, w, y = ndarray(0x100), ndarray(0x200), ndarray(0x300)
    assert buffers_key([x, w, None], y, 4) == (4, 0x300, 0x100, 0x200, 0)
    assert buffers_key([x], y, 4) != buffers_key([x], y, 8) != buffers_key([ndarray(0x108)], y, 8)


class _FakeRecording:
    """A Recording without CuPy: the kernel's call is the recorded launch."""

    refuse_with: str | None = None

    def __enter__(self):
        self.refusal = self.refuse_with
        return self

    def __exit__(self, *exc):
        pass

    def replay(self):
        return None if self.refusal else self._replayed

    def _replayed(self):
        _FakeRecording.replays += 1

    replays = 0


class _Kernel:
    replayable = True

    def __init__(self):
        self.calls = 0

    def __call__(self, args, stream, out=None):
        self.calls += 1
        return [out]


def test_a_step_is_replayed_on_the_same_buffers_and_recorded_again_on_new_ones():
    _FakeRecording.replays, _FakeRecording.refuse_with = 0, None
    replays, kernel = StepReplays(_FakeRecording), _Kernel()
    x, y = ndarray(0x100), ndarray(0x300)
    for _ in range(3):
        assert replays.call("s", kernel, [x], None, y, 1) == [y]
    assert (kernel.calls, _FakeRecording.replays, len(replays)) == (1, 2, 1)
    replays.call("s", kernel, [ndarray(0x180)], None, y, 1)  # the input moved: called and recorded again
    assert (kernel.calls, _FakeRecording.replays) == (2, 2)
    replays.call("s", kernel, [ndarray(0x180)], None, y, 1)
    assert (kernel.calls, _FakeRecording.replays) == (2, 3)


def test_a_step_whose_buffers_change_every_run_stops_being_recorded():
    _FakeRecording.refuse_with = None
    replays, kernel = StepReplays(_FakeRecording), _Kernel()
    y = ndarray(0x300)
    for turn in range(RECORDINGS_WITHOUT_REPLAY + 3):
        replays.call("s", kernel, [ndarray(0x1000 + 0x100 * turn)], None, y, 1)
    assert kernel.calls == RECORDINGS_WITHOUT_REPLAY + 3 and "change from run to run" in replays.refused["s"] and not len(replays)


def test_a_refused_or_unreplayable_kernel_is_called_every_time():
    _FakeRecording.refuse_with = "it allocates device memory on each call"
    replays, kernel = StepReplays(_FakeRecording), _Kernel()
    x, y = ndarray(0x100), ndarray(0x300)
    for _ in range(3):
        replays.call("s", kernel, [x], None, y, 1)
    assert kernel.calls == 3 and replays.refused == {"s": "it allocates device memory on each call"}
    _FakeRecording.refuse_with = None
    plain = _Kernel()
    plain.replayable = False
    for _ in range(3):
        replays.call("t", plain, [x], None, y, 1)
    assert plain.calls == 3 and not len(replays)


def test_an_eager_run_of_steps_is_cut_where_replayable_steps_meet_others(tmp_path):
    """The executor keeps whole only the parts of a run whose kernels may be replayed (a run with
    a Gemm that does not say so, reading a view, is cut there), on a lane that replays, eager, unwatched."""
    import types

    import onnx
    from resnet_block import resnet_block

    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    onnx.save(resnet_block(), tmp_path / "block.onnx")
    runner = Runner(load_model(tmp_path / "block.onnx"), 2, "cpu", cuda_graphs=False)
    executor = runner.executor
    names = [step.name for step in runner.plan.steps]
    assert names == ["stem", "conv1", "conv2", "pool", "fc"] and executor._runs == [range(0, 5)]
    for name in ("stem", "conv1", "conv2", "pool"):
        executor.kernels[name].replayable = True
    lane = types.SimpleNamespace(replays=StepReplays())
    assert executor._eager_parts(lane, range(0, 5), None) == [(range(0, 4), True), (range(4, 5), False)]
    assert executor._eager_parts(lane, range(0, 5), flags=object()) == [(range(0, 5), False)]  # watched: step by step
    assert executor._eager_parts(types.SimpleNamespace(replays=None), range(0, 5), None) == [(range(0, 5), False)]
