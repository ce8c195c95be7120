"""What every JSON file opplugin writes has in common: the same first keys, and
strict JSON with every key present.

Every report starts with these five keys, in this order:

- `schema`: the file's kind and version, bumped whenever its keys change:
  "opplugin-run/7" (`run --json`), "opplugin-check/1" (`check --json`),
  "opplugin-plan/7" (`plan --json`), "opplugin-bench/4" (`bench --json`),
  "opplugin-tune/1" (`tune --json`), "opplugin-bench-e2e/4" (`bench --e2e --json`),
  "opplugin-bench-scaling/2" (`bench --scaling --json`). The trace that `run --trace` writes is in
  the Chrome trace-event format; it carries the same header, schema
  "opplugin-trace/1", under its "otherData" key.
- `opplugin_version`: the version that wrote the file.
- `device`: where plugin steps ran, always an object with the same keys:
  `kind` ("cuda" or "cpu"), `name` (the GPU's name, or "cpu"),
  `compute_capability` ("9.0"; null on the CPU) and `memory_bytes` (the GPU's
  total memory, or the host's physical memory on the CPU; null when unknown).
- `model`: the model's name. `bench` measures several models: there it is the
  list of their names.
- `batch`: the images per run. `bench` measures several batch sizes: there it
  is their list (`bench --scaling` too).

A key with no value is present with the value null (never left out), and
floats that are not finite (NaN, Inf) are written as null, so the file is
strict JSON that any parser reads.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from .. import __version__
from ..gpu.device import Device


def host_memory_bytes() -> int | None:
    """Physical memory of this machine, where the system says (None elsewhere)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def device_record(device: Device) -> dict[str, Any]:
    """The `device` object of every report."""
    return {
        "kind": device.kind,
        "name": device.name,
        "compute_capability": device.compute_capability or None,
        "memory_bytes": device.memory_bytes if device.is_cuda else host_memory_bytes(),
    }


def header(schema: str, device: Device, model: Any, batch: Any) -> dict[str, Any]:
    """The first keys of every report (see the module's docstring)."""
    return {
        "schema": schema,
        "opplugin_version": __version__,
        "device": device_record(device),
        "model": model,
        "batch": batch,
    }


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as None, tuples as lists and numpy scalars as Python's."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def dumps(payload: dict[str, Any]) -> str:
    """The text of a report file: strict JSON, indented, with a final newline."""
    return json.dumps(json_safe(payload), indent=2, allow_nan=False) + "\n"
