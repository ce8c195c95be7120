"""What a command writes once its work is done: a JSON report, and for run and check the
--save-outputs file."""
from __future__ import annotations

import sys
from typing import Any

from ..core.files import write_atomic
from ..inputs.user_data import save_arrays
from ..report.jsonout import dumps
from .options import DataOptions


def write_json(path: str, payload: dict) -> None:
    """A report as JSON, written whole (`-`: standard output)."""
    write_atomic(path, dumps(payload))


def save_outputs(data: DataOptions, arrays: dict[str, Any]) -> None:
    """--save-outputs: the graph's outputs and the --keep tensors, one .npz file (nothing without the flag)."""
    if data.save_outputs:
        save_arrays(data.save_outputs, arrays)
        print(f"Saved {', '.join(arrays)} to {data.save_outputs}", file=sys.stderr)
