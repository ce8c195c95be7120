"""The sections of `run --report` and `check --report` (page.py draws the page), made
from the records the text and JSON reports are made from: the PlanRecord, the run's
report (timing.build_report), the Profile's last timed run, and check's JSON report.

- plan: a row per step (kind, ops, implementation, shapes), with run's medians;
- timeline: the last timed run, as `run --trace` has it (trace.py's tracks: each lane's
  device and host clocks), CUDA-graph replays on a track of their own per lane;
- roofline: a point per plugin step whose FLOPs and bytes are known, against the
  device's measured ceilings on a GPU (lab/roofline.py; the command passes them in);
- check: a row per compared tensor, its error and pass or fail.
"""
from __future__ import annotations

import datetime
from typing import Any

from . import trace
from .charts import Bar, HBar, Point, Roof, Track, bars_svg, roofline_svg, timeline_svg
from .page import Section, header_facts, legend, render, table
from ..runtime.records import PlanRecord, Profile
from ..runtime.timeline import COPY, GRAPH

BAR_KINDS = ("plugin", "onnxruntime", COPY, GRAPH)


def _shapes(plan: PlanRecord, names: tuple[str, ...]) -> str:
    return ", ".join("x".join(map(str, plan.shapes[n])) if n in plan.shapes else "?" for n in names)


