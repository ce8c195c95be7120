"""The implementation `opplugin tune` chose for a custom node: a JSON file in the cache
directory, read by CustomOp.default_variant. A choice holds for one op, device, input shapes and
attributes, and for the implementations it was chosen among (a declaration that gains or loses
one is tuned again)."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.files import write_atomic
from ..core.paths import cache_dir

FILE_NAME = "custom_ops.json"


def choices_path() -> Path:
    return cache_dir() / FILE_NAME


def choice_key(op: str, device: str, shapes: Sequence[tuple[int, ...]], attributes: Mapping[str, Any], variants: Sequence[str]) -> str:
    """What a choice is filed under: the op, the device, its inputs' shapes, its attributes and the variants it had."""
    described = ";".join(["x".join(map(str, s)) for s in shapes])
    settings = ",".join(f"{k}={attributes[k]!r}" for k in sorted(attributes))
    return f"{op}|{device}|{described}|{settings}|{','.join(variants)}"


def load(path: Path | None = None) -> dict[str, str]:
    """Every stored choice (none where the file is missing or unreadable: the default order stays).
    Read again only when the file changes: a plan asks once per custom node and kernel."""
    path = path or choices_path()
    try:
        status = path.stat()
    except OSError:
        return {}
    return dict(_read(path, (status.st_mtime_ns, status.st_size)))


@functools.lru_cache(maxsize=8)
def _read(path: Path, stamp: tuple[int, int]) -> dict[str, str]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(entries, dict) else {}


def store(choices: Mapping[str, str], path: Path | None = None) -> Path:
    """Add (or replace) choices, keeping the others; atomic."""
    path = path or choices_path()
    merged = {**load(path), **choices}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path
