"""The table `bench --scaling` prints from its JSON payload (lab/scaling.py), and the optional
picture of images/s and efficiency against the runners of each device list (needs matplotlib)."""
from __future__ import annotations

import importlib.util
import io
from typing import Any

from ..errors import InputError
from ..core.files import write_atomic
from ..core.texttable import text_table
from ..report.timing import format_feeding

SHARED_NOTE = ("* its runners share a GPU (an id repeats): the row exercises the split and the reassembly, "
               "it is not a scaling figure")
LEGEND = ("speed-up: images/s over the one-device list's; efficiency: speed-up / runners (100% is perfect scaling); "
          "vs one: largest |difference| from the one-device list's outputs; onnxruntime: the first output on the "
          "rows at both ends and either side of every share boundary against onnxruntime CPU; run uses: the devices "
          "run --devices would use with the list, the fewest within 3% of the most images/s in its feed probe (a pass "
          "on 1, 2, ... N of them, each on its share of the split over all N), below for each list it probed")
NUMBERS = (2, 3, 4, 5, 6, 7, 8, 9, 11)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _where(payload: dict[str, Any]) -> str:
    device = payload["device"]
    if device["kind"] != "cuda":
        return "the CPU (numpy reference backend)"
    count = payload["settings"]["device_count"]
    return f"{device['name']} ({count} GPU{'s' if count != 1 else ''} on this host)"


def _pinned(payload: dict[str, Any]) -> str:
    if payload["device"]["kind"] != "cuda":
        return "inputs in host memory"
    unpinned = [row["devices"] for row in payload["rows"] if not row["input_pinned"]]
    return "inputs in pinned host memory" if not unpinned else f"inputs NOT pinned on --devices {', '.join(unpinned)}"


HEADER = ["batch", "devices", "runners", "GPUs", "images/s", "ms", "speed-up", "efficiency", "build s", "vs one", "onnxruntime",
          "run uses"]


def _run_uses(row: dict[str, Any]) -> str:
    """How many of the list's devices run --devices would use: "3 of 4" where it leaves some idle."""
    feeding = row["feeding"]
    if feeding is None:
        return "-"
    used, given = len(feeding["used"]), len(feeding["given"])
    return str(used) if used == given else f"{used} of {given}"


def table_cells(payload: dict[str, Any]) -> list[list[str]]:
    """A line of HEADER per row, for the text table and the HTML page (lab/bench_page.py)."""
    cells = []
    for row in payload["rows"]:
        compared = f"{'pass' if row['agrees'] else 'FAIL'} ({row['compared_rows']} rows)"
        cells.append([f"{row['batch']:,}", row["devices"] + (" *" if row["shared_gpu"] else ""), str(row["runners"]),
                      str(row["gpus"]), _rate(row["images_per_s"]), f"{row['time_ms']:.2f}", _ratio(row["speedup"], ".2f") + "x",
                      _ratio(row["efficiency"], ".1%"), f"{row['build_s']:.1f}",
                      _ratio(row["max_abs_vs_one"], ".1e"), compared, _run_uses(row)])
    return cells


def feeding_lines(payload: dict[str, Any]) -> list[str]:
    """A line per list whose feed probe ran: the images/s of each count and the devices run would leave idle."""
    return [format_feeding(row["feeding"], f"--devices {row['devices']} at {row['batch']:,}") for row in payload["rows"]
            if row["feeding"] is not None and row["feeding"]["probed"]]


def format_text(payload: dict[str, Any]) -> str:
    settings = payload["settings"]
    lines = [f"Scaling of {payload['model']} on {_where(payload)}: host to host, {_pinned(payload)}, "
             f"median of {settings['repeat']} timed passes after {settings['warmup']} warm-up", ""]
    lines += text_table(HEADER, table_cells(payload), right=NUMBERS)
    lines.append("")
    lines += feeding_lines(payload)
    if any(row["shared_gpu"] for row in payload["rows"]):
        lines.append(SHARED_NOTE)
    lines.append(LEGEND)
    return "\n".join(lines) + "\n"


def require_plotting() -> None:
    """One line, before any work, when --plot cannot be drawn here."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot draws with matplotlib, which is not installed here (pip install matplotlib)")


def save_plot(payload: dict[str, Any], path: str) -> None:
    """A PNG: images/s (left axis, solid line) and efficiency (right axis, dashed) against the
    runners of each list, a line per batch through the lists on distinct GPUs; a list whose
    runners share a GPU is a hollow point off the lines."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    from matplotlib import pyplot
    from matplotlib.ticker import FuncFormatter

    figure, rates = pyplot.subplots(figsize=(7.5, 4.8))
    efficiency = rates.twinx()
    for batch in payload["batch"]:
        rows = sorted((row for row in payload["rows"] if row["batch"] == batch), key=lambda row: row["runners"])
        scaling = [row for row in rows if not row["shared_gpu"] and row["images_per_s"] is not None]
        x = [row["runners"] for row in scaling]
        line, = rates.plot(x, [row["images_per_s"] for row in scaling], "o-", label=f"images/s, batch {batch:,}")
        color = line.get_color()
        efficiency.plot(x, [row["efficiency"] for row in scaling], "s--", color=color, label=f"efficiency, batch {batch:,}")
        for row in rows:
            if row["shared_gpu"]:
                rates.plot(row["runners"], row["images_per_s"], "o", color=color, markerfacecolor="none")
                efficiency.plot(row["runners"], row["efficiency"], "s", color=color, markerfacecolor="none")
            rates.annotate(row["devices"], (row["runners"], row["images_per_s"]), textcoords="offset points", xytext=(5, -10), fontsize=8)
    rates.set_xlabel("runners (entries of the --devices list)")
    rates.set_ylabel("images/s, host to host")
    rates.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    efficiency.set_ylabel("efficiency (speed-up / runners)")
    efficiency.set_ylim(0, 1.15)
    rates.set_ylim(bottom=0, top=1.15 * max(row["images_per_s"] or 0 for row in payload["rows"]) or None)
    rates.set_xticks(sorted({row["runners"] for row in payload["rows"]}))
    rates.set_title(f"{payload['model']} over several devices; hollow: runners sharing a GPU (not a scaling figure)", fontsize=9)
    handles = rates.get_legend_handles_labels()[0] + efficiency.get_legend_handles_labels()[0]
    figure.legend(handles, [handle.get_label() for handle in handles], fontsize=8, loc="lower center", ncol=2)
    figure.tight_layout(rect=(0, 0.04 * (1 + len(payload["batch"])), 1, 1))
    picture = io.BytesIO()
    figure.savefig(picture, format="png", dpi=120)
    pyplot.close(figure)
    write_atomic(path, picture.getvalue())
