"""The HTML report's charts, drawn as inline SVG by this module: a timeline (a row per
track, a bar per span), a log-log roofline (a point per step) and a horizontal bar chart
(a bar per candidate, bench's times side by side). Nothing is fetched:
the SVG is text in the page, styled by the page's CSS (page.py), and every bar and
point carries a <title>, which a browser shows on hover.

The charts take plain values (Bar, Point, Roof), not records, so that any command
can draw them; html_sections.py turns a run's records into them.
"""
from __future__ import annotations

import math
from html import escape
from typing import NamedTuple

from ..core.texttable import elide_middle

WIDTH = 960  # the viewBox's width; the SVG scales to the page
LABEL_WIDTH = 230  # the timeline's track names, left of its bars
ROW_HEIGHT = 22
CHAR_WIDTH = 6.2  # of the 11px labels inside bars: a name is written on a bar only where it fits
LABEL_CHAR_WIDTH = 7.0  # of the roof's 12px names
ROOF_HEIGHT = 420
ROOF_MARGIN = (70, 20, 20, 50)  # left, right, top, bottom
POINT_LABELS = 24  # up to this many points, each is named beside it; more would be clutter (hover still names them)
VALUE_WIDTH = 110  # the bar chart's room right of its longest bar, for the figure written after each bar
LABEL_CHARS = 36  # of a bar's name left of it: longer ones are cut in the middle (hover gives them whole)


class Bar(NamedTuple):
    """One span on a timeline track, in ms from the start of the run."""

    name: str
    kind: str  # "plugin", "onnxruntime", "copy", "graph": the bar's colour (page.py's CSS)
    start_ms: float
    end_ms: float
    detail: str = ""  # more for the hover text


class Track(NamedTuple):
    label: str
    bars: list[Bar]


class Point(NamedTuple):
    """One step on the roofline: FLOPs per byte moved, and the GFLOP/s it reached."""

    name: str
    intensity: float
    gflops_per_s: float
    detail: str = ""


class Roof(NamedTuple):
    """A device's ceilings, as lab/roofline.py measures them."""

    bytes_per_s: float
    flops_per_s: float

    def gflops_at(self, intensity: float) -> float:
        return min(self.flops_per_s, self.bytes_per_s * intensity) / 1e9


def _num(value: float) -> str:
    return f"{value:.1f}"


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
            f'aria-label="{escape(label)}">\n' + "\n".join(body) + "\n</svg>")


def _text(x: float, y: float, text: str, cls: str, anchor: str = "start") -> str:
    return f'<text x="{_num(x)}" y="{_num(y)}" class="{cls}" text-anchor="{anchor}">{escape(text)}</text>'


