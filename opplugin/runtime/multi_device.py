"""One batch over several devices: a Runner per device, each given its own consecutive
rows of the batch, all running at once on threads, their outputs put back in input order.

Each runner is built and run inside its device's CUDA context, so that its constants,
streams (its own lanes) and onnxruntime session live on that device; the runners share
nothing but the caller's input arrays, which they only read. A device id may be given
twice (`0,0`: two runners on one GPU). On the CPU the same class runs several "cpu"
runners, which is how the mechanism is tested without a GPU.

A run waits for every device before it returns; when one fails, the run fails with an
error naming that device, and no output is handed back.

More devices are not always faster (the host's copies to them may not scale: feeding.py). So
`profile`, where the batch is large enough, times a pass on the first 1, 2, ... N runners after
its warm-up (probe_feeding) and runs its timed passes on the count that measured fastest, the
others left idle; `use(count)` does the same by hand.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..gpu import cuda
from ..gpu.device import CPU, Device, current_cuda_device
from ..errors import DeviceError, InputError, OpPluginError, first_line, positive_int
from ..graph.model import Model
from ..core.row_ranges import split_even
from . import chunking
from .executor import Progress, Results
from .feeding import PROBE_WARMUP, Feeding, probe_skipped
from .records import Profile, RunResult
from .runner import Runner


@dataclass(frozen=True)
class DeviceSlot:
    """Where one runner runs: a CUDA device id, or the CPU (cuda_id None)."""

    cuda_id: int | None = None

    @property
    def label(self) -> str:
        return "cpu" if self.cuda_id is None else f"cuda:{self.cuda_id}"

    def context(self):
        """The device current on this thread while the runner is built and run."""
        if self.cuda_id is None:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(self.cuda_id)

    def device(self) -> Device:
        """The Device record of this slot (call inside `context()`)."""
        return CPU if self.cuda_id is None else current_cuda_device()


def cuda_slots(text: str) -> list[DeviceSlot]:
    """The slots of a `--devices` value: "all" (every CUDA device CuPy sees) or ids "0,1,...",
    repeats allowed; InputError in one line when there is no CUDA device or an id is unknown."""
    count = cuda.device_count()
    if not count:
        raise InputError("--devices needs a CUDA device; here plugin steps run the numpy reference on the CPU")
    if text.strip() == "all":
        return [DeviceSlot(index) for index in range(count)]
    words = [word.strip() for word in text.split(",")]
    if not all(word.isdigit() for word in words):
        raise InputError(f"--devices {text}: give all, or device ids such as 0,1")
    unknown = sorted({int(word) for word in words if int(word) >= count})
    if unknown:
        raise InputError(f"--devices {text}: no CUDA device {', '.join(map(str, unknown))}; "
                         f"this machine has {count} (ids 0 to {count - 1})")
    return [DeviceSlot(int(word)) for word in words]


class DeviceFailure(DeviceError):
    """One device of a multi-device run failed; the message names it, and it leaves the process
    as the device's own error would (`abandon_process` after a hung kernel)."""

    def __init__(self, message: str, cause: OpPluginError):
        super().__init__(message)
        self.abandon_process = cause.abandon_process


@dataclass
class DevicesResult:
    """One pass of a batch over the devices: the outputs and kept tensors in input order, each
    device's rows and RunResult (None where it got no rows), the wall time of the pass, and
    when each device's run began and ended, in ms from the start of the pass (None where it
    got no rows): what the pass adds to its slowest device is starting threads and gathering."""

    outputs: dict[str, np.ndarray]
    kept: dict[str, np.ndarray]
    rows: list[slice | None]
    results: list[RunResult | None]
    total_ms: float
    batch: int
    spans_ms: list[tuple[float, float] | None] = field(default_factory=list)


@dataclass
class DevicesProfile:
    """Timed passes over the devices: a Profile per device (None where it got no rows),
    the wall time of each pass, and the last pass's outputs."""

    labels: list[str]
    profiles: list[Profile | None]
    images: list[int]
    total_ms: list[float] = field(default_factory=list)
    # each timed pass's DevicesResult.spans_ms
    spans_ms: list[list[tuple[float, float] | None]] = field(default_factory=list)
    last: DevicesResult | None = None
    # how many of the devices the timed passes used, and the feed probe's figures behind it
    feeding: Feeding | None = None

    @property
    def batch(self) -> int:
        return sum(self.images)

    def rows(self) -> list[dict[str, Any]]:
        """A row per device: its images and its median time host to host."""
        return device_rows(self.labels, self.images,
                           [statistics.median(p.total_ms) if p is not None else 0.0 for p in self.profiles])

    @property
    def first(self) -> Profile:
        """The profile of the first device that ran: its steps make the report's step table."""
        return next(profile for profile in self.profiles if profile is not None)


