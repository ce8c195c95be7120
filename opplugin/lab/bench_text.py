"""The bench payload as plain text: a header with the device and its roofline (and in a
16-bit run what each candidate converts and how it is checked), one table per step and
batch, then the fused totals, the streams row and the layer-set or precision summary."""
from __future__ import annotations

from typing import Any

from ..core.texttable import spoken, text_table

COLUMNS = ("variant", "exact", "ms", "GFLOP/s", "GB/s", "x floor", "vs base", "vs cuDNN", "rel err", "status")
NOTE_WIDTH = 70


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _status(row: dict[str, Any], step: dict[str, Any] | None = None) -> str:
    if row["status"] == "ok":
        marks = [] if row["heuristic"] or row["kind"] == "peer" else ["config"]
        if step and row["name"] == step.get("best"):
            marks.append("best exact" if row["exact"] else "fastest")  # a 16-bit run's best is its fastest
        if step and row["kind"] == "variant" and row["name"] == step.get("default"):
            marks.append("default pick")
        if row.get("bound_fraction") is not None:  # a 16-bit run: how close it came to its element bound
            marks.append(f"{row['bound_fraction']:.2f} of bound")
        if row.get("reason"):  # asked for a CUDA graph, its calls could not be captured
            marks.append("timed eagerly")
        return "ok" + (f" ({', '.join(marks)})" if marks else "")
    note = (row["reason"] or "")[:NOTE_WIDTH]
    return f"{row['status'].upper()}: {note}" if row["status"] in ("incorrect", "failed") else f"n/a: {note}"


def _exact(row: dict[str, Any]) -> str:
    if not row["exact"]:
        return "NO"
    return "measured" if row.get("exact_by") == "measurement" else "yes"


def row_cells(row: dict[str, Any], step: dict[str, Any] | None = None) -> list[str]:
    name = row["name"] if row["kind"] == "variant" else f"[{row['name']}]"
    return [
        name,
        _exact(row),
        _num(row["ms"], 4),
        _num(row["gflops_per_s"]),
        _num(row["gb_per_s"]),
        _num(row["x_floor"]),
        _ratio(row["vs_baseline"]),
        _ratio(row["vs_cudnn"]),
        "-" if row["rel_error"] is None else f"{row['rel_error']:.1e}",
        _status(row, step),
    ]


def table(rows: list[dict[str, Any]], step: dict[str, Any] | None = None) -> str:
    numbers = range(1, len(COLUMNS) - 1)  # between the name and the status
    return "\n".join(text_table(COLUMNS, [row_cells(r, step) for r in rows], right=numbers, rule=False))


def header(payload: dict[str, Any]) -> list[str]:
    return [text for _, text in header_facts(payload)]


