"""The timing report: built once from a Profile (the runtime's record of timed
runs), then written as text, JSON or CSV.

Rows are dicts with stable keys (see ROW_KEYS), so the JSON and CSV files carry
exactly what the text table shows. SCHEMA names the JSON's version.
"""
from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np

from .jsonout import header
from .plan import budget_note
from ..runtime.records import Profile
from ..core.texttable import LINE_WIDTH, NAME_WIDTH, OP_SEPARATOR, elide_middle, summarise_ops, text_table

# 2: end_to_end_ms, always equal to host_to_host_ms, left out
# 3: the header every report shares (jsonout.py), the device's memory_bytes; data,
#    accuracy and agreement always present (null when there is none)
# 4: agreement carries the atol and rtol it was judged at (run --atol, --rtol)
# 5: by_op_chain: the steps' time summed per op chain (op_chain_rows)
# 6: with --devices, feeding: the devices used and those left idle, and the feed probe's images/s
#    on 1, 2, ... N of them behind the choice (runtime/feeding.py: Feeding.record)
# 7: precision, the --precision the run asked for (each step's own: `plan --precision ... --json`)
# 8: budget, under --precision mixed: the --budget, the images it was measured on, the nodes kept in FP32 and why,
#    and the emulated outputs' errors (cli/budget.py: BudgetSearch.as_json); null otherwise
SCHEMA = "opplugin-run/8"

ROW_KEYS = (
    "step",
    "kind",
    "ops",
    "implementation",
    "input_shapes",
    "output_shapes",
    "time_ms",
    "gflops_per_s",
    "gb_per_s",
    "share",
)


def _nbytes(shape: tuple[int, ...], itemsize: int = 4) -> int:
    return int(np.prod(shape)) * itemsize


def _copy_parts(name: str) -> tuple[str, str, str]:
    """("copy" or "stage", "H2D" or "D2H", tensor) of a copy row such as "stage H2D input"."""
    verb, direction, tensor = name.split(" ", 2)
    return verb, direction, tensor


def step_rows(profile: Profile) -> list[dict[str, Any]]:
    """One row per step and per copy, in execution order, with median times.
    A chunked run's step time is the sum over its chunks."""
    plan = profile.plan
    steps = {step.name: step for step in plan.steps}
    rows = []
    for name in profile.step_ms:
        ms = profile.median(name)
        flops = moved = None
        if name in steps:
            step = steps[name]
            input_shapes = [list(plan.shapes[n]) for n in step.inputs]
            output_shapes = [list(plan.shapes[n]) for n in step.outputs]
            if step.kind == "plugin":
                flops, moved = step.flops, step.bytes_moved
            else:
                moved = sum(_nbytes(plan.shapes[n]) for n in [*step.inputs, *step.outputs])
            kind, ops, implementation = step.kind, " > ".join(step.ops), step.implementation
        elif name in profile.graphs:  # a CUDA graph replaying a run of plugin steps, timed as one
            members = [steps[n] for n in profile.graphs[name]]
            input_shapes = [list(plan.shapes[n]) for n in members[0].inputs]
            output_shapes = [list(plan.shapes[n]) for n in members[-1].outputs]
            flops = sum(m.flops or 0 for m in members) or None
            kind, ops = "plugin", OP_SEPARATOR.join(op for m in members for op in m.ops)
            implementation = f"CUDA graph of {len(members)} plugin steps"
        else:  # a copy: "copy H2D <tensor>" (DMA) or "stage H2D <tensor>" (host memcpy through pinned memory)
            verb, direction, tensor = _copy_parts(name)
            input_shapes = output_shapes = [list(plan.shapes[tensor])]
            moved = _nbytes(plan.shapes[tensor])
            kind, ops = "copy", direction
            implementation = "cupy" if verb == "copy" else "host memcpy, pinned"
        rows.append(
            {
                "step": name,
                "kind": kind,
                "ops": ops,
                "implementation": implementation,
                "input_shapes": input_shapes,
                "output_shapes": output_shapes,
                "time_ms": ms,
                "gflops_per_s": flops / ms / 1e6 if flops and ms > 0 else None,
                "gb_per_s": moved / ms / 1e6 if moved and ms > 0 else None,
                "share": 0.0,
            }
        )
    total = sum(r["time_ms"] for r in rows)
    for row in rows:
        row["share"] = row["time_ms"] / total if total > 0 else 0.0
    return rows