def _figure(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def plan_section(plan: PlanRecord, rows: list[dict[str, Any]] | None = None) -> Section:
    """The plan's steps in order; with `rows` (run's report), each step's medians, and the
    rows that are no plan step (copies, a CUDA graph timed as one) after them."""
    timed = {row["step"]: row for row in rows or []}
    header = ["step", "kind", "ops", "implementation", "inputs", "outputs"]
    if rows is not None:
        header += ["time ms", "GFLOP/s", "GB/s", "share"]
    body = []
    for step in plan.steps:
        line = [step.name, step.kind, " > ".join(step.ops), step.implementation,
                _shapes(plan, step.inputs), _shapes(plan, step.outputs)]
        if rows is not None:
            line += _times(timed.get(step.name))
        body.append(line)
    names = {step.name for step in plan.steps}
    for row in rows or []:
        if row["step"] not in names:
            shapes = ["; ".join("x".join(map(str, s)) for s in row[key]) for key in ("input_shapes", "output_shapes")]
            body.append([row["step"], row["kind"], row["ops"], row["implementation"], *shapes, *_times(row)])
    numeric = range(6, 10) if rows is not None else ()
    note = f"{len(plan.steps)} steps, {len(plan.plugin_steps)} of them plugin steps; onnxruntime steps on {plan.onnxruntime_provider}"
    if rows is not None:
        note += "; times are medians of the timed runs, a step's time summed over its chunks"
    return Section("Plan", table(header, body, numeric=numeric), note)


def _times(row: dict[str, Any] | None) -> list[str]:
    if row is None:  # timed inside a CUDA graph that is a row of its own
        return ["-", "-", "-", "-"]
    return [_figure(row["time_ms"]), _figure(row["gflops_per_s"], 1), _figure(row["gb_per_s"], 1), f"{100 * row['share']:.1f}%"]


def timeline_tracks(profile: Profile) -> list[Track]:
    """The last timed run's spans on trace.py's tracks, in its order; a lane's CUDA-graph
    replays (spans that hold the lane's steps) on a track of their own above its device track."""
    on_gpu = profile.plan.device.is_cuda
    tracks: dict[tuple[int, int], Track] = {}
    for span in sorted(profile.result.spans, key=lambda s: (s.start_ms, s.order)):
        graph = span.kind == GRAPH
        key = (trace.track_id(span), 0 if graph else 1)
        if key not in tracks:
            label = f"lane {span.lane}: CUDA graph replays" if graph else trace.track_name(span, on_gpu)
            tracks[key] = Track(label, [])
        tracks[key].bars.append(Bar(span.name, span.kind, span.start_ms, span.end_ms, f"chunk {span.chunk}"))
    return [tracks[key] for key in sorted(tracks)]


def timeline_section(profile: Profile) -> Section:
    tracks = timeline_tracks(profile)
    run = profile.result
    bars = sum(len(t.bars) for t in tracks)
    runs = len(profile.total_ms)
    which = "The one timed run" if runs == 1 else f"The last of {runs} timed runs"
    note = (f"{which}, {run.total_ms:.3f} ms host to host: {bars} spans over "
            f"{run.chunks} chunk{'s' if run.chunks > 1 else ''}, a row per lane and clock (the same records as run --trace). "
            "Hover over a bar for its step, start and duration.")
    if not tracks:
        return Section("Timeline", "", "This run recorded no spans.")
    kinds = [kind for kind in BAR_KINDS if any(bar.kind == kind for t in tracks for bar in t.bars)]
    return Section("Timeline", legend(kinds) + timeline_svg(tracks, run.total_ms), note)


def roofline_points(rows: list[dict[str, Any]], roof: Roof | None) -> tuple[list[Point], list[str]]:
    """A point per plugin row with both GFLOP/s and GB/s (FLOPs per byte is their ratio), and the
    names of the plugin rows left out (a view moves nothing; a CUDA graph timed as one has no byte count)."""
    points, left_out = [], []
    for row in rows:
        if row["kind"] != "plugin":
            continue
        gflops, gbs = row["gflops_per_s"], row["gb_per_s"]
        if not gflops or not gbs:
            left_out.append(row["step"])
            continue
        intensity = gflops / gbs
        detail = f"{row['time_ms']:.4f} ms, {gbs:.4g} GB/s, {row['implementation']}"
        if roof is not None:
            bound = "memory" if intensity < roof.flops_per_s / roof.bytes_per_s else "compute"
            detail += f"; {100 * gflops / roof.gflops_at(intensity):.1f}% of the roof, {bound}-bound"
        points.append(Point(row["step"], intensity, gflops, detail))
    return points, left_out


def roofline_section(rows: list[dict[str, Any]], roof: Roof | None) -> Section:
    points, left_out = roofline_points(rows, roof)
    if roof is None:
        note = ("On the CPU reference backend there is no roof: the points are the numpy reference's, "
                "shown for their place relative to each other. A run on a GPU draws its measured ceilings.")
    else:
        note = (f"The roof is this GPU's, measured as the run ended: a device-to-device copy "
                f"({roof.bytes_per_s / 1e9:,.0f} GB/s) and a large FP32 matrix product ({roof.flops_per_s / 1e12:.1f} TFLOP/s).")
    note += f" {len(points)} plugin step{'s' if len(points) != 1 else ''}, each at its median time."
    if left_out:
        note += f" Not drawn (no FLOP or byte count): {', '.join(left_out)}."
    return Section("Roofline", roofline_svg(points, roof) if points else "", note)


def op_chain_section(chains: list[dict[str, Any]]) -> Section:
    """Where the time goes by kind of step: a bar per op chain (timing.op_chain_rows), slowest first."""
    bars = [HBar(c["ops"], c["time_ms"], "opplugin" if c["kind"] == "plugin" else "peer",
                 f"{c['steps']} step{'s' if c['steps'] != 1 else ''}, {100 * c['share']:.1f}% of the steps' time"
                 + (f", {c['gflops_per_s']:,.1f} GFLOP/s" if c["gflops_per_s"] else ""))
            for c in chains]
    note = ("The steps' median times summed per op chain (a fused chain is one kind); onnxruntime steps and copies "
            "in the second colour. The plan table above has each step's.")
    return Section("Time by op chain", bars_svg(bars, "ms") if bars else "", note)


def check_section(report: dict[str, Any]) -> Section:
    """check --json's records as a table: a row per compared tensor, failures shaded."""
    body, classes, cells = [], [], {}
    for r, record in enumerate(report["records"]):
        if record.get("error"):
            verdict, figures = f"FAIL: {record['error']}", ["-", "-", "-"]
        else:
            verdict = ("pass*" if record.get("arbitration") else "pass") if record["passed"] else "FAIL"
            figures = [f"{record[key]:.2e}" for key in ("max_abs_error", "max_rel_error", "rel_l2")]
        body.append([record["tensor"], record["step"], record["implementation"], *figures, verdict])
        classes.append("" if record["passed"] else "fail")
        cells[(r, 6)] = "pass" if record["passed"] else "fail"
    header = ["tensor", "step", "implementation", "max abs", "max rel", "rel L2", "result"]
    verdict = "PASS" if report["passed"] else "FAIL"
    note = f"{verdict} at atol {report['atol']:g}, rtol {report['rtol']:g}, against onnxruntime CPU"
    extra = []
    if report.get("top1_agreement") is not None:
        extra.append(f"top-1 agreement {report['top1_agreement']:.4f}")
    if report.get("accuracy") is not None:
        extra.append(f"accuracy {report['accuracy']:.4f} (onnxruntime alone {report['reference_accuracy']:.4f})")
    bad = (report.get("steps_alone") or {}).get("first_bad_node")
    if bad is not None:
        extra.append(f"first bad node: {bad['step']} ({bad['implementation']})")
    if any(record.get("arbitration") for record in report["records"]):
        extra.append("pass*: beyond onnxruntime's tolerance, but judged sound against float64")
    return Section("Check against onnxruntime", table(header, body, numeric=(3, 4, 5), row_classes=classes, cell_classes=cells),
                   "; ".join([note, *extra]) + ".")


def run_page(report: dict[str, Any], profile: Profile, roof: Roof | None = None,
             generated: datetime.datetime | None = None) -> str:
    """`run --report`: the header, the plan with its times, the timeline and the roofline."""
    header = header_facts(report, generated)
    timed = "one run" if report["repeat"] == 1 else f"medians of {report['repeat']} runs"
    header.append(("timing", f"{timed} after {report['warmup']} warm-up; host to host {report['host_to_host_ms']:.3f} ms"
                   + (f", {report['images_per_s']:,.0f} images/s" if report.get("images_per_s") else "")))
    if report.get("accuracy") is not None:
        header.append(("test accuracy", f"{report['accuracy']:.4f}"))
    agreement = report.get("agreement")
    if agreement:
        rule = f" at atol {agreement['atol']:g}, rtol {agreement['rtol']:g}" if "atol" in agreement else ""
        header.append(("against onnxruntime CPU", f"{'PASS' if agreement['passed'] else 'FAIL'}{rule}, max abs error "
                       f"{agreement['max_abs_error']:.2e}, rel L2 {agreement['rel_l2']:.2e}"))
    sections = [plan_section(profile.plan, report["steps"]), op_chain_section(report["by_op_chain"]), timeline_section(profile),
                roofline_section(report["steps"], roof)]
    return render(f"opplugin run: {report['model']}", header, sections)


def check_page(report: dict[str, Any], plan: PlanRecord, generated: datetime.datetime | None = None) -> str:
    """`check --report`: the header, the plan, and the check's table."""
    header = [*header_facts(report, generated), ("inputs", str(report.get("data")))]
    return render(f"opplugin check: {report['model']}", header, [plan_section(plan), check_section(report)])
