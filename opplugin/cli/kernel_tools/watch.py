"""`--watch`: the kernel writer's loop. Each save of a --kernel file recompiles it,
checks it against onnxruntime and times it, and prints per user-kernel step what
changed since the last result: error, ms and (on a GPU) how far above the roofline
floor. A compile error is printed and the watch goes on; Ctrl-C stops it cleanly.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from ...errors import OpPluginError

POLL_S = 0.3


@dataclass(frozen=True)
class StepResult:
    implementation: str
    max_abs: float | None
    passed: bool
    ms: float | None
    x_floor: float | None


Measure = Callable[[], dict[str, StepResult]]


def _mtimes(paths: list[str]) -> tuple:
    return tuple(os.stat(p).st_mtime_ns if os.path.exists(p) else None for p in paths)


def describe(results: dict[str, StepResult], before: dict[str, StepResult] | None) -> list[str]:
    """A line per step: the figures, and against `before` how they moved."""
    lines = []
    for step, now in results.items():
        old = (before or {}).get(step)
        parts = [f"error {_num(now.max_abs)} {'pass' if now.passed else 'FAIL'}"]
        if old and old.max_abs != now.max_abs:
            parts[0] = f"error {_num(old.max_abs)} -> {_num(now.max_abs)} {'pass' if now.passed else 'FAIL'}"
        if now.ms is not None:
            change = ""
            if old and old.ms:
                change = f" ({(now.ms / old.ms - 1) * 100:+.0f}%)"
                parts.append(f"{old.ms:.3f} -> {now.ms:.3f} ms{change}")
            else:
                parts.append(f"{now.ms:.3f} ms")
        if now.x_floor is not None:
            parts.append(f"{now.x_floor:.1f}x floor" if not old or old.x_floor is None else f"{old.x_floor:.1f} -> {now.x_floor:.1f}x floor")
        lines.append(f"  {step} ({now.implementation}): {', '.join(parts)}")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def watch(paths: list[str], measure: Measure, say: Callable[[str], None] = print, *, cycles: int | None = None,
          poll_s: float = POLL_S) -> int:
    """Measure now, then after every change to one of `paths`; stop after `cycles` changes
    (None: until Ctrl-C). A measure that raises an opplugin error prints it and waits for
    the next save. Returns 0."""
    last: dict[str, StepResult] | None = None
    seen = _mtimes(paths)
    done = 0
    try:
        while True:
            try:
                results = measure()
                say("\n".join([time.strftime("%H:%M:%S ") + ("measured:" if last is None else "after the edit:"),
                               *describe(results, last)]))
                last = results
            except OpPluginError as err:
                say(f"{time.strftime('%H:%M:%S')} {err}")
            if cycles is not None and done >= cycles:
                return 0
            say(f"watching {', '.join(paths)} (Ctrl-C stops)")
            while _mtimes(paths) == seen:
                time.sleep(poll_s)
            time.sleep(poll_s)  # let the editor finish writing
            seen = _mtimes(paths)
            done += 1
    except KeyboardInterrupt:
        say("stopped watching")
        return 0
