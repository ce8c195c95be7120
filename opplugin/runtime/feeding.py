"""How many of the devices a run is given the host can feed, measured: one pass on the first
1, 2, ... N of them (multi_device.DeviceRunners.probe_feeding times it) gives the images/s of
each count, and a run uses the fewest devices within FEED_MARGIN of the most images/s (fed_count).

More devices are not always faster. A model whose input is large beside its compute is bound by
the host's copies to the devices, and those do not scale with the devices: lenet86 at 200,000
images on one four-H200 host ran 1.77x as fast on 2 GPUs, 1.87x on 3 and 1.66x on 4. A run must
never get slower for being given more devices, so it runs on the count that measured fastest,
and its report says which devices that left idle and the figures behind the choice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# Counts whose images/s lie within this share of the most are taken as equal, and the fewest of
# them is used: one probe pass a count cannot tell a few per cent from noise, and a device left
# idle is free for other work.
FEED_MARGIN = 0.03
# A batch is probed only when it gives every device at least this many images. Below it a device's
# share is a chunk or two, a pass of a small model is over in about a millisecond, mostly the
# host's threads and launches, and one timed pass a count cannot be trusted to FEED_MARGIN: such a
# run uses every device given.
MIN_PROBE_SHARE = 256
# Warm-up passes over every device before the probe, whatever --warmup says: a run of plugin steps
# is compiled and loaded the first time it is met and captured into a CUDA graph the second
# (runtime/graphs.py), so the probe times the third meeting, as the timed passes do.
PROBE_WARMUP = 2


def fed_count(rates: Sequence[float], margin: float = FEED_MARGIN) -> int:
    """How many devices to use, from the images/s measured on the first 1, 2, ... N of them
    (`rates[k - 1]`: k devices, each above 0): the fewest whose images/s is within `margin` of the
    most. Every smaller count measured below that line, so the count chosen never measured slower
    than a smaller one."""
    if not rates:
        raise ValueError("fed_count needs the images/s of one device at least")
    line = max(rates) * (1 - margin)
    return next(count for count, rate in enumerate(rates, start=1) if rate >= line)


def probe_skipped(batch: int, devices: int, asked: bool = True) -> str | None:
    """Why a run of `batch` images over `devices` devices is not probed (it then uses them all);
    None when it is."""
    if not asked:
        return "asked to use every device given"
    if devices < 2:
        return "one device given"
    if batch < devices * MIN_PROBE_SHARE:
        return f"the batch gives each device under {MIN_PROBE_SHARE} images"
    return None


@dataclass(frozen=True)
class Feeding:
    """How many of the `given` devices a run uses (the first `used` of them), and why: the probe's
    pass on each count (count k at index k - 1: the images it ran and its wall time), or the
    reason no probe ran (`skipped`)."""

    given: int
    used: int
    images: tuple[int, ...] = ()
    times_ms: tuple[float, ...] = ()
    skipped: str | None = None
    margin: float = FEED_MARGIN

    @classmethod
    def measured(cls, images: Sequence[int], times_ms: Sequence[float], margin: float = FEED_MARGIN) -> Feeding:
        """The choice from one probe pass a count: `images[k - 1]` images on k devices in `times_ms[k - 1]`."""
        rates = [count / (ms / 1e3) for count, ms in zip(images, times_ms)]
        return cls(len(rates), fed_count(rates, margin), tuple(images), tuple(times_ms), None, margin)

    @classmethod
    def unprobed(cls, given: int, why: str) -> Feeding:
        """Every device used, unmeasured, for the reason `why` (probe_skipped's)."""
        return cls(given, given, skipped=why)

    @property
    def rates(self) -> list[float]:
        """Images/s on the first 1, 2, ... N devices (empty where no probe ran)."""
        return [count / (ms / 1e3) for count, ms in zip(self.images, self.times_ms)]

    def record(self, labels: Sequence[str]) -> dict[str, Any]:
        """The JSON record (`run --json`'s `feeding`), the devices by their labels."""
        return {
            "probed": self.skipped is None,
            "given": list(labels),
            "used": list(labels[:self.used]),
            "idle": list(labels[self.used:]),
            "why_not_probed": self.skipped,
            "margin": self.margin,
            "probe": [{"devices": count, "images": images, "time_ms": ms, "images_per_s": rate}
                      for count, (images, ms, rate) in enumerate(zip(self.images, self.times_ms, self.rates), start=1)],
        }
