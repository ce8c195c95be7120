"""`opplugin bench --scaling [MODEL]`: images/s of one batch split over 1, 2, ... N devices
(runtime/multi_device.py, the path of `run --devices`), and how well it scales.

For each batch and each device list (default 0; 0,1; ... up to every GPU of the host), the
batch is split in order over a runner per entry of the list, all running at once, and timed
host to host: from the caller's input arrays, in pinned host memory on a GPU, to the
outputs back in input order. A list's figure is the median wall time of its timed passes;

    speed-up   = images/s on the list / images/s on the one-device list
    efficiency = speed-up / runners on the list     (1.0: perfect scaling)

An id may repeat (`0,0`: two runners on one GPU). Such a list exercises the split, the
threads and the reassembly, but its runners share one GPU: its efficiency says what the
split costs there, not how the model scales, and the table marks it.

Before its figure counts, every list's outputs are compared with onnxruntime CPU on the
first and last rows of the batch and the rows either side of every share boundary (where a
row put back in the wrong place would show), and with the one-device list's outputs over
the whole batch (their largest absolute difference). Runners are built before timing;
their build time (plans, kernel compiles) is reported apart.

Each list is timed as given: that is the curve. `run --devices` with the same list would first
time 1, 2, ... N of its devices and use the count the host feeds fastest (runtime/feeding.py);
each row says which count that is (`feeding`), from the same probe run on its runners after
they are timed, so a list that scales badly shows beside what `run` would do with it.
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..gpu import cuda
from ..verify.check import agreement
from ..inputs.feeds import make_inputs
from ..errors import DeviceError, InputError
from ..report.jsonout import header, json_safe
from ..graph.model import Model
from ..runtime import Runner
from ..runtime.feeding import Feeding, probe_skipped
from ..runtime.multi_device import DeviceRunners, DeviceSlot, cuda_slots

# 1: a row per batch and device list, each with its runners' own rows
# 2: feeding: how many of the list's devices run --devices would use, and the feed probe behind it
SCHEMA = "opplugin-bench-scaling/2"
DEFAULT_MODEL = "lenet86"
DEFAULT_BATCHES = (200_000,)
WARMUP, REPEAT = 2, 5
SEED = 0
# rows compared with onnxruntime at each end of the batch and on each side of a share boundary
EDGE_ROWS = 4

ROW_KEYS = ("batch", "devices", "runners", "gpus", "shared_gpu", "images_per_s", "time_ms", "times_ms", "speedup", "efficiency",
            "build_s", "input_pinned", "compared_rows", "agrees", "max_abs_error", "rel_l2", "max_abs_vs_one", "per_runner", "feeding")


@dataclass(frozen=True)
class DeviceList:
    """One `--devices` list of the benchmark: its text as given and a slot per runner."""

    text: str
    slots: tuple[DeviceSlot, ...]

    @property
    def runners(self) -> int:
        return len(self.slots)

    @property
    def gpus(self) -> int:
        """Distinct devices the runners use (fewer than runners when an id repeats)."""
        return len(set(self.slots))


def device_lists(texts: Sequence[str] | None) -> list[DeviceList]:
    """The lists to time: each like `run --devices` (all, or ids; one-line InputError when
    one cannot be used); by default 0, then 0,1, and so on up to every CUDA device. One
    list must have a single runner: it is the baseline the efficiency is taken against."""
    count = cuda.device_count()
    if not count:
        raise DeviceError("bench --scaling needs a CUDA device, and CuPy sees none")
    if texts is None:
        texts = [",".join(str(index) for index in range(used)) for used in range(1, count + 1)]
    lists = [DeviceList(text, tuple(cuda_slots(text))) for text in texts]
    seen: set[tuple[DeviceSlot, ...]] = set()
    for entry in lists:
        if entry.slots in seen:
            raise InputError(f"--devices {entry.text}: this list is given twice; give each list once")
        seen.add(entry.slots)
    if not any(entry.runners == 1 for entry in lists):
        raise InputError(f"--devices {' '.join(texts)}: give a one-device list too (such as 0); "
                         "efficiency is images/s on n devices over n times that of one")
    return lists


def sample_rows(batch: int, shares: Sequence[slice | None], edge: int = EDGE_ROWS) -> np.ndarray:
    """The rows compared with onnxruntime: `edge` rows at each end of the batch and either
    side of every boundary between shares, in order, each once."""
    starts = [piece.start for piece in shares if piece is not None and piece.start > 0]
    picked = {row for start in [0, batch, *starts] for row in range(start - edge, start + edge) if 0 <= row < batch}
    return np.array(sorted(picked), dtype=np.int64)


def add_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row (one batch) with `speedup` and `efficiency` against the first one-runner row;
    None where a rate is missing."""
    base = next((row["images_per_s"] for row in rows if row["runners"] == 1), None)
    for row in rows:
        rate = row["images_per_s"]
        ok = rate is not None and base
        row["speedup"] = rate / base if ok else None
        row["efficiency"] = rate / (base * row["runners"]) if ok else None
    return rows