def op_chain_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step rows summed per op chain (`MatMul > Add > Gelu`, a copy's direction), slowest first: how
    many steps run it, their time and share, and their GFLOP/s together where every one counts its FLOPs."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        key = row["ops"] if row["kind"] != "copy" else f"copy {row['ops']}"
        groups.setdefault(key, []).append(row)
    total = sum(row["time_ms"] for row in rows)
    chains = []
    for key, members in groups.items():
        ms = sum(row["time_ms"] for row in members)
        counted = all(row["gflops_per_s"] is not None for row in members)
        flops = sum(row["gflops_per_s"] * row["time_ms"] * 1e6 for row in members) if counted else 0.0
        chains.append({"ops": key, "kind": members[0]["kind"], "steps": len(members), "time_ms": ms,
                       "share": ms / total if total > 0 else 0.0,
                       "gflops_per_s": flops / ms / 1e6 if counted and ms > 0 else None})
    return sorted(chains, key=lambda chain: -chain["time_ms"])


def format_op_chains(chains: list[dict[str, Any]], wide: bool = False) -> str:
    """The op-chain summary as a table; unless `wide`, long chains summarised as the step table does."""
    body = [[summarise_ops(c["ops"].split(OP_SEPARATOR), None if wide else OPS_WIDTH), str(c["steps"]), _fmt(c["time_ms"]),
             _fmt(c["gflops_per_s"], 1), f"{100 * c['share']:.1f}%"] for c in chains]
    return "\n".join(text_table(["op chain", "steps", "time ms", "GFLOP/s", "share"], body, right=(1, 2, 3, 4),
                                width=None if wide else LINE_WIDTH))


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


def build_report(profile: Profile, warmup: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The timing report of a profiled run as plain data (run's JSON): the shared header,
    a row per step and per copy with medians, the host-to-host time and the chunking;
    `extra` adds keys such as the data source, accuracy and agreement."""
    rows = step_rows(profile)
    plan = profile.plan
    device = plan.device
    last = profile.result
    host_to_host = _median(profile.total_ms)
    batch = profile.batch
    report = header(SCHEMA, device, plan.model.name, batch) | {
        "onnxruntime_provider": plan.onnxruntime_provider,
        "precision": plan.precision,  # asked for: steps with a kernel in it run in it, the rest in fp32 (plan/precision.py)
        "budget": None,  # under precision mixed, what keeps nodes in FP32 (`extra` gives it)
        "warmup": warmup,
        "repeat": len(profile.total_ms),
        "steps": rows,
        "by_op_chain": op_chain_rows(rows),
        "op_times_ms": {r["step"]: r["time_ms"] for r in rows if r["kind"] == "plugin"},
        "steps_total_ms": sum(r["time_ms"] for r in rows),
        "fallbacks": dict(plan.fallbacks),
        # host to host: from the caller's input arrays to the returned outputs, median run
        "host_to_host_ms": host_to_host,
        "images_per_s": batch / (host_to_host / 1e3) if host_to_host > 0 else None,
        "chunks": last.chunks,
        "chunk_size": last.chunk_size,
        "streams": last.streams,
        "input_pinned": last.input_pinned,
        # copy_ms: every copy's duration added up; hidden: while a step computed; exposed: while none did
        "copy_ms": _median(profile.copy_ms),
        "copy_hidden_ms": _median(profile.copy_hidden_ms),
        "copy_exposed_ms": _median(profile.copy_exposed_ms),
        "exact_reruns": last.exact_reruns,  # chunks with NaN/Inf after a fused step, rerun on onnxruntime's nodes
        # CUDA graphs: each graph's name -> the plan steps it replayed; the steps keep their own rows,
        # timed by events inside the graph, except where the graph is a row of its own (not in cuda_graph_ms)
        "cuda_graphs": {name: list(steps) for name, steps in profile.graphs.items()},
        # each graph whose steps were timed inside it -> its median replay time (input copies included)
        "cuda_graph_ms": {name: _median(ms) for name, ms in profile.graph_ms.items()},
        # each graph -> its median replay time without the step events: the replays host_to_host_ms comes from
        "cuda_graph_untimed_ms": {name: _median(ms) for name, ms in profile.untimed_graph_ms.items()},
        # runs of plugin steps that could not be captured and ran eagerly: first step -> why
        "cuda_graph_failures": dict(last.graph_failures),
        # what the caller knows and the runtime does not: where the inputs came from, the
        # accuracy against labels, agreement with onnxruntime (null when not measured)
        "data": None,
        "accuracy": None,
        "agreement": None,
    }
    report.update(extra or {})
    return report


def add_devices(report: dict[str, Any], rows: list[dict[str, Any]], total_ms: float,
                feeding: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run split over several devices (--devices): the batch and images/s of them all, host to
    host, `rows` (runtime.multi_device.device_rows), one per device, and `feeding`, how many of them
    the run used and why (runtime.feeding.Feeding.record). The step table, chunks and copies stay
    those of the first device's share, which `steps_device` names."""
    batch = sum(row["images"] for row in rows)
    first = next(row for row in rows if row["images"])
    return report | {
        "batch": batch,
        "host_to_host_ms": total_ms,
        "images_per_s": batch / (total_ms / 1e3) if total_ms > 0 else None,
        "devices": rows,
        "steps_device": {"device": first["device"], "images": first["images"]},
        "feeding": feeding,
    }


def format_devices(report: dict[str, Any]) -> list[str]:
    """A row per device, then the images/s of them all."""
    header = ["device", "images", "time ms", "images/s"]
    body = [[row["device"], f"{row['images']:,}", _fmt(row["time_ms"]),
             "-" if row["images_per_s"] is None else f"{row['images_per_s']:,.0f}"] for row in report["devices"]]
    rate = report.get("images_per_s")
    given, used = len(report["devices"]), sum(1 for row in report["devices"] if row["images"])
    which = f"All {given} devices" if used == given else f"{used} of {given} devices"
    total = (f"{which}: {report['batch']:,} images in {report['host_to_host_ms']:.3f} ms host to host, "
             f"{'-' if rate is None else f'{rate:,.0f}'} images/s")
    feeding = report.get("feeding")
    return [*text_table(header, body, right=(1, 2, 3)), total, *([format_feeding(feeding)] if feeding and len(feeding["given"]) > 1 else [])]


def format_feeding(feeding: dict[str, Any], lead: str = "Feed probe") -> str:
    """One line, after `lead`: how many of the devices given the run used, the feed probe's images/s
    on 1, 2, ... N of them behind the choice, and the devices left idle; or why no probe ran."""
    given, used = len(feeding["given"]), len(feeding["used"])
    if not feeding["probed"]:
        return f"{lead}: none ({feeding['why_not_probed']}); all {given} devices used"
    rates = ", ".join(f"{row['devices']}: {row['images_per_s']:,.0f}" for row in feeding["probe"])
    fed = f"all {given} devices" if used == given else f"{used} of the {given} devices"
    line = f"{lead}: the host fed {fed} (images/s on {rates}; the fewest within {feeding['margin']:.0%} of the most)"
    return line + (f"; {', '.join(feeding['idle'])} left idle" if feeding["idle"] else "")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _shapes(shapes: list[list[int]]) -> str:
    return " ".join("x".join(str(d) for d in s) for s in shapes)


# Without --wide: the most characters the ops column takes.
OPS_WIDTH = 48


def format_table(rows: list[dict[str, Any]], wide: bool = False) -> str:
    """The step table; unless `wide`, op chains summarised and the table fitted to LINE_WIDTH."""
    header = ["step", "ops", "implementation", "input", "time ms", "GFLOP/s", "GB/s", "share"]
    ops_width = None if wide else OPS_WIDTH
    body = [
        [
            r["step"],
            summarise_ops(r["ops"].split(OP_SEPARATOR), ops_width),
            r["implementation"],
            _shapes(r["input_shapes"]),
            _fmt(r["time_ms"]),
            _fmt(r["gflops_per_s"], 1),
            _fmt(r["gb_per_s"], 1),
            f"{100 * r['share']:.1f}%",
        ]
        for r in rows
    ]
    return "\n".join(text_table(header, body, right=(4, 5, 6, 7), width=None if wide else LINE_WIDTH))


def _graph_lines(report: dict[str, Any]) -> list[str]:
    """What the CUDA graphs replayed and how their steps were timed; one line per run that ran eagerly."""
    graphs, timed = report.get("cuda_graphs") or {}, report.get("cuda_graph_ms") or {}
    lines = []
    if graphs:
        steps = sum(len(members) for members in graphs.values())
        lines.append(f"CUDA graphs: {len(graphs)} graph(s) replayed {steps} plugin steps")
        if timed:
            rows = {row["step"]: row["time_ms"] for row in report["steps"]}
            inside = sum(rows.get(step, 0.0) for name in timed for step in graphs.get(name, ()))
            lines[-1] += (f"; step times from events inside the graphs: {inside:.3f} ms of the replays' "
                          f"{sum(timed.values()):.3f} ms (the rest: input copies and launch)")
            untimed = report.get("cuda_graph_untimed_ms") or {}
            if untimed:
                lines[-1] += (f"; without those events the replays take {sum(untimed.values()):.3f} ms, "
                              "and host to host is timed on such runs")
        if len(timed) < len(graphs):
            lines[-1] += "; graphs without events inside are timed as one row each"
    for first, why in (report.get("cuda_graph_failures") or {}).items():
        lines.append(f"CUDA graph: the plugin steps from {first} ran eagerly: {why}")
    return lines


def _precision_note(report: dict[str, Any]) -> str:
    """What the first line says of the precision asked for: nothing for FP32."""
    precision, budget = report.get("precision", "fp32"), report.get("budget")
    if precision == "fp32":
        return ""
    if budget is not None:  # precision mixed
        return f", precision mixed ({budget_note(budget)}; fp16 where a step has a kernel in it)"
    return f", precision {precision} where a step has a kernel in it"


def format_text(report: dict[str, Any], wide: bool = False) -> str:
    """The whole report as a person reads it: the seeds' lines, then the table.
    Unless `wide`, long names and op chains are shortened to keep lines near LINE_WIDTH."""
    name_width = None if wide else NAME_WIDTH
    device = report["device"]
    where = device["name"] if device["kind"] == "cuda" else "CPU — no CUDA device, plugin steps ran the numpy reference"
    asked = _precision_note(report)
    lines = [
        f"opplugin {report['opplugin_version']}: {report['model']}, batch {report['batch']}, on {where}{asked}",
        f"onnxruntime steps on {report['onnxruntime_provider']}; times are {_timed_runs(report['repeat'])} after {report['warmup']} warm-up",
        "",
    ]
    for step, ms in report["op_times_ms"].items():
        lines.append(f"Op Time: {ms:.4f} ms  ({elide_middle(step, name_width)})")
    if report.get("accuracy") is not None:
        lines.append(f"Test Accuracy: {report['accuracy']:.4f}")
    lines += ["", format_table(report["steps"], wide), ""]
    if any(c["steps"] > 1 and c["kind"] != "copy" for c in report["by_op_chain"]):  # where the time goes by kind of step
        lines += ["Time by op chain:", format_op_chains(report["by_op_chain"], wide), ""]
    lines.extend(_graph_lines(report))
    if report.get("devices"):
        steps = report["steps_device"]
        lines.append(f"Steps total: {report['steps_total_ms']:.3f} ms, on {steps['device']} for its {steps['images']:,} images")
        lines.extend(format_devices(report))
    else:
        lines.append(f"Steps total: {report['steps_total_ms']:.3f} ms   end to end (one run, host clock): {report['host_to_host_ms']:.3f} ms")
        lines.extend(_throughput_lines(report))
    agreement = report.get("agreement")
    if agreement:
        verdict = "PASS" if agreement["passed"] else "FAIL"
        # top-1 only where the output is a classifier's (see check.top1)
        top1 = "" if agreement.get("top1_agreement") is None else f"top-1 agreement {agreement['top1_agreement']:.4f}, "
        rule = f" at atol {agreement['atol']:g}, rtol {agreement['rtol']:g}" if "atol" in agreement else ""
        lines.append(
            f"Against onnxruntime CPU: {verdict}{rule}  {top1}"
            f"max abs error {agreement['max_abs_error']:.2e}, rel L2 {agreement['rel_l2']:.2e}"
        )
        if agreement.get("widened_for"):  # onnxruntime's FP32 is the reference, the rule widened for the format
            lines.append(f"  ({agreement['widened_for']}'s default rule against onnxruntime's FP32, as wide as the format's "
                         "roundoff allows; --atol and --rtol set one)")
    if report.get("exact_reruns"):
        lines.append(f"Exact path: {report['exact_reruns']} of {report.get('chunks', 1)} chunks held NaN or Inf after a fused step "
                     "and ran again with each fused step split: its own node in a kernel that keeps NaN and Inf as onnxruntime "
                     "does, onnxruntime's nodes for the rest")
        lowered = report.get("precision", "fp32") != "fp32"
        if lowered and device["kind"] == "cuda":  # runtime/exact.py: the products' rerun is FP32 FMAs on a GPU
            lines.append("  (those chunks' products ran again in FP32: an Inf that the reduced precision met, as a value past "
                         "its range makes, does not show in their outputs)")
    for node, reason in report.get("fallbacks", {}).items():
        note = f"Note: {elide_middle(node, name_width)} ran in onnxruntime: {reason}"
        lines.append(elide_middle(note, None if wide else LINE_WIDTH))
    return "\n".join(lines)


def _throughput_lines(report: dict[str, Any]) -> list[str]:
    """Host-to-host throughput, chunking, and the copy time hidden behind compute."""
    if report.get("images_per_s") is None:
        return []
    chunks = report.get("chunks", 1)
    how = "in one piece" if chunks == 1 else f"in {chunks} chunks of up to {report['chunk_size']}"
    if chunks > 1 and report["device"]["kind"] == "cuda":
        how += f" on {report['streams']} stream{'s' if report['streams'] > 1 else ''}"
    lines = [f"Host to host: {report['host_to_host_ms']:.3f} ms for {report['batch']} images, "
             f"{report['images_per_s']:,.0f} images/s ({how})"]
    if report["device"]["kind"] == "cuda":
        source = ("input in pinned memory, copied straight to the GPU" if report.get("input_pinned")
                  else "input in pageable memory, staged through pinned buffers")
        lines.append(f"Copies: {report['copy_ms']:.3f} ms in all, {report['copy_hidden_ms']:.3f} ms of it hidden behind compute, "
                     f"{report['copy_exposed_ms']:.3f} ms exposed; {source}")
    return lines


def to_csv(rows: list[dict[str, Any]]) -> str:
    """The step rows of a report as CSV, every key a column."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_KEYS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in row.items()})
    return buffer.getvalue()


def _timed_runs(repeat: int) -> str:
    return "from one run" if repeat == 1 else f"medians of {repeat} runs"
