"""The tuning cache: which configured Conv variant `opplugin tune` found fastest.

One JSON file, `tuning.json`, in the user's cache directory (core/paths.cache_dir). An entry is keyed by

- the GPU's name (a kernel's speed is a property of the chip),
- the node's shape signature (ops/conv/choice.shape_signature: every ConvSpec field but the batch, plus the
  fused epilogue; the kernel compiled for the node is a function of these),
- the batch bucket: the power of two at or above the batch (occupancy, and so
  the best tile, changes with the number of images, but slowly),
- the opplugin version (a new release may change the kernels behind a name),
- the precision (`tune --precision`: an FP16 choice is of wg_fp16's or dw_fp16's configurations, and sits beside
  the FP32 one for the same step; an entry without the field, as older files hold, is FP32's),

and holds the chosen configuration's name (ops/config_grammar.py: the name is
read back where the choice is made), its median ms, the runners-up and the date.

Writes go to a temporary file in the same directory, then `os.replace`, so a
reader never sees half a file. A file that is not valid JSON or not in this
format is ignored with one warning and replaced on the next write: the cache
is an optimisation, never a reason to fail.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ...core.number_formats import FP32
from ...errors import positive_int
from ...core.files import write_atomic
from ...core.paths import cache_dir


FILE_NAME = "tuning.json"
FORMAT = "opplugin-tuning-cache"
# 2: the configurations' names follow the one grammar (const_rb_t8x1_m4, not const_rb_r8m4)
FORMAT_VERSION = 2
# A lookup for a batch nobody tuned takes the nearest tuned bucket of the same
# GPU, shape and version, at most this many powers of two away: the runner
# launches kernels per chunk (1134 images of lenet86 when the batch is 10000),
# and the ranking of configurations barely moves within a factor of 16.
NEAREST_BUCKETS = 4


class TuningCacheWarning(UserWarning):
    """The cache file could not be read or is not ours; it is treated as empty."""


def cache_path() -> Path:
    return cache_dir() / FILE_NAME


def batch_bucket(batch: int) -> int:
    """The power of two at or above `batch` (1 for a batch of 1)."""
    return 1 << (positive_int(batch, "batch") - 1).bit_length()


@dataclass(frozen=True)
class CacheKey:
    """What a tuned choice holds for: the GPU, the step's shape and epilogue, the batch bucket,
    the opplugin version (a new release tunes afresh) and the precision it runs in."""

    gpu: str
    signature: str
    bucket: int
    version: str
    precision: str = FP32

    @property
    def text(self) -> str:
        """The entry's name in the JSON file; FP32's keeps the name it had before keys held a precision."""
        text = f"{self.gpu} | {self.signature} | batch<={self.bucket} | opplugin {self.version}"
        return text if self.precision == FP32 else f"{text} | {self.precision}"


def key_for(signature: str, batch: int, gpu: str, version: str | None = None, precision: str = FP32) -> CacheKey:
    """The key of a step whose shape and epilogue read `signature` (the op's own, e.g.
    ops/conv/choice.shape_signature), at `batch`, on `gpu`, run in `precision`."""
    if version is None:
        import opplugin

        version = opplugin.__version__  # read at call time: tests (and upgrades) change it
    return CacheKey(gpu, signature, batch_bucket(batch), version, precision)


@dataclass
class Choice:
    """The fastest configuration that passed for one key, and its measured time."""

    variant: str  # a configuration's name, e.g. "const_rb_t8x1_m4"
    median_ms: float
    batch: int  # the batch it was timed at
    runners_up: list[dict[str, Any]] = field(default_factory=list)  # [{"variant", "median_ms"}], fastest first
    date: str = ""  # ISO 8601, UTC

    @staticmethod
    def now() -> str:
        return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


# --- reading --------------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(path: Path, why: str) -> None:
    if str(path) in _warned:
        return
    _warned.add(str(path))
    warnings.warn(f"opplugin: ignoring the tuning cache {path}: {why}", TuningCacheWarning, stacklevel=3)


def load_entries(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The file's entries by key text; {} (after one warning) when it is missing,
    unreadable, not JSON or not a tuning cache."""
    path = Path(path) if path is not None else cache_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        _warn_once(path, f"cannot read it ({err})")
        return {}
    try:
        data = json.loads(text)
    except ValueError as err:
        _warn_once(path, f"not valid JSON ({err})")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        _warn_once(path, f"not an opplugin tuning cache (no \"format\": \"{FORMAT}\" with \"entries\")")
        return {}
    if data.get("format_version") != FORMAT_VERSION:
        _warn_once(path, f"format version {data.get('format_version')!r}, this opplugin reads {FORMAT_VERSION}")
        return {}
    return {k: v for k, v in data["entries"].items() if _valid_entry(v)}


def _valid_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("variant"), str)
        and isinstance(entry.get("gpu"), str)
        and isinstance(entry.get("signature"), str)
        and isinstance(entry.get("version"), str)
        and isinstance(entry.get("bucket"), int)
        and entry["bucket"] >= 1
        and isinstance(entry.get("median_ms"), (int, float))
        and isinstance(entry.get("precision", FP32), str)
    )


def _choice(entry: dict[str, Any]) -> Choice:
    runners_up = entry.get("runners_up")
    return Choice(
        variant=entry["variant"],
        median_ms=float(entry["median_ms"]),
        batch=int(entry.get("batch") or entry["bucket"]),
        runners_up=runners_up if isinstance(runners_up, list) else [],
        date=str(entry.get("date", "")),
    )


def lookup(key: CacheKey, path: Path | None = None, nearest: int = NEAREST_BUCKETS) -> Choice | None:
    """The cached choice for `key`: its own bucket, else the closest tuned bucket
    (of the same GPU, shape and version) within `nearest` powers of two, the
    larger one on a tie; None when there is none."""
    entries = load_entries(path)
    exact = entries.get(key.text)
    if exact is not None and _matches(exact, key, key.bucket):
        return _choice(exact)
    candidates = [e for e in entries.values() if _matches(e, key, None)]
    if not candidates:
        return None
    wanted = math.log2(key.bucket)

    def distance(entry):
        return abs(math.log2(entry["bucket"]) - wanted), -entry["bucket"]

    best = min(candidates, key=distance)
    return _choice(best) if distance(best)[0] <= nearest else None


def _matches(entry: dict[str, Any], key: CacheKey, bucket: int | None) -> bool:
    return (
        entry["gpu"] == key.gpu
        and entry["signature"] == key.signature
        and entry["version"] == key.version
        and entry.get("precision", FP32) == key.precision  # written before keys held one: FP32's
        and (bucket is None or entry["bucket"] == bucket)
    )


# --- writing --------------------------------------------------------------------------


def store(choices: dict[CacheKey, Choice], path: Path | None = None) -> Path:
    """Add (or replace) entries, keeping every other entry of a readable file; atomic.
    Raises OSError when the directory cannot be written."""
    path = Path(path) if path is not None else cache_path()
    entries = load_entries(path)
    for key, choice in choices.items():
        entries[key.text] = {**asdict(key), **asdict(choice), "date": choice.date or Choice.now()}
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "entries": dict(sorted(entries.items()))}
    write_atomic(path, json.dumps(payload, indent=2) + "\n")
    return path