def nice_step(span: float, ticks: int = 8) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten giving about `ticks` ticks over `span`."""
    raw = span / ticks if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def timeline_svg(tracks: list[Track], total_ms: float) -> str:
    """A row per track, a bar per span; the axis runs from 0 to `total_ms` (at least the last end)."""
    end = max([total_ms, *(bar.end_ms for track in tracks for bar in track.bars)]) or 1.0
    plot = WIDTH - LABEL_WIDTH - 20
    height = 30 + ROW_HEIGHT * len(tracks) + 10

    def x(ms: float) -> float:
        return LABEL_WIDTH + plot * ms / end

    body = []
    step = nice_step(end)
    for i in range(int(end / step) + 1):
        at = x(i * step)
        body.append(f'<line x1="{_num(at)}" y1="20" x2="{_num(at)}" y2="{height - 10}" class="grid"/>')
        body.append(_text(at, 14, f"{i * step:g} ms", "tick", "middle"))
    for row, track in enumerate(tracks):
        top = 26 + ROW_HEIGHT * row
        body.append(_text(LABEL_WIDTH - 8, top + 15, track.label, "track", "end"))
        for bar in track.bars:
            left, width = x(bar.start_ms), max(plot * (bar.end_ms - bar.start_ms) / end, 1.0)  # a short step stays visible
            title = f"{bar.name} ({bar.kind}): starts at {bar.start_ms:.3f} ms, takes {bar.end_ms - bar.start_ms:.3f} ms"
            if bar.detail:
                title += f"; {bar.detail}"
            body.append(f'<rect x="{_num(left)}" y="{top + 2}" width="{width:.2f}" height="{ROW_HEIGHT - 6}" '
                        f'class="bar {escape(bar.kind)}"><title>{escape(title)}</title></rect>')
            if width > CHAR_WIDTH * len(bar.name) + 6:
                body.append(_text(left + 3, top + 14, bar.name, "barlabel"))
    return _svg(WIDTH, height, body, "timeline of one run")


class LogAxis(NamedTuple):
    """A log10 scale from the decade at or below `low` to the one at or above `high`, onto pixels."""

    first: int  # decade exponents
    last: int
    start_px: float
    end_px: float

    @classmethod
    def spanning(cls, low: float, high: float, start_px: float, end_px: float) -> "LogAxis":
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        return cls(first, max(last, first + 1), start_px, end_px)

    def __call__(self, value: float) -> float:
        share = (math.log10(value) - self.first) / (self.last - self.first)
        return self.start_px + share * (self.end_px - self.start_px)

    def value_at(self, px: float) -> float:
        return 10 ** (self.first + (px - self.start_px) / (self.end_px - self.start_px) * (self.last - self.first))

    def decades(self) -> list[float]:
        return [10.0**k for k in range(self.first, self.last + 1)]


def decade_label(value: float) -> str:
    return f"{value:g}" if 1e-3 <= value < 1e4 else f"1e{round(math.log10(value))}"


def roofline_svg(points: list[Point], roof: Roof | None) -> str:
    """Log-log: FLOPs per byte on x, GFLOP/s on y; with `roof`, the bandwidth slope and the compute ceiling."""
    left, right, top, bottom = ROOF_MARGIN
    xs = [p.intensity for p in points] or [1.0]
    ys = [p.gflops_per_s for p in points] or [1.0]
    if roof is not None:
        ridge = roof.flops_per_s / roof.bytes_per_s
        xs, ys = [*xs, ridge], [*ys, roof.flops_per_s / 1e9]
    x = LogAxis.spanning(min(xs) / 2, max(xs) * 2, left, WIDTH - right)
    y = LogAxis.spanning(min(ys) / 2, max(ys) * 2, ROOF_HEIGHT - bottom, top)
    body = [f'<rect x="{left}" y="{top}" width="{WIDTH - left - right}" height="{ROOF_HEIGHT - top - bottom}" class="frame"/>']
    for value in x.decades():
        at = x(value)
        body.append(f'<line x1="{_num(at)}" y1="{top}" x2="{_num(at)}" y2="{ROOF_HEIGHT - bottom}" class="grid"/>')
        body.append(_text(at, ROOF_HEIGHT - bottom + 16, decade_label(value), "tick", "middle"))
    for value in y.decades():
        at = y(value)
        body.append(f'<line x1="{left}" y1="{_num(at)}" x2="{WIDTH - right}" y2="{_num(at)}" class="grid"/>')
        body.append(_text(left - 6, at + 4, decade_label(value), "tick", "end"))
    body.append(_text((left + WIDTH - right) / 2, ROOF_HEIGHT - 8, "arithmetic intensity (FLOPs per byte moved)", "axis", "middle"))
    body.append(f'<text transform="translate(16 {(top + ROOF_HEIGHT - bottom) / 2:.0f}) rotate(-90)" class="axis" '
                f'text-anchor="middle">achieved GFLOP/s</text>')
    if roof is not None:
        body += _roof_lines(roof, x, y)
    named = len(points) <= POINT_LABELS
    for p in points:
        cx, cy = x(p.intensity), y(p.gflops_per_s)
        title = f"{p.name}: {p.intensity:.3g} FLOPs/byte, {p.gflops_per_s:.4g} GFLOP/s"
        if p.detail:
            title += f"; {p.detail}"
        body.append(f'<circle cx="{_num(cx)}" cy="{_num(cy)}" r="5" class="point"><title>{escape(title)}</title></circle>')
        if named:
            body.append(_text(cx + 8, cy - 6, p.name, "pointlabel"))
    return _svg(WIDTH, ROOF_HEIGHT, body, "roofline")


def _roof_lines(roof: Roof, x: LogAxis, y: LogAxis) -> list[str]:
    """The memory slope up to the ridge, the compute ceiling after it, each named."""
    low, high = 10.0**x.first, 10.0**x.last
    ridge = roof.flops_per_s / roof.bytes_per_s
    start = max(low, 10.0**y.first * 1e9 / roof.bytes_per_s)  # the slope enters at the chart's foot or its left edge
    corners = [(start, roof.gflops_at(start)), (ridge, roof.gflops_at(ridge)), (high, roof.gflops_at(high))]
    path = " ".join(f"{x(i):.1f},{y(g):.1f}" for i, g in corners)
    # both names under their line: the ceiling's at the right edge, the slope's ending at the ridge,
    # as low as the slope is at the name's left end, so that the rising line never crosses it
    copy = f"copy {roof.bytes_per_s / 1e9:,.0f} GB/s"
    left_end = x.value_at(x(ridge) - 8 - LABEL_CHAR_WIDTH * len(copy))
    return [f'<polyline points="{path}" class="roof"/>',
            _text(x.end_px - 6, y(roof.flops_per_s / 1e9) + 16, f"FP32 {roof.flops_per_s / 1e12:.1f} TFLOP/s", "rooflabel", "end"),
            _text(x(ridge) - 8, y(roof.gflops_at(left_end)) + 16, copy, "rooflabel", "end")]


def figure(value: float) -> str:
    """Four significant digits; whole numbers with thousands separators from 10,000 up (images/s)."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


