"""Eager steps replayed from their recorded launches (gpu/recorded_launches.py), per lane.

A lane that runs a step again on the same buffers (its prebound output, inputs that are
earlier steps' prebound outputs or constants, the same batch) makes the same launches as
last time, so it enqueues them from their packed parameter blocks instead of calling the
kernel: the checks, the grid arithmetic and CuPy's argument packing are left out. A step is
recorded on its first call with an output array given (the second run at a chunk size), and
again whenever its buffers change; one whose buffers change at every run, or whose kernel
cannot be recorded (recorded_launches.Recording says why), is called as before.

A run of steps that all replayed is kept whole as well (`RunReplay`): next time, when the
tensors it reads from outside are at the same addresses, its launches and the events that
time each step go out in one loop, without looking up each step's inputs and outputs.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from ..gpu import recorded_launches

# recordings in a row without a replay between them, after which a step is no longer recorded
RECORDINGS_WITHOUT_REPLAY = 3


def buffers_key(args: Sequence[Any], out: Any, batch: int) -> tuple:
    """What a step's launches follow from: the addresses of its inputs and output, and the batch."""
    return (batch, out.data.ptr, *map(address, args))


def address(value: Any) -> int:
    """A CuPy array's device address; 0 for an absent input, the identity of anything else."""
    try:
        return value.data.ptr
    except AttributeError:
        return 0 if value is None else id(value)


class StepReplays:
    """Per step (a key from its executor), the replay of its last recorded call and the buffers it was on."""

    def __init__(self, recording: Callable[[], Any] = recorded_launches.Recording):
        self._recording = recording
        self._replays: dict[Hashable, tuple[tuple, Any]] = {}
        self._unreplayed: dict[Hashable, int] = {}  # recordings since the step's last replay
        self.refused: dict[Hashable, str] = {}  # step -> why it is not replayed
        self.hits = 0  # calls replayed so far: a run of steps all replayed when it grew by their number
        self.runs: dict[Hashable, RunReplay] = {}  # see RunReplay

    def __len__(self) -> int:
        return len(self._replays)

    def call(self, step: Hashable, kernel: Any, args: list[Any], stream: Any, out: Any, batch: int) -> list[Any]:
        """kernel(args, stream, out=out), or its recorded launches when the buffers are the ones they were made on."""
        key = buffers_key(args, out, batch)
        found = self._replays.get(step)
        if found is not None and found[0] == key:
            found[1]()
            self._unreplayed[step] = 0
            self.hits += 1
            return [out]
        if step in self.refused or not kernel.replayable:
            return kernel(args, stream, out=out)
        with self._recording() as recording:
            outs = kernel(args, stream, out=out)
        replay = recording.replay() if len(outs) == 1 and outs[0] is out else None
        recorded = self._unreplayed.get(step, 0) + 1
        if replay is None:
            self._forget(step, recording.refusal or "it returned an array other than the one it was given")
        elif recorded > RECORDINGS_WITHOUT_REPLAY:
            self._forget(step, "its buffers change from run to run")
        else:
            self._replays[step] = (key, replay)
            self._unreplayed[step] = recorded
        return outs

    def _forget(self, step: Hashable, reason: str) -> None:
        self._replays.pop(step, None)
        self.refused[step] = reason

    def replay_of(self, step: Hashable) -> Any:
        """The step's current replay (it has one: the step was just replayed)."""
        return self._replays[step][1]

    def drop(self, step: Hashable) -> None:
        """The step's output array changed hands (output_reuse.py): record it afresh next time."""
        self._replays.pop(step, None)
        self._unreplayed.pop(step, None)


class RunReplay:
    """A run of consecutive steps that every one replayed: their replays in order, the addresses
    of what the run reads from outside it, and the arrays it leaves for later steps."""

    __slots__ = ("names", "replays", "inputs_key", "exported")

    def __init__(self, names: Sequence[str], replays: Sequence[Any], inputs_key: tuple, exported: dict[str, Any]):
        self.names, self.replays = tuple(names), tuple(replays)
        self.inputs_key, self.exported = inputs_key, exported
