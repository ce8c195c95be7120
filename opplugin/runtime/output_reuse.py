"""Output arrays that eager runs of one lane reuse, run after run.

Without CUDA graphs every plugin step is launched from Python, and allocating its output
from CuPy's pool costs the host about 3.7 µs a step on an H200 (tools/host_step_bench.py),
a fifth of what the step costs in all. A lane that runs the same steps at the same chunk
size again hands each step the array that step wrote last time (`out=`), when its kernel
takes one (Kernel.out_view) and the step has one output.

Reuse is safe because a lane runs its chunks one after another on one stream: everything
that read a step's output in the last chunk (the later steps, the copies to the host) was
enqueued on that stream before the step writes it again, and onnxruntime steps in between
run to completion before the next step is launched.

Only an array the step's kernel allocated is kept (`owns`): a kernel may hand back a view
of its input (a Slice along the batch axis) or an input itself, and writing into that next
time would write into memory the step does not own.

Each step keeps one array, for the chunk size it last ran at. The arrays outlive their
chunk, so a lane holds at most `budget_bytes` of them; past that, steps allocate as before.
"""
from __future__ import annotations

from typing import Any, Hashable, Sequence

BUDGET_BYTES = 64 * 2**20  # per lane: small chunks, where the host's time per step matters


def owns(output: Any, inputs: Sequence[Any]) -> bool:
    """Whether a step's output is an array of its own: no view of another array (NumPy and
    CuPy arrays say so by their `base`) and none of the step's inputs."""
    return getattr(output, "base", None) is None and all(output is not value for value in inputs)


class PreboundOutputs:
    """Per step (a key its executor names it by), the output array of its last run at one chunk size."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self._arrays: dict[Hashable, tuple[int, Any]] = {}
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, step: Hashable, batch: int) -> Any | None:
        """The array `step` wrote at this chunk size, if it keeps one."""
        found = self._arrays.get(step)
        return found[1] if found is not None and found[0] == batch else None

    def keep(self, step: Hashable, batch: int, array: Any) -> None:
        """Keeps `array` for the step's next run at this chunk size, within the budget."""
        self.drop(step)
        if self._bytes + array.nbytes <= self.budget_bytes:
            self._arrays[step] = (batch, array)
            self._bytes += array.nbytes

    def drop(self, step: Hashable) -> None:
        found = self._arrays.pop(step, None)
        if found is not None:
            self._bytes -= found[1].nbytes

    def clear(self) -> None:
        self._arrays.clear()
        self._bytes = 0