def device_rows(labels: Sequence[str], images: Sequence[int], times_ms: Sequence[float]) -> list[dict[str, Any]]:
    """The report's rows, one per device: images, time in ms, images/s (None for a device without rows)."""
    return [{"device": label, "images": count, "time_ms": ms, "images_per_s": count / (ms / 1e3) if count and ms > 0 else None}
            for label, count, ms in zip(labels, images, times_ms)]


class DevicesTally:
    """A DeviceRunners' run for check, which runs the batch in pieces: each device's images and
    time, and the wall time, summed over the pieces."""

    def __init__(self, devices: "DeviceRunners"):
        self.devices = devices
        self.images = [0] * len(devices.runners)
        self.times_ms = [0.0] * len(devices.runners)
        self.total_ms = 0.0

    def run(self, feeds: dict[str, np.ndarray], keep: tuple[str, ...] = (), progress: Progress | None = None) -> "DevicesResult":
        result = self.devices.run(feeds, keep, progress)
        for index, (rows, ran) in enumerate(zip(result.rows, result.results)):
            if ran is not None:
                self.images[index] += rows.stop - rows.start
                self.times_ms[index] += ran.total_ms
        self.total_ms += result.total_ms
        return result

    def rows(self) -> list[dict[str, Any]]:
        return device_rows(self.devices.labels, self.images, self.times_ms)


def _require_rows(layout: chunking.BatchLayout) -> chunking.BatchLayout:
    if not layout.chunkable:
        raise InputError(f"--devices cuts the batch into rows, one share per device, and this model cannot be cut: {layout.unchunkable}")
    return layout


