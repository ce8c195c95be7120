"""A progress bar on stderr for long runs, with no dependency.

On a terminal it redraws one line in place, and only once the work has taken
longer than a moment (short runs print nothing). Into a file or a pipe it never
writes carriage returns: it prints a plain line at each quarter, when asked to
(a run of many chunks) or once the work has gone on for a while, so logs of
short runs stay quiet and long ones show they are moving.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24
# A terminal gets no bar for work that ends sooner than this.
SHOW_AFTER_S = 0.5
REDRAW_EVERY_S = 0.1
# Into a log, quarter lines start once the work has taken this long, even unasked.
LOG_AFTER_S = 5.0


class ProgressBar:
    """Callable as progress(label, done, total), counting images (or another `unit`)."""

    def __init__(self, stream: TextIO | None = None, plain_lines: bool = False, clock=time.monotonic, unit: str = "images"):
        self.stream = stream or sys.stderr
        self.unit = unit
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.plain_lines = plain_lines
        self.clock = clock
        self.started = clock()
        self.last_draw = 0.0
        self.drawn = False
        self.next_quarter = 1

    def __call__(self, label: str, done: int, total: int) -> None:
        if total <= 0:
            return
        now = self.clock()
        if self.tty:
            self._redraw(label, done, total, now)
        elif self.plain_lines or now - self.started >= LOG_AFTER_S:
            self._quarter_lines(label, done, total, now)

    def _rate(self, done: int, now: float) -> str:
        elapsed = now - self.started
        return f"{done / elapsed:,.0f} {self.unit}/s" if elapsed > 0 and done else "-"

    def _redraw(self, label: str, done: int, total: int, now: float) -> None:
        finished = done >= total
        if now - self.started < SHOW_AFTER_S and not self.drawn:
            return
        if not finished and now - self.last_draw < REDRAW_EVERY_S:
            return
        filled = int(BAR_WIDTH * min(done, total) / total)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        line = f"\r{label:<10} [{bar}] {100 * done / total:5.1f}%  {done:,}/{total:,} {self.unit}  {self._rate(done, now)}"
        self.stream.write(line + ("\n" if finished else ""))
        self.stream.flush()
        self.last_draw, self.drawn = now, not finished

    def _quarter_lines(self, label: str, done: int, total: int, now: float) -> None:
        """A line when `done` passes the next quarter. The line gives `done`'s own share, rounded
        down: a pass of many images may cross a quarter well before its end, or two at once."""
        if self.next_quarter > 4 or done * 4 < total * self.next_quarter:
            return
        while self.next_quarter <= 4 and done * 4 >= total * self.next_quarter:
            self.next_quarter += 1
        self.stream.write(f"progress: {100 * done // total}% ({done:,}/{total:,} {self.unit}, {label}, {self._rate(done, now)})\n")
        self.stream.flush()

    def close(self) -> None:
        """End a bar that was left mid-line (an error, an interrupt)."""
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


class PassBars:
    """Callable as progress(label, done, total) for work done in passes, one label a pass: a fresh
    ProgressBar for each pass, so that each shows its own start and quarters."""

    def __init__(self, stream: TextIO | None = None, unit: str = "images"):
        self.stream, self.unit = stream, unit
        self.label: str | None = None
        self.bar: ProgressBar | None = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self.label:
            self.close()
            self.label, self.bar = label, ProgressBar(self.stream, unit=self.unit)
        self.bar(label, done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