class HBar(NamedTuple):
    """One row of a bar chart: a name and its figure; without a figure (None) the row shows `note`."""

    name: str
    value: float | None
    kind: str  # the bar's colour (page.py's CSS: "opplugin", "inexact", "user", "peer")
    detail: str = ""  # more for the hover text
    note: str = ""  # written in place of the bar where there is no figure (why there is none)


def bars_svg(bars: list[HBar], unit: str, marker: tuple[str, float] | None = None) -> str:
    """A bar per row on one linear axis from 0, its figure after it; `marker` is a named
    vertical line (a floor) at its value."""
    values = [bar.value for bar in bars if bar.value is not None] + ([marker[1]] if marker else [])
    end = max(values, default=0.0) or 1.0
    plot = WIDTH - LABEL_WIDTH - VALUE_WIDTH
    height = 30 + ROW_HEIGHT * len(bars) + 10

    def x(value: float) -> float:
        return LABEL_WIDTH + plot * value / end

    body = []
    step = nice_step(end, 6)
    for i in range(int(end / step) + 1):
        at = x(i * step)
        body.append(f'<line x1="{_num(at)}" y1="20" x2="{_num(at)}" y2="{height - 10}" class="grid"/>')
        body.append(_text(at, 14, figure(i * step), "tick", "middle"))
    body.append(_text(LABEL_WIDTH - 8, 14, unit, "axis", "end"))
    for row, bar in enumerate(bars):
        top = 26 + ROW_HEIGHT * row
        body.append(_text(LABEL_WIDTH - 8, top + 15, elide_middle(bar.name, LABEL_CHARS), "track", "end"))
        if bar.value is None:
            body.append(_text(LABEL_WIDTH + 4, top + 15, bar.note or "no figure", "tick"))
            continue
        title = f"{bar.name}: {figure(bar.value)} {unit}" + (f"; {bar.detail}" if bar.detail else "")
        width = max(x(bar.value) - LABEL_WIDTH, 1.0)  # a tiny figure stays visible
        body.append(f'<rect x="{LABEL_WIDTH}" y="{top + 2}" width="{width:.2f}" height="{ROW_HEIGHT - 6}" '
                    f'class="bar {escape(bar.kind)}"><title>{escape(title)}</title></rect>')
        body.append(_text(LABEL_WIDTH + width + 5, top + 15, figure(bar.value), "value"))
    if marker:
        at = x(marker[1])
        body.append(f'<line x1="{_num(at)}" y1="20" x2="{_num(at)}" y2="{height - 10}" class="marker"/>')
        body.append(_text(at + 4, height - 2, f"{marker[0]} {figure(marker[1])}", "markerlabel"))
    return _svg(WIDTH, height + 6, body, f"bar chart, {unit}")