def header_facts(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """The header's lines, each with what it tells (device, software, roofline, timing, exact, peer):
    the text report prints the lines, the HTML page lists them by label."""
    device, versions, roof, settings = payload["device"], payload["versions"], payload["roofline"], payload["settings"]
    torch = f"torch {versions['torch']} (cuDNN {versions['cudnn']})" if versions.get("torch") else "no torch"
    lines = [
        ("device", f"opplugin {payload['opplugin_version']} bench on {device['name']} (compute capability {device['compute_capability']})"),
        ("software", f"CuPy {versions['cupy']}, CUDA runtime {versions['cuda_runtime']}, driver {versions['cuda_driver']}, {torch}, "
                     f"onnxruntime {versions['onnxruntime']}"),
        ("roofline", f"roofline: copy {roof['copy_gb_per_s'] / 1000:.2f} TB/s ({roof['copy_bytes'] / 2**30:.0f} GiB read+written, "
                     f"device to device), FP32 {roof['fp32_tflop_per_s']:.1f} TFLOP/s ({roof['matmul_n']}^3 matmul, TF32 off; "
                     f"small-product error {roof['matmul_rel_error']:.1e}{', TF32 SUSPECTED' if roof['tf32_suspected'] else ''})"),
        ("timing", f"medians of {settings['repeat']} CUDA-event samples after {settings['warmup']} warm-up calls; {_sample_words(settings)}; "
                   f"{_ratio_words(payload)}"),
        ("exact", "exact: yes = FP32 multiply-adds (exact by construction); measured = other arithmetic (3xTF32) whose measured "
                  "error against float64 meets the same bound; NO = opt-in reduced precision"),
    ]
    if payload.get("precision", "fp32") != "fp32":
        lines.append(("precision", precision_words(payload)))
    for peer, note in payload["peers"].items():
        if note != "available":
            lines.append(("peer", f"peer {peer}: not measured: {note}"))
    return lines


def _ratio_words(payload: dict[str, Any]) -> str:
    precision = payload.get("precision", "fp32")
    if precision == "fp32":
        return "vs base / vs cuDNN are speed-ups over baseline / cuDNN FP32; x floor = ms / roofline floor"
    return f"vs cuDNN is a speed-up over cuDNN {precision.upper()}; no floor (the roofline measures FP32's rate)"


def precision_words(payload: dict[str, Any]) -> str:
    """What a 16-bit run compares, what it converts where, and how it checks each output."""
    precision, summary = payload["precision"], payload["precision_summary"]
    fmt = precision.upper()
    return (f"precision {precision}: each Conv alone (no fused step) by the family run --precision {precision} runs it in "
            f"({spoken(summary['families'])}; FP32 in and out, converting inside its timed call; a layer it cannot run is listed with the reason), "
            f"beside cuDNN on {fmt} tensors in channels_last, its input and weights converted before timing and its output "
            f"left in {fmt}; every output checked against float64 first: {payload['settings']['format_bound']}")


def _sample_words(settings: dict[str, Any]) -> str:
    if settings.get("cuda_graphs"):
        return ("a sample replays one CUDA graph of back-to-back calls, as run launches its steps, so no host launch cost "
                "(onnxruntime's calls run eagerly; --no-cuda-graphs times every candidate eagerly)")
    return "a sample is back-to-back eager calls, the host's launch cost included"


def step_title(step: dict[str, Any]) -> str:
    floor = f", floor {step['floor_ms']:.3g} ms ({step['bound']}-bound)" if step["floor_ms"] else ""
    return f"{step['step']} ({step['shape']}), batch {step['batch']:,}: {step['flops'] / 1e9:.3g} GFLOP, {step['bytes'] / 1e6:,.0f} MB{floor}"


def totals_lines(payload: dict[str, Any]) -> list[str]:
    lines = []
    for total in payload["fused_totals"]:
        parts = " + ".join(f"{s} [{v}]" for s, v in zip(total["steps"], total["variants"]))
        ms = "-" if total["ms"] is None else f"{total['ms']:.3f} ms"
        cudnn = "" if total["cudnn_fp32_ms"] is None else f" (torch/cuDNN FP32 chain {total['cudnn_fp32_ms']:.3f} ms)"
        target = ""
        if total["target_ms"]:
            target = f"; target < {total['target_ms']:g} ms: {'met' if total['met'] else 'MISSED'}"
        lines.append(f"{total['model']}: all fused stages, batch {total['batch']:,}: {ms}{cudnn}{target}; {parts}")
    return lines


def streams_lines(streams: dict[str, Any] | None) -> list[str]:
    if not streams:
        return []
    head = f"streams: {streams['step']}, batch {streams['batch']:,}, host to host (pinned)"
    if streams.get("status") in ("skipped", "failed") or streams.get("serial_ms") is None:
        return [f"{head}: {streams.get('status')}: {streams.get('reason')}"]
    lines = [f"{head}, {streams['variant']}: serial (1 stream) {streams['serial_ms']:.2f} ms"]
    for entry in streams["chunked"]:
        figure = f"{entry['ms']:.2f} ms ({entry['speedup']:.2f}x)" if entry["ms"] else "WRONG OUTPUT, not timed"
        lines.append(f"  {entry['streams']} streams, {entry['chunks']} chunks: {figure}")
    if streams.get("speedup"):
        lines.append(f"  best: {streams['best_streams']} streams, {streams['speedup']:.2f}x over serial")
    return lines


SUMMARY_COLUMNS = ("layer", "batch", "floor", "cuDNN", "cuDNN TF32", "best exact", "ms", "vs cuDNN", "default pick", "/best", "TF32 ms", "vs cuDNN TF32")
SUMMARY_NUMBERS = (1, 2, 3, 4, 6, 7, 9, 10, 11)


def summary_lines(summary: dict[str, Any] | None) -> list[str]:
    """The layer set at a glance: the targets are >= 1x cuDNN FP32 (geomean 1.5x) for the best
    exact variant, the default pick within 1.25x of it, TF32 geomean >= 1x cuDNN TF32."""
    if not summary:
        return []
    return [
        "layer set summary (ms; ratios are speed-ups, /best is the default pick's time over the best exact one's)",
        *text_table(SUMMARY_COLUMNS, summary_cells(summary), right=SUMMARY_NUMBERS, rule=False),
        f"best exact vs cuDNN FP32: geometric mean {_ratio(summary['geomean_best_vs_cudnn_fp32'])}, "
        f"lowest {_ratio(summary['min_best_vs_cudnn_fp32'])}; default pick at most {_ratio(summary['max_default_vs_best'])} "
        f"the best exact; TF32 vs cuDNN TF32: geometric mean {_ratio(summary['geomean_tf32_vs_cudnn_tf32'])}",
    ]


def summary_cells(summary: dict[str, Any]) -> list[list[str]]:
    """A line of SUMMARY_COLUMNS per layer and batch."""
    return [
        [
            line["step"], str(line["batch"]), _num(line["floor_ms"], 3), _num(line["cudnn_fp32_ms"], 4), _num(line["cudnn_tf32_ms"], 4),
            line["best"] or "-", _num(line["best_ms"], 4), _ratio(line["best_vs_cudnn_fp32"]), line["default"] or "-",
            _ratio(line["default_vs_best"]), _num(line["tf32_ms"], 4), _ratio(line["tf32_vs_cudnn_tf32"]),
        ]
        for line in summary["layers"]
    ]


PRECISION_NUMBERS = (1, 2, 4, 5)


def precision_columns(summary: dict[str, Any]) -> tuple[str, ...]:
    return ("layer", "batch", f"cuDNN {summary['precision'].upper()}", "/".join(summary["families"]), "ms", "vs cuDNN", "why none")


def precision_cells(summary: dict[str, Any]) -> list[list[str]]:
    """A line of precision_columns per layer and batch."""
    return [
        [line["step"], str(line["batch"]), _num(line["cudnn_ms"], 4), line["variant"] or "-", _num(line["ms"], 4),
         _ratio(line["vs_cudnn"]), (line["why_not"] or "")[:NOTE_WIDTH]]
        for line in summary["layers"]
    ]


def precision_means(summary: dict[str, Any]) -> str:
    return (f"{spoken(summary['families'], 'and')} ran {summary['ran']} of {len(summary['layers'])} layers and batches; over them, "
            f"vs cuDNN {summary['precision'].upper()}: geometric mean {_ratio(summary['geomean_vs_cudnn'])}")


def precision_summary_lines(summary: dict[str, Any] | None) -> list[str]:
    """A 16-bit run at a glance: per layer, cuDNN and the precision's family, or why the family has no kernel."""
    if not summary:
        return []
    return [
        f"{summary['precision']} summary (ms; vs cuDNN is a speed-up)",
        *text_table(precision_columns(summary), precision_cells(summary), right=PRECISION_NUMBERS, rule=False),
        precision_means(summary),
    ]


def format_text(payload: dict[str, Any]) -> str:
    out = header(payload)
    for step in payload["steps"]:
        rows = [r for r in payload["rows"] if r["step"] == step["step"] and r["batch"] == step["batch"]]
        out += ["", step_title(step), table(rows, step)]
    extra = totals_lines(payload) + streams_lines(payload.get("streams")) + summary_lines(payload.get("suite_summary"))
    extra += precision_summary_lines(payload.get("precision_summary"))
    if extra:
        out += ["", *extra]
    return "\n".join(out) + "\n"