class DeviceRunners:
    """A runner per slot, each built inside its device's context by `make_runner(slot, batch)`,
    where `batch` is the largest share of `batch` one device gets. The model must be one that
    runs in chunks: rows of a batch run alone must give those rows of the whole result."""

    def __init__(self, model: Model, slots: Sequence[DeviceSlot], make_runner: Callable[[DeviceSlot, int], Runner], batch: int):
        if not slots:
            raise InputError("--devices names no device")
        self.slots = list(slots)
        self.batch = positive_int(batch, "batch")
        _require_rows(chunking.probe_layout(model))  # before any runner is built for a share it cannot take
        share = -(-self.batch // len(self.slots))
        self.runners: list[Runner] = []
        for slot in self.slots:
            with slot.context():
                self.runners.append(make_runner(slot, share))
        self.layout = _require_rows(self.runners[0].layout)  # the plan's steps may exchange unbatched tensors
        self.used = len(self.runners)  # a run splits its batch over the first `used` runners (see use)

    @property
    def labels(self) -> list[str]:
        """Each runner's device, numbered when a device holds several runners ("cuda:0 #2")."""
        plain = [slot.label for slot in self.slots]
        seen: dict[str, int] = {}
        labels = []
        for label in plain:
            seen[label] = seen.get(label, 0) + 1
            labels.append(label if plain.count(label) == 1 else f"{label} #{seen[label]}")
        return labels

    def use(self, count: int) -> None:
        """Later runs split their batch over the first `count` runners; the others stay built, idle."""
        if not 1 <= count <= len(self.runners):
            raise InputError(f"use {count} of {len(self.runners)} runners: give 1 to {len(self.runners)}")
        self.used = count

    def split(self, batch: int) -> list[slice | None]:
        """Each runner's rows: consecutive, in order, sizes within one of each other over the first
        `used` runners; None for the runners left without rows (those past `used`, and the last
        ones when the batch has fewer rows than runners)."""
        return self._padded(split_even(batch, self.used))

    def _padded(self, pieces: list[slice]) -> list[slice | None]:
        return pieces + [None] * (len(self.runners) - len(pieces))

    def _piece(self, feeds: dict[str, np.ndarray], rows: slice) -> dict[str, np.ndarray]:
        """The runner's rows of the batched inputs (views, so pinned memory stays pinned); the rest whole."""
        return {name: (value[rows] if name in self.layout.batched_inputs else value) for name, value in feeds.items()}

    def _together(self, rows: list[slice | None], work: Callable[[int, Runner, slice], Any]) -> list[Any]:
        """`work(index, runner, rows)` for every runner with rows, at once on threads, each inside
        its device's context. Every thread is waited for; then the first failure, in device
        order, is raised: opplugin's errors as a DeviceFailure naming the device, anything else
        as it is, with a note naming the device."""
        busy = [index for index, piece in enumerate(rows) if piece is not None]

        def on_device(index: int) -> Any:
            with self.slots[index].context():
                return work(index, self.runners[index], rows[index])

        with ThreadPoolExecutor(max_workers=len(busy), thread_name_prefix="opplugin-device") as pool:
            futures = {index: pool.submit(on_device, index) for index in busy}
        found: list[Any] = [None] * len(rows)
        for index, future in futures.items():
            error = future.exception()
            if isinstance(error, OpPluginError):
                raise self._failure(index, error) from error
            if error is not None:  # a bug, not a failure of the run: its traceback stays, naming the device
                error.add_note(f"opplugin: on {self.labels[index]} (runner {index + 1} of {len(self.labels)})")
                raise error
            found[index] = future.result()
        return found

    def _failure(self, index: int, error: OpPluginError) -> DeviceFailure:
        labels = self.labels
        named = first_line(error)
        return DeviceFailure(f"on {labels[index]} (runner {index + 1} of {len(labels)}): {named}", error)

    def _gather_kept(self, results: list[RunResult | None], names: Sequence[str]) -> dict[str, np.ndarray]:
        """Each kept tensor's rows from every device, in input order; an unbatched one (a kept
        weight input) is the same everywhere and taken once."""
        ran = [result for result in results if result is not None]
        arrays = {}
        for name in names:
            parts = [result.kept[name] for result in ran]
            batched = self.layout.is_batched(name) or name in self.layout.batched_inputs
            arrays[name] = np.concatenate(parts) if batched and len(parts) > 1 else parts[0]
        return arrays

    def run(self, feeds: dict[str, np.ndarray], keep: tuple[str, ...] = (), progress: Progress | None = None, *,
            step_times: bool = False) -> DevicesResult:
        """One pass of the batch over the devices; the outputs and `keep` come back in input order.
        `progress(label, images_done, images)` counts the images every device has done; `step_times`
        times every step, as Runner.run does."""
        batch = self.runners[0].check_feeds(feeds)
        return self._run_rows(feeds, batch, self.split(batch), keep, progress, step_times)

    def _run_rows(self, feeds: dict[str, np.ndarray], batch: int, rows: list[slice | None], keep: tuple[str, ...],
                  progress: Progress | None, step_times: bool) -> DevicesResult:
        """One pass of `batch` images, each runner given its `rows` (None: none), every runner at once."""
        counter = _Counter(progress, len(rows), batch)
        outputs = Results(batch, chunked=True, single=False)  # every device writes its rows straight in
        spans: list[tuple[float, float] | None] = [None] * len(rows)
        started = time.perf_counter()

        def run_share(index: int, runner: Runner, piece: slice) -> RunResult:
            began = time.perf_counter()
            result = runner.run(self._piece(feeds, piece), keep, counter.for_device(index), step_times=step_times,
                                into=outputs.share(piece))
            spans[index] = ((began - started) * 1e3, (time.perf_counter() - started) * 1e3)
            return result

        results = self._together(rows, run_share)
        total_ms = (time.perf_counter() - started) * 1e3
        return DevicesResult({name: outputs.arrays[name] for name in self.runners[0].plan.model.outputs},
                             self._gather_kept(results, keep), rows, results, total_ms, batch, spans)

    def probe_feeding(self, feeds: dict[str, np.ndarray], progress: Progress | None = None) -> Feeding:
        """One timed pass on each count of runners, the first 1, 2, ... N, and the count a run should
        use (feeding.fed_count). Each pass gives its runners the rows they have in a run over all N
        (the first k shares of the batch): only how many devices work at once changes from pass to
        pass, and every runner meets the chunks it met in a pass over all N, so warm those up first
        (PROBE_WARMUP passes). `progress` counts the probe's images, about (N + 1) / 2 batches."""
        batch = self.runners[0].check_feeds(feeds)
        if batch < len(self.runners):
            raise InputError(f"the feed probe needs a row for each of the {len(self.runners)} runners; the batch has {batch}")
        shares = split_even(batch, len(self.runners))
        passes = _Passes(progress, sum(piece.stop for piece in shares))
        images, times_ms = [], []
        for count in range(1, len(shares) + 1):
            end = shares[count - 1].stop  # the pass runs rows [0, end): the first `count` shares
            result = self._run_rows(self._piece(feeds, slice(0, end)), end, self._padded(shares[:count]), (),
                                    passes.start("feed probe", end), step_times=True)  # step events on: the graphs the warm-up captured
            images.append(end)
            times_ms.append(result.total_ms)
        return Feeding.measured(images, times_ms)

    def profile(self, feeds: dict[str, np.ndarray], warmup: int = 2, repeat: int = 5, keep: tuple[str, ...] = (),
                progress: Progress | None = None, *, feed_probe: bool = True) -> DevicesProfile:
        """Warm-up passes, then `repeat` timed passes, every device used at once in each; a Profile per
        device (its own steps, its rows' times) and the wall time of every timed pass.

        With `feed_probe`, where the batch is large enough (feeding.probe_skipped), the warm-up passes
        (PROBE_WARMUP at least) over every runner are followed by the feed probe (probe_feeding), and
        the timed passes run on the count it chose. When that is fewer than all, those devices get the
        `warmup` passes again first: their shares are larger now, and end in chunks not met yet.
        Without it (or where the batch is too small), the passes use the runners `use` left in use."""
        repeat = positive_int(repeat, "repeat")
        warmup = positive_int(warmup, "warm-up", allow_zero=True)
        batch = self.runners[0].check_feeds(feeds)
        skipped = probe_skipped(batch, len(self.runners), feed_probe)
        if skipped:
            passes = _Passes(progress, (warmup + repeat) * batch)
            self._warm(feeds, batch, warmup, passes)
            feeding = Feeding(len(self.runners), self.used, skipped=skipped)
        else:
            passes = _Passes(progress, (max(warmup, PROBE_WARMUP) + warmup + repeat) * batch + self._probe_images(batch))
            feeding = self._warm_and_probe(feeds, batch, warmup, passes)
        rows = self.split(batch)
        found = DevicesProfile(self.labels, [None] * len(rows), [0 if r is None else r.stop - r.start for r in rows], feeding=feeding)
        for _ in range(repeat):
            result = self.run(feeds, keep, passes.start("timed run", batch), step_times=True)
            for index, (piece, ran) in enumerate(zip(rows, result.results)):
                if ran is None:
                    continue
                if found.profiles[index] is None:
                    found.profiles[index] = Profile(self.runners[index].plan_record(piece.stop - piece.start), ran)
                found.profiles[index].add(ran)
            found.total_ms.append(result.total_ms)
            found.spans_ms.append(result.spans_ms)
            found.last = result
        return found

    def _warm(self, feeds: dict[str, np.ndarray], batch: int, count: int, passes: "_Passes") -> None:
        """`count` untimed passes over the runners in use, with step events on, as the timed passes
        run: their CUDA graphs are the ones these capture."""
        for _ in range(count):
            self.run(feeds, (), passes.start("warm-up", batch), step_times=True)

    def _warm_and_probe(self, feeds: dict[str, np.ndarray], batch: int, warmup: int, passes: "_Passes") -> Feeding:
        """A probed profile's warm-up: passes over every runner (PROBE_WARMUP at least), the feed
        probe, and the count it chose put in use. Where that count leaves runners idle, its shares
        are larger than in the warm-up and end in chunks not met yet, so it gets `warmup` passes again."""
        self.use(len(self.runners))
        self._warm(feeds, batch, max(warmup, PROBE_WARMUP), passes)
        feeding = self.probe_feeding(feeds, passes.start("feed probe", self._probe_images(batch)))
        self.use(feeding.used)
        if feeding.used < len(self.runners):
            self._warm(feeds, batch, warmup, passes)
        else:
            passes.skip(warmup * batch)
        return feeding

    def _probe_images(self, batch: int) -> int:
        """The images the feed probe runs at `batch`: the first 1, 2, ... N shares."""
        return sum(piece.stop for piece in split_even(batch, len(self.runners)))


class _Passes:
    """Progress over several passes: the images of the passes started before the current one, plus its own."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.started = progress, total, 0

    def start(self, label: str, images: int) -> Progress | None:
        """The progress of a pass of `images` images starting now, under `label`."""
        offset = self.started
        self.started += images
        if not self.progress:
            return None
        return lambda _label, done, _total: self.progress(label, offset + done, self.total)

    def skip(self, images: int) -> None:
        """Counted in the total, not run after all (the second warm-up where every runner stays in use)."""
        self.started += images


class _Counter:
    """Progress over several devices: each device's images done, summed, passed on."""

    def __init__(self, progress: Progress | None, devices: int, total: int):
        self.progress, self.done, self.total = progress, [0] * devices, total
        self.lock = threading.Lock()

    def for_device(self, index: int) -> Progress | None:
        if not self.progress:
            return None

        def report(label: str, done: int, _total: int) -> None:
            with self.lock:  # the devices' threads report at once
                self.done[index] = done
                self.progress(label, sum(self.done), self.total)

        return report
