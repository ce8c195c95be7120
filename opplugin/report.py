"""The timing report: plain records built once, then written as text, JSON or CSV.

Records are dicts with stable keys (see ROW_KEYS), so the JSON and CSV files
carry exactly what the text table shows.
"""
from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .plan import PluginStep
from .runner import Profile, Runner

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


def step_rows(runner: Runner, profile: Profile) -> list[dict[str, Any]]:
    """One row per step and per copy, in execution order, with median times."""
    plan = runner.plan
    steps = {s.name: s for s in plan.steps}
    rows = []
    for name in profile.step_ms:
        ms = profile.median(name)
        flops = moved = None
        if name in steps:
            step = steps[name]
            inputs = [n for n in step.inputs if n and n not in plan.model.initializers]
            input_shapes = [list(plan.shape_of(n)) for n in inputs]
            output_shapes = [list(plan.shape_of(n)) for n in step.outputs]
            if isinstance(step, PluginStep):
                kernel = runner.kernels[name]
                flops, moved = kernel.flops(plan.batch), kernel.bytes_moved(plan.batch)
            else:
                moved = sum(_nbytes(plan.shape_of(n)) for n in [*inputs, *step.outputs])
            kind, ops, implementation = step.kind, " > ".join(step.ops), runner.implementation(name)
        else:  # a copy: "copy H2D <tensor>"
            tensor = name.split(" ", 2)[2]
            input_shapes = output_shapes = [list(plan.shape_of(tensor))]
            moved = _nbytes(plan.shape_of(tensor))
            kind, ops, implementation = "copy", name.split(" ")[1], "cupy"
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


def build_report(runner: Runner, profile: Profile, warmup: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    rows = step_rows(runner, profile)
    device = runner.device
    report = {
        "opplugin_version": __version__,
        "model": runner.plan.model.name,
        "batch": runner.batch,
        "device": {"kind": device.kind, "name": device.name, "compute_capability": device.compute_capability},
        "onnxruntime_provider": "CUDAExecutionProvider" if runner.ort_on_gpu else "CPUExecutionProvider",
        "warmup": warmup,
        "repeat": len(profile.total_ms),
        "steps": rows,
        "op_times_ms": {r["step"]: r["time_ms"] for r in rows if r["kind"] == "plugin"},
        "steps_total_ms": sum(r["time_ms"] for r in rows),
        "end_to_end_ms": float(np.median(profile.total_ms)),
        "fallbacks": dict(runner.plan.fallbacks),
    }
    report.update(extra or {})
    return report


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _shapes(shapes: list[list[int]]) -> str:
    return " ".join("x".join(str(d) for d in s) for s in shapes)


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ["step", "ops", "implementation", "input", "time ms", "GFLOP/s", "GB/s", "share"]
    body = [
        [
            r["step"],
            r["ops"],
            r["implementation"],
            _shapes(r["input_shapes"]),
            _fmt(r["time_ms"]),
            _fmt(r["gflops_per_s"], 1),
            _fmt(r["gb_per_s"], 1),
            f"{100 * r['share']:.1f}%",
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    numeric = {4, 5, 6, 7}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(b) for b in body)])


def format_text(report: dict[str, Any]) -> str:
    """The whole report as a person reads it: the seeds' lines, then the table."""
    device = report["device"]
    where = device["name"] if device["kind"] == "cuda" else "CPU — no CUDA device, plugin steps ran the numpy reference"
    lines = [
        f"opplugin {report['opplugin_version']}: {report['model']}, batch {report['batch']}, on {where}",
        f"onnxruntime steps on {report['onnxruntime_provider']}; times are medians of {report['repeat']} runs after {report['warmup']} warm-up",
        "",
    ]
    for step, ms in report["op_times_ms"].items():
        lines.append(f"Op Time: {ms:.4f} ms  ({step})")
    if report.get("accuracy") is not None:
        lines.append(f"Test Accuracy: {report['accuracy']:.4f}")
    lines += ["", format_table(report["steps"]), ""]
    lines.append(f"Steps total: {report['steps_total_ms']:.3f} ms   end to end (one run, host clock): {report['end_to_end_ms']:.3f} ms")
    agreement = report.get("agreement")
    if agreement:
        verdict = "PASS" if agreement["passed"] else "FAIL"
        lines.append(
            f"Against onnxruntime CPU: {verdict}  top-1 agreement {agreement['top1_agreement']:.4f}, "
            f"max abs error {agreement['max_abs_error']:.2e}, rel L2 {agreement['rel_l2']:.2e}"
        )
    for node, reason in report.get("fallbacks", {}).items():
        lines.append(f"Note: {node} ran in onnxruntime: {reason}")
    return "\n".join(lines)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_KEYS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (json.dumps(v) if isinstance(v, list) else v) for k, v in row.items()})
    return buffer.getvalue()


def write_atomic(path: str | Path, text: str) -> None:
    """Write to a temporary file beside the target, then rename: never a half-written report."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
