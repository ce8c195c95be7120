"""The HTML report (`--report FILE.html`): one self-contained page, a header of facts
and a list of sections, each a title, a line saying what it shows, and its HTML.

Self-contained means it opens offline, years later: the CSS is inline, the charts are
inline SVG (charts.py), there is no script, font or image to fetch. A command builds
its sections (html_sections.py for run and check) and calls `render`; a new command
adds sections of its own the same way.
"""
from __future__ import annotations

import datetime
from html import escape
from typing import Any, NamedTuple, Sequence

from .. import __version__

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d232b; margin: 0 auto; max-width: 1240px; padding: 0 20px 40px; }
h1 { font-size: 22px; margin: 22px 0 6px; }
h2 { font-size: 17px; margin: 30px 0 4px; border-bottom: 1px solid #d5dae1; padding-bottom: 3px; }
p.note { color: #57606a; margin: 2px 0 10px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; }
dl.facts dt { color: #57606a; } dl.facts dd { margin: 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e6e9ee; text-align: left; vertical-align: top; }
th { background: #f3f5f8; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.fail td { background: #fdecec; } td.fail { color: #b3261e; font-weight: 600; } td.pass { color: #1a7f37; }
.wide { overflow-x: auto; }
svg { width: 100%; height: auto; font-size: 11px; }
svg .grid { stroke: #e3e7ec; } svg .frame { fill: none; stroke: #aab2bd; }
svg .tick, svg .track { fill: #57606a; } svg .axis { fill: #1d232b; font-size: 12px; }
svg .bar { stroke: #ffffff; stroke-width: 0.5; } svg .bar:hover, svg .point:hover { stroke: #000000; stroke-width: 1.5; }
svg .plugin { fill: #3b6fd4; } svg .onnxruntime { fill: #e08a2c; } svg .copy { fill: #9aa0a6; }
svg .graph { fill: #8e5bd0; opacity: 0.55; }
svg .barlabel { fill: #ffffff; pointer-events: none; }
svg .point { fill: #3b6fd4; fill-opacity: 0.8; stroke: #1d3f80; } svg .pointlabel { fill: #1d232b; }
svg .roof { fill: none; stroke: #b3261e; stroke-width: 2; } svg .rooflabel { fill: #b3261e; font-size: 12px; }
svg .opplugin { fill: #3b6fd4; } svg .inexact { fill: #9db8ec; } svg .user { fill: #2e9d5b; } svg .peer { fill: #e08a2c; }
svg .value { fill: #1d232b; } svg .marker { stroke: #b3261e; stroke-width: 1.5; stroke-dasharray: 5 3; } svg .markerlabel { fill: #b3261e; }
.legend span { display: inline-block; margin-right: 14px; } .legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
"""


class Section(NamedTuple):
    title: str
    body: str  # HTML, every text in it escaped by whoever made it
    note: str = ""  # plain text under the title: what the section shows, or why it is empty


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = (),
          row_classes: Sequence[str] | None = None, cell_classes: dict[tuple[int, int], str] | None = None) -> str:
    """An HTML table of plain values (escaped here); `numeric` columns are right-aligned."""
    numeric = set(numeric)

    def cell(r: int, c: int, value: Any) -> str:
        classes = " ".join(filter(None, ["num" if c in numeric else "", (cell_classes or {}).get((r, c), "")]))
        return f'<td class="{classes}">{escape(str(value))}</td>' if classes else f"<td>{escape(str(value))}</td>"

    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{row_classes[r]}"' if row_classes and row_classes[r] else ""
        body.append(f"<tr{cls}>" + "".join(cell(r, c, v) for c, v in enumerate(row)) + "</tr>")
    return f'<div class="wide"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(body) + "\n</tbody></table></div>"


def legend(kinds: Sequence[str]) -> str:
    """Colour keys for the timeline's kinds of bar (the CSS classes above)."""
    keys = "".join(f'<span><svg width="12" height="12" viewBox="0 0 12 12" style="width:12px"><rect width="12" height="12" '
                   f'class="key {escape(k)}"/></svg> {escape(k)}</span>' for k in kinds)
    return f'<p class="legend">{keys}</p>'


def facts(pairs: Sequence[tuple[str, Any]]) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in pairs) + "</dl>"


def header_facts(report: dict[str, Any], generated: datetime.datetime | None = None) -> list[tuple[str, str]]:
    """Model, device, batch, version and date, from the header every JSON report shares (jsonout.py)."""
    device = report["device"]
    where = device["name"] if device["kind"] == "cuda" else "CPU (no CUDA device: plugin steps ran the numpy reference backend)"
    if device.get("compute_capability"):
        where += f", compute capability {device['compute_capability']}"
    when = (generated or datetime.datetime.now().astimezone()).strftime("%Y-%m-%d %H:%M %Z").strip()
    return [("model", str(report["model"])), ("device", where), ("batch", str(report["batch"])),
            ("opplugin", report.get("opplugin_version", __version__)), ("date", when)]


def render(title: str, header: Sequence[tuple[str, Any]], sections: Sequence[Section]) -> str:
    """The whole page: the title, the header's facts, then each section in order."""
    parts = [f"<h1>{escape(title)}</h1>", facts(header)]
    for section in sections:
        parts.append(f'<section><h2>{escape(section.title)}</h2>')
        if section.note:
            parts.append(f'<p class="note">{escape(section.note)}</p>')
        parts.append(section.body + "</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n" + "\n".join(parts) + "\n</body>\n</html>\n")
