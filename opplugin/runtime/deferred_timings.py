"""When a runner reads each run's timings: not as the run returns, but while the next
run waits for the device, or sooner where someone asks (RunResult.times, .spans).

Reading a run's CUDA events costs the host tens of microseconds, which a run at batch 1
would otherwise pay between its outputs being ready and `run` returning. So the events
are left unread, and runs take turns between two sets of them (the lanes' EventPools
and two origin events): run n + 1 records the other set while it reads run n's, and by
the time run n + 2 records run n's set again, run n's spans are read.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..gpu import cuda
from .lanes import Lane
from .timeline import Timeline


class DeferredTimings:
    """Per event set, the timeline of the last run timed with it, whose spans may still be unread."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self._generation = 0
        self._origins: list[Any] = [None, None]
        self._last: list[Timeline | None] = [None, None]  # by event set, the last run timed with it

    def start(self, lanes: Sequence[Lane]) -> tuple[Timeline, Callable[[], None] | None]:
        """A new run (or a new try at one) on `lanes`: its Timeline, and the reading of earlier runs'
        timings for its lanes to do while they wait for the device (None: nothing to read)."""
        self._generation ^= 1
        generation = self._generation
        if self._last[generation] is not None:
            self._last[generation].settle()  # its events are about to be recorded again (seldom: the run in between read them)
        for lane in lanes:
            lane.start_run(generation)
        if self.on_gpu and self._origins[generation] is None:
            self._origins[generation] = cuda.event()
        timeline = self._last[generation] = Timeline(self.on_gpu, self._origins[generation])
        earlier = self._last[generation ^ 1]
        if earlier is None:
            return timeline, None
        # the first lane to wait reads them; the others go on with their chunks
        return timeline, lambda: earlier.settle(wait=False)
