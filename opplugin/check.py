"""Correctness against onnxruntime: the swapped model vs. onnxruntime's CPU
provider on the same inputs, per plugin step and on the final outputs.

Intermediate tensors come from onnxruntime by listing them as extra graph
outputs of the original model, so every plugin step is compared with exactly
what onnxruntime computes for that node.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import helper

from .model import Model
from .runner import Runner

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


def compare(actual: np.ndarray, expected: np.ndarray, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> dict[str, Any]:
    """Error figures of `actual` against `expected`. Passing means every element is
    within atol + rtol * |expected|, and NaN/Inf sit exactly where onnxruntime has them.
    The relative error is taken over elements with |expected| > atol, where it means something."""
    if actual.shape != expected.shape:
        return {"passed": False, "error": f"shape {list(actual.shape)} differs from onnxruntime's {list(expected.shape)}"}
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    finite = np.isfinite(e)
    same_specials = bool(np.array_equal(np.isnan(a), np.isnan(e)) and np.array_equal(a[~finite & ~np.isnan(e)], e[~finite & ~np.isnan(e)]))
    diff = np.abs(a[finite] - e[finite])
    ref = np.abs(e)[finite]
    meaningful = ref > atol
    norm = float(np.linalg.norm(e[finite]))
    return {
        "passed": bool(same_specials and np.all(np.isfinite(a[finite])) and np.all(diff <= atol + rtol * ref)),
        "max_abs_error": float(diff.max()) if diff.size else 0.0,
        "max_rel_error": float((diff[meaningful] / ref[meaningful]).max()) if meaningful.any() else 0.0,
        "rel_l2": float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff)),
        "mismatches": int(np.count_nonzero(diff > atol + rtol * ref)) + (0 if same_specials else 1),
        "elements": int(e.size),
    }


def onnxruntime_reference(model: Model, feeds: dict[str, np.ndarray], extra_outputs: list[str]) -> dict[str, np.ndarray]:
    """Run the unmodified model on onnxruntime's CPU provider, also returning `extra_outputs`."""
    proto = copy.deepcopy(model.proto)
    existing = {o.name for o in proto.graph.output}
    for name in extra_outputs:
        if name not in existing:
            proto.graph.output.append(helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, session.run(names, feeds)))


@dataclass
class CheckResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    top1_agreement: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.records)


def top1(probabilities: np.ndarray) -> np.ndarray | None:
    """Predicted classes when the output looks like (batch, classes), else None."""
    if probabilities.ndim != 2 or probabilities.shape[1] < 2:
        return None
    return probabilities.argmax(axis=1)


def check(
    runner: Runner,
    feeds: dict[str, np.ndarray],
    labels: np.ndarray | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> CheckResult:
    steps = runner.plan.plugin_steps
    kept = tuple(name for step in steps for name in step.outputs if name not in runner.plan.model.outputs)
    ours = runner.run(feeds, keep=kept)
    reference = onnxruntime_reference(runner.plan.model, feeds, list(kept))
    result = CheckResult()
    for step in steps:
        for name in step.outputs:
            actual = ours.kept.get(name, ours.outputs.get(name))
            record = {"tensor": name, "step": step.name, "implementation": runner.implementation(step.name)}
            result.records.append(record | compare(actual, reference[name], atol, rtol))
    for name in runner.plan.model.outputs:
        record = {"tensor": name, "step": "model output", "implementation": "whole model"}
        result.records.append(record | compare(ours.outputs[name], reference[name], atol, rtol))

    first = runner.plan.model.outputs[0]
    ours_top1, ref_top1 = top1(ours.outputs[first]), top1(reference[first])
    if ours_top1 is not None:
        result.top1_agreement = float(np.mean(ours_top1 == ref_top1))
        if labels is not None:
            result.accuracy = float(np.mean(ours_top1 == labels))
            result.reference_accuracy = float(np.mean(ref_top1 == labels))
    return result


def format_check(result: CheckResult, atol: float, rtol: float) -> str:
    header = f"{'tensor':<24} {'step':<14} {'implementation':<22} {'max abs':>9} {'max rel':>9} {'rel L2':>9}  result"
    lines = [header, "-" * len(header)]
    for r in result.records:
        if "error" in r:
            lines.append(f"{r['tensor']:<24} {r['step']:<14} {r['implementation']:<22} {r['error']}  FAIL")
            continue
        lines.append(
            f"{r['tensor']:<24} {r['step']:<14} {r['implementation']:<22} "
            f"{r['max_abs_error']:>9.2e} {r['max_rel_error']:>9.2e} {r['rel_l2']:>9.2e}  {'pass' if r['passed'] else 'FAIL'}"
        )
    lines.append("")
    if result.top1_agreement is not None:
        lines.append(f"Top-1 agreement with onnxruntime: {result.top1_agreement:.4f}")
    if result.accuracy is not None:
        lines.append(f"Test Accuracy: {result.accuracy:.4f}  (onnxruntime alone: {result.reference_accuracy:.4f})")
    verdict = "PASS" if result.passed else "FAIL"
    lines.append(f"{verdict} at atol {atol:g}, rtol {rtol:g}")
    return "\n".join(lines)
