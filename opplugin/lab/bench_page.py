"""`opplugin bench --report FILE.html`: a benchmark's payload (what its --json writes) on the page
every report shares (report/page.py), a table of every row and, where a picture reads better, a chart:

- the Conv suites (--suite models | cnn): every timed candidate on one roofline; per layer and batch
  a bar of ms per candidate against the layer's floor, and its rows (bench_text's cells); the fused
  totals, the streams run and the layer-set or precision summary where the payload has them (a 16-bit
  run has no roofline: it is FP32's);
- --suite gemm: per layer and batch a bar of device ms per implementation against the weight floor;
- --e2e: the summary per model and batch, then per case a bar of ms host to host per candidate
  against the model's floor, then every candidate's row (e2e_table's tables);
- --scaling: per batch a bar of images/s per device list, and the table (scaling_text's);
- --custom: per batch and custom node a bar of ms per implementation beside its rows.

A candidate that has no figure (wrong, failed, unsupported, not run) keeps its line in the chart,
its status written where the bar would be.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from ..report.charts import HBar, Point, Roof, bars_svg, roofline_svg
from ..report.page import Section, header_facts, legend, render, table
from . import attention_bench, bench_text, e2e, e2e_table, gemm_bench, scaling_text

Payload = dict[str, Any]
BAR_KINDS = ("opplugin", "inexact", "user", "peer")


def bench_page(benchmark: str, payload: Payload, generated: datetime.datetime | None = None) -> str:
    """The page of `benchmark` (BenchOptions.benchmark: models, cnn, gemm, e2e, scaling or custom)."""
    title, sections = SECTIONS[benchmark](payload)
    return render(f"opplugin bench: {title}", [*_header(payload, generated), *_settings(benchmark, payload)], sections)


def _header(payload: Payload, generated: datetime.datetime | None) -> list[tuple[str, str]]:
    """The shared header; bench measures several models and batches (their lists), and --custom's
    payload names its device alone."""
    device = payload["device"] if isinstance(payload["device"], dict) else {"kind": "cuda", "name": payload["device"]}
    batches = payload["batch"] if "batch" in payload else [entry["batch"] for entry in payload["batches"]]
    return header_facts({**payload, "device": device, "model": _listed(payload["model"]), "batch": _listed(batches)}, generated)


def _settings(benchmark: str, payload: Payload) -> list[tuple[str, str]]:
    if benchmark in ("models", "cnn"):
        said_by_label = {"roofline": "roofline: ", "peer": "peer "}  # the label says it on the page
        return [(label, text.removeprefix(said_by_label.get(label, ""))) for label, text in bench_text.header_facts(payload)
                if label != "device"]
    roof = payload.get("roofline")
    facts = [("roofline", (f"copy {roof['copy_gb_per_s']:,.0f} GB/s, FP32 {roof['fp32_tflop_per_s']:.1f} TFLOP/s, "
                           "both measured in this run"))] if roof else []
    if benchmark == "gemm":
        facts.append(("cuBLAS", payload["cublas"]))
    elif benchmark == "attention":
        facts.append(("peers", payload["peers"]))
    elif benchmark == "e2e":
        facts.append(("timing", (f"medians of {payload['repeat']} after {payload['warmup']} warm-up runs; "
                                 f"{e2e_table.precision_words(payload).rstrip('.')}")))
    elif benchmark == "scaling":
        settings = payload["settings"]
        facts.append(("timing", f"{settings['timing']}; median of {settings['repeat']} passes after {settings['warmup']} warm-up"))
    return facts


def _listed(value: Any) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _chart(bars: list[HBar], unit: str, marker: tuple[str, float] | None = None) -> str:
    kinds = [kind for kind in BAR_KINDS if any(bar.kind == kind and bar.value is not None for bar in bars)]
    return legend(kinds) + bars_svg(bars, unit, marker)


def _roof(payload: Payload) -> Roof | None:
    record = payload.get("roofline")
    return Roof(record["copy_gb_per_s"] * 1e9, record["fp32_tflop_per_s"] * 1e12) if record else None


# --- the Conv suites ------------------------------------------------------------------------------


def _conv_kind(row: dict[str, Any]) -> str:
    if row["kind"] == "peer":
        return "peer"
    return "user" if row["family"] == "user" else "opplugin" if row["exact"] else "inexact"


def _wrong(row: dict[str, Any]) -> bool:
    return row["status"] in ("incorrect", "failed")


def conv_sections(payload: Payload) -> tuple[str, list[Section]]:
    precision = payload.get("precision", "fp32")
    sections = [_conv_roofline(payload)] if precision == "fp32" else []
    for step in payload["steps"]:
        rows = [r for r in payload["rows"] if r["step"] == step["step"] and r["batch"] == step["batch"]]
        cells = [bench_text.row_cells(r, step) for r in rows]
        bars = [HBar(cell[0], r["ms"], _conv_kind(r), f"{cell[3]} GFLOP/s, {cell[5]} x floor, {cell[-1]}", note=cell[-1])
                for r, cell in zip(rows, cells)]
        marks = [("fail" if _wrong(r) else "") for r in rows]
        status = {(i, len(cells[i]) - 1): "fail" if _wrong(r) else "pass" if r["status"] == "ok" else "" for i, r in enumerate(rows)}
        best = "best exact" if precision == "fp32" else f"fastest in {precision}"
        note = (f"{best}: {step['best'] or 'none'}; the runner's default pick: {step['default'] or 'none'}; "
                + ("the dashed line is the floor on this device. " if step["floor_ms"] else "") + "Hover over a bar for its figures.")
        body = _chart(bars, "ms", ("floor", step["floor_ms"]) if step["floor_ms"] else None)
        body += table(bench_text.COLUMNS, cells, numeric=range(2, 9), row_classes=marks, cell_classes=status)
        sections.append(Section(bench_text.step_title(step), body, note))
    sections += _totals(payload) + _streams(payload.get("streams")) + _summary(payload.get("suite_summary"))
    sections += _precision_summary(payload.get("precision_summary"))
    suite = payload["settings"]["suite"]
    return ("Conv layers of real CNNs" if suite == "cnn" else f"Conv steps of {_listed(payload['model'])}"), sections


def _conv_roofline(payload: Payload) -> Section:
    roof = _roof(payload)
    points = [Point(r["name"], r["gflops_per_s"] / r["gb_per_s"], r["gflops_per_s"],
                    f"{r['step']} at batch {r['batch']:,}, {r['ms']:.4g} ms, {r['gb_per_s']:.4g} GB/s"
                    + (f", {r['x_floor']:.2f}x its floor" if r["x_floor"] else ""))
              for r in payload["rows"] if r["ms"] and r["gflops_per_s"] and r["gb_per_s"]]
    note = (f"Every timed candidate of every layer and batch ({len(points)}), at its median time, under this GPU's ceilings "
            "as measured in this run; a candidate's bytes are its own kernel's where it reports them.")
    return Section("Roofline", roofline_svg(points, roof) if points else "", note)


def _totals(payload: Payload) -> list[Section]:
    totals = payload.get("fused_totals") or []
    if not totals:
        return []
    rows = [[t["model"], f"{t['batch']:,}", _ms(t["ms"]), _ms(t["cudnn_fp32_ms"]),
             "-" if not t["target_ms"] else f"< {t['target_ms']:g} ms: {'met' if t['met'] else 'MISSED'}",
             " + ".join(f"{s} [{v}]" for s, v in zip(t["steps"], t["variants"]))] for t in totals]
    return [Section("Fused steps together", table(["model", "batch", "ms", "cuDNN FP32 chain ms", "target", "stages"], rows, numeric=(1, 2, 3)),
                    "Per model and batch: each fused step by its fastest exact variant, added up.")]


def _streams(streams: dict[str, Any] | None) -> list[Section]:
    if not streams:
        return []
    head, *_ = bench_text.streams_lines(streams)
    rows = [[e["streams"], e["chunks"], _ms(e["ms"], 2), f"{e['speedup']:.2f}x" if e["ms"] else "WRONG OUTPUT, not timed"]
            for e in streams.get("chunked") or []]
    body = table(["streams", "chunks", "ms", "over serial"], rows, numeric=(0, 1, 2, 3)) if rows else ""
    return [Section("Streams", body, head)]


def _summary(summary: dict[str, Any] | None) -> list[Section]:
    if not summary:
        return []
    *_, means = bench_text.summary_lines(summary)
    body = table(bench_text.SUMMARY_COLUMNS, bench_text.summary_cells(summary), numeric=bench_text.SUMMARY_NUMBERS)
    return [Section("Layer set summary", body, means)]


def _precision_summary(summary: dict[str, Any] | None) -> list[Section]:
    if not summary:
        return []
    body = table(bench_text.precision_columns(summary), bench_text.precision_cells(summary), numeric=bench_text.PRECISION_NUMBERS)
    return [Section(f"{summary['precision'].upper()} summary", body, bench_text.precision_means(summary))]


def _ms(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --- --suite gemm ---------------------------------------------------------------------------------


def gemm_sections(payload: Payload) -> tuple[str, list[Section]]:
    sections = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in payload["rows"]:
        groups.setdefault((row["layer"], row["batch"]), []).append(row)
    for (layer, batch), rows in groups.items():
        cells = gemm_bench.table_cells({"rows": rows})
        bars = [HBar(r["name"], r["ms"], "peer" if r["name"].startswith("cuBLAS") else "opplugin",
                     f"{cell[6]} GB/s, {cell[8]} x floor, {cell[9]} vs cuBLAS, one call {cell[5]} ms",
                     note=r.get("reason") or f"not timed: relative error {r.get('rel_error', float('nan')):.2g}")
                for r, cell in zip(rows, cells)]
        floor = next((r["weight_floor_ms"] for r in rows if r.get("weight_floor_ms")), None)
        first = rows[0]
        body = _chart(bars, "device ms", ("weight floor", floor) if floor else None)
        body += table(gemm_bench.TABLE_HEADER, cells, numeric=gemm_bench.TABLE_NUMBERS)
        sections.append(Section(f"{layer} ({first['k']}->{first['n']}), batch {batch:,}", body,
                                "Device ms per call, launch overhead hidden; the dashed line is the weight bytes over the copy bandwidth."))
    return "Gemm layers against cuBLAS", sections


# --- --suite attention -----------------------------------------------------------------------------


def attention_sections(payload: Payload) -> tuple[str, list[Section]]:
    sections = []
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in payload["rows"]:
        groups.setdefault((row["shape"], row["batch"]), []).append(row)
    for (shape, batch), rows in groups.items():
        cells = attention_bench.table_cells({"rows": rows})
        bars = [HBar(r["name"], r["ms"], "opplugin" if r["name"].startswith("opplugin") else "peer",
                     f"{cell[4]} GFLOP/s, {cell[6]} vs SDPA", note=f"not timed: relative error {r['rel_error']:.2g}")
                for r, cell in zip(rows, cells)]
        body = _chart(bars, "device ms", None) + table(attention_bench.TABLE_HEADER, cells, numeric=attention_bench.TABLE_NUMBERS)
        sections.append(Section(f"{shape}, batch {batch:,}", body, "Device ms per call after warm-up, FP32 (TF32 off)."))
    return "Attention against PyTorch's scaled_dot_product_attention", sections


# --- --e2e ------------------------------------------------------------------------------------------


def e2e_sections(payload: Payload) -> tuple[str, list[Section]]:
    header, rows = e2e_table.summary(payload)
    sections = [Section("Summary", table(header, rows, numeric=e2e_table.SUMMARY_NUMBERS), e2e_table.LEGEND)]
    for case in payload["cases"]:
        rows_of = [r for r in payload["rows"] if r["model"] == case["model"] and r["batch"] == case["batch"]]
        bars = [HBar(e2e_table.label(r["peer"]), r["host_to_host_ms"] if r["status"] == "ok" else None,
                     "opplugin" if r["peer"] in e2e.OPPLUGIN else "peer",
                     f"{e2e_table.ms(r['device_ms'])} ms device-resident" + (f", rel L2 {r['rel_l2']:.1e}" if r.get("rel_l2") is not None else ""),
                     note=f"{r['status']}: {r['reason'] or ''}".rstrip(": "))
                for r in rows_of]
        floor = case.get("floor_ms")
        note = (f"fastest peer: {e2e_table.label(case['fastest_peer'])}, {e2e_table.ms(case['fastest_peer_ms'])} ms"
                if case["fastest_peer"] else "no peer ran")
        note += "; ms host to host" + ("; the dashed line is the model's floor on this GPU" if floor else "")
        sections.append(Section(f"{case['model']}, batch {case['batch']:,}",
                                _chart(bars, "ms host to host", ("floor", floor) if floor else None), note + "."))
    header, rows = e2e_table.details(payload)
    failing = {(r["model"], r["batch"], r["peer"]) for r in e2e.failed(payload)}
    marks = ["fail" if (r["model"], r["batch"], r["peer"]) in failing else "" for r in payload["rows"]]
    notes = "; ".join(line.removeprefix("- ") for line in e2e_table.notes(payload, None))
    sections.append(Section("Every candidate", table(header, rows, numeric=e2e_table.DETAILS_NUMBERS, row_classes=marks), notes))
    precision = payload.get("precision", "fp32")  # runs before schema 4 were FP32
    return f"{_listed(payload['model'])} end to end beside their peers in {precision.upper()}", sections


# --- --scaling --------------------------------------------------------------------------------------


def scaling_sections(payload: Payload) -> tuple[str, list[Section]]:
    sections = []
    for batch in dict.fromkeys(row["batch"] for row in payload["rows"]):
        bars = [HBar(f"--devices {r['devices']}", r["images_per_s"], "opplugin",
                     f"{r['runners']} runner(s) on {r['gpus']} GPU(s), {r['time_ms']:.2f} ms"
                     + (f", efficiency {r['efficiency']:.1%}" if r["efficiency"] is not None else "")
                     + ("; its runners share a GPU" if r["shared_gpu"] else ""), note="not timed")
                for r in payload["rows"] if r["batch"] == batch]
        sections.append(Section(f"Batch {batch:,}", _chart(bars, "images/s"), "Images per second host to host, per device list."))
    marks = ["" if row["agrees"] else "fail" for row in payload["rows"]]
    notes = ([scaling_text.SHARED_NOTE] if any(r["shared_gpu"] for r in payload["rows"]) else []) + [scaling_text.LEGEND]
    notes += scaling_text.feeding_lines(payload)
    sections.append(Section("Every device list", table(scaling_text.HEADER, scaling_text.table_cells(payload),
                                                       numeric=scaling_text.NUMBERS, row_classes=marks), ". ".join(notes) + "."))
    return f"{payload['model']} over several devices", sections


# --- --custom ---------------------------------------------------------------------------------------


def custom_sections(payload: Payload) -> tuple[str, list[Section]]:
    sections = []
    for entry in payload["batches"]:
        for step in entry["steps"]:
            trials = step["implementations"]
            bars = [HBar(t["variant"], t["ms"], "opplugin", f"max abs error {_sci(t['max_abs_error'])} against the reference",
                         note=f"{t['status']}: {t['reason'] or ''}".rstrip(": ")) for t in trials]
            rows = [[t["variant"], _ms(t["ms"], 4), _sci(t["max_abs_error"]), _sci(t["rel_l2"]),
                     t["status"] + (f": {t['reason']}" if t["reason"] else ""), "*" if t["variant"] == step["fastest"] else ""]
                    for t in trials]
            marks = ["fail" if t["status"] in ("incorrect", "failed") else "" for t in trials]
            body = _chart(bars, "ms") + table(["implementation", "median ms", "max abs vs ref", "rel L2", "result", "chosen"], rows,
                                               numeric=(1, 2, 3), row_classes=marks)
            note = (f"{step['op']}; the float64 reference takes {_ms(step['reference_host_ms'])} ms on the host; "
                    f"fastest correct: {step['fastest'] or 'none'}.")
            sections.append(Section(f"{step['step']}, batch {entry['batch']:,}", body, note))
    return f"the custom nodes of {payload['model']}", sections


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


SECTIONS: dict[str, Callable[[Payload], tuple[str, list[Section]]]] = {
    "models": conv_sections, "cnn": conv_sections, "gemm": gemm_sections, "attention": attention_sections, "e2e": e2e_sections,
    "scaling": scaling_sections, "custom": custom_sections,
}