def _compare(model: Model, devices: DeviceRunners, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
             shares: Sequence[slice | None], batch: int) -> dict[str, Any]:
    """The first output on the sample rows against onnxruntime CPU."""
    rows = sample_rows(batch, shares)
    batched = devices.layout.batched_inputs
    piece = {name: (value[rows] if name in batched else value) for name, value in feeds.items()}
    found = agreement(devices.runners[0].plan_record(len(rows)), piece, outputs[model.outputs[0]][rows])
    return {"compared_rows": len(rows), "agrees": found["passed"], "max_abs_error": found["max_abs_error"], "rel_l2": found["rel_l2"]}


def _max_abs(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray] | None) -> float | None:
    if theirs is None:
        return None
    return max(float(np.max(np.abs(ours[name].astype(np.float64) - theirs[name]), initial=0.0)) for name in ours)


def _with_spans(rows: list[dict[str, Any]], spans_ms: list[list[tuple[float, float] | None]]) -> list[dict[str, Any]]:
    """Each runner's row with when its run began and ended in a pass (medians, ms from the
    pass's start): the pass's time past the last end is the threads' and the gathering's."""
    for index, row in enumerate(rows):
        found = [spans[index] for spans in spans_ms if spans[index] is not None]
        row["started_ms"] = statistics.median(span[0] for span in found) if found else None
        row["finished_ms"] = statistics.median(span[1] for span in found) if found else None
    return rows


def run_would_use(devices: DeviceRunners, feeds: dict[str, np.ndarray], batch: int) -> Feeding:
    """How many of the list's devices `run --devices` would use at this batch: its feed probe, on
    runners already warm, or all of them where run would not probe (feeding.probe_skipped)."""
    skipped = probe_skipped(batch, len(devices.runners))
    return Feeding.unprobed(len(devices.runners), skipped) if skipped else devices.probe_feeding(feeds)


MakeRunner = Callable[[DeviceSlot, int], Runner]


def default_runner(model: Model) -> MakeRunner:
    """A runner of `model` with the defaults `run` uses, built on its slot's device for its share."""
    return lambda slot, share: Runner(model, share, slot.device())


def time_list(model: Model, feeds: dict[str, np.ndarray], batch: int, entry: DeviceList, make_runner: MakeRunner,
              warmup: int, repeat: int, one: dict[str, np.ndarray] | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One list at one batch: its row, and its last pass's outputs."""
    started = time.perf_counter()
    devices = DeviceRunners(model, entry.slots, make_runner, batch)
    build_s = time.perf_counter() - started
    measured = devices.profile(feeds, warmup, repeat, feed_probe=False)  # each list timed as given: the curve
    last = measured.last
    ms = statistics.median(measured.total_ms)
    row = {
        "batch": batch, "devices": entry.text, "runners": entry.runners, "gpus": entry.gpus,
        "shared_gpu": entry.gpus < entry.runners, "images_per_s": batch / (ms / 1e3) if ms > 0 else None,
        "time_ms": ms, "times_ms": list(measured.total_ms), "speedup": None, "efficiency": None, "build_s": build_s,
        "input_pinned": all(result.input_pinned for result in last.results if result is not None),
        **_compare(model, devices, feeds, last.outputs, last.rows, batch),
        "max_abs_vs_one": _max_abs(last.outputs, one), "per_runner": _with_spans(measured.rows(), measured.spans_ms),
        "feeding": run_would_use(devices, feeds, batch).record(devices.labels),  # after the timed passes: they warmed it
    }
    outputs = last.outputs
    del devices, measured, last  # each list's runners go before the next list's are built,
    gc.collect()  # cycles and all, so that the next list's runners size their chunks on the whole device
    if entry.slots[0].cuda_id is not None:
        cuda.release_cached_memory()
    return row, outputs


def run_scaling(model: Model, batches: Sequence[int], lists: Sequence[DeviceList], warmup: int = WARMUP, repeat: int = REPEAT,
                make_runner: MakeRunner | None = None, seed: int = SEED,
                say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """The payload: the header, the settings and a row per batch and list, in the order given
    (the one-runner baseline is timed first)."""
    make_runner = make_runner or default_runner(model)
    first = lists[0].slots[0]
    with first.context():
        device = first.device()
    ordered = sorted(lists, key=lambda entry: entry.runners != 1)  # stable: the first one-runner list leads
    rows = []
    for batch in batches:
        inputs = make_inputs(model, batch, "random", seed, pinned=device.is_cuda)
        batch_rows, one = [], None
        for entry in ordered:
            say(f"{model.name}: {batch:,} images over --devices {entry.text} ({entry.runners} runner{'s' if entry.runners > 1 else ''})")
            row, outputs = time_list(model, inputs.feeds, batch, entry, make_runner, warmup, repeat, one)
            if one is None:  # the baseline: the lists after it are compared with its outputs
                one, row["max_abs_vs_one"] = outputs, 0.0
            batch_rows.append(row)
        order = {entry.text: index for index, entry in enumerate(lists)}
        rows += sorted(add_scaling(batch_rows), key=lambda row: order[row["devices"]])
        del inputs, one
    payload = header(SCHEMA, device, model.name, list(batches)) | {
        "settings": {"warmup": warmup, "repeat": repeat, "data": f"random uniform [0, 1), seed {seed}",
                     "timing": "host to host, median wall time of the timed passes, every runner at once",
                     "device_count": cuda.device_count()},
        "rows": [{key: row[key] for key in ROW_KEYS} for row in rows],
    }
    return json_safe(payload)


def failed(payload: dict[str, Any]) -> bool:
    return any(not row["agrees"] for row in payload["rows"])
