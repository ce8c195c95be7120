"""Each implementation of a custom node, checked against its op's float64 reference and then
timed, beside the reference itself: the custom-op part of `opplugin tune`.

A trial builds the implementation (a failure is recorded, never raised), runs it once on fresh
standard-normal inputs (the node's constants as they are) into outputs poisoned with NaN, and
compares them with the reference by check's rule; only an implementation that passes is timed
(CUDA events, median of samples after warm-up). The fastest that passes is the node's choice
(custom/choices.py), which its op's default_variant reads from then on.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..custom import CustomOp, choices
from ..custom.outputs import sample_values
from ..errors import first_line
from ..gpu.device import Device
from ..plan.partition import Plan, PluginStep
from ..verify.check import DEFAULT_ATOL, DEFAULT_RTOL, ErrorStats
from .trial import time_call

Progress = Callable[[str], None]


@dataclass
class ImplementationTrial:
    """How one implementation fared: "ok" (passed and timed), "incorrect", "failed" or "unsupported"."""

    variant: str
    status: str
    reason: str | None = None
    ms: float | None = None
    max_abs_error: float | None = None
    rel_l2: float | None = None


@dataclass
class CustomStepTuning:
    step: str
    op: str
    reference_ms: float | None  # the float64 reference on the host, for scale
    trials: list[ImplementationTrial] = field(default_factory=list)
    key: str = ""  # the choice's key (choices.choice_key)

    @property
    def chosen(self) -> ImplementationTrial | None:
        passed = [t for t in self.trials if t.status == "ok"]
        return min(passed, key=lambda t: t.ms) if passed else None


def custom_steps(plan: Plan) -> list[PluginStep]:
    """The plan's steps that run a custom op's node."""
    return [step for step in plan.plugin_steps if isinstance(step.plugin, CustomOp)]


def tune_custom_step(step: PluginStep, device: Device, say: Progress, warmup: int, repeat: int, seed: int = 0) -> CustomStepTuning:
    op: CustomOp = step.plugin
    node = step.node
    host = sample_values(node, seed=seed, integer_high=4)  # fresh standard-normal values at the plan's shapes
    started = time.perf_counter()
    expected = op.call_reference(node.name, host, node.spec)
    reference_ms = (time.perf_counter() - started) * 1e3
    tuned = CustomStepTuning(step.name, op.op_type, reference_ms, key=op.choice_key(node, device))
    import cupy

    inputs = [None if value is None else cupy.asarray(value) for value in host]
    notes = op.variant_notes(node, device)
    variants = op.variant_names()
    say(f"{step.name} ({op.op_type}): {len(variants)} implementation(s), the float64 reference {reference_ms:.3f} ms on the host")
    for index, variant in enumerate(variants, 1):
        trial = _trial(op, step, device, variant, notes.get(variant), inputs, expected, warmup, repeat)
        tuned.trials.append(trial)
        timing = f"{trial.ms:.4f} ms" if trial.ms is not None else "-"
        say(f"[{step.name} {index}/{len(variants)}] {variant:<24} {trial.status:<11} {timing:>12}  {trial.reason or ''}".rstrip())
    return tuned


def _trial(op: CustomOp, step: PluginStep, device: Device, variant: str, unsupported: str | None, inputs: list[Any],
           expected: list[np.ndarray], warmup: int, repeat: int) -> ImplementationTrial:
    if unsupported is not None:
        return ImplementationTrial(variant, "unsupported", unsupported)
    try:
        checked = op.poisoned().build(step.node, device, variant)
        outputs = checked(inputs, None)
    except Exception as err:  # the user's kernel: any failure is its trial's, not the tuner's
        return ImplementationTrial(variant, "failed", first_line(err, named=True))
    stats = [ErrorStats(DEFAULT_ATOL, DEFAULT_RTOL).add(_host(out), want) for out, want in zip(outputs, expected)]
    figures = [s.result() for s in stats]
    worst = max((f.get("max_abs_error") or 0.0 for f in figures), default=0.0)
    rel = max((f.get("rel_l2") or 0.0 for f in figures), default=0.0)
    trial = ImplementationTrial(variant, "ok", max_abs_error=worst, rel_l2=rel)
    failed = next((f for f in figures if not f["passed"]), None)
    if failed is not None:
        why = failed.get("error") or f"max abs error {worst:.3g} against the reference, beyond atol {DEFAULT_ATOL:g} / rtol {DEFAULT_RTOL:g}"
        if any(not s.same_specials for s in stats):
            why = "NaN or Inf where the reference has none (an output element left unwritten?)"
        return dataclasses.replace(trial, status="incorrect", reason=why)
    try:
        timed = op.build(step.node, device, variant)  # as `run` runs it: no poison
        trial.ms = time_call(lambda: timed(inputs, None), warmup, repeat).ms
    except Exception as err:
        return dataclasses.replace(trial, status="failed", reason=f"timing failed: {first_line(err, named=True)}")
    return trial


def _host(value: Any) -> np.ndarray:
    return value.get() if hasattr(value, "get") else np.asarray(value)


def store_choices(tunings: list[CustomStepTuning]) -> Any:
    """Write each tuned step's choice (choices.py); the path written, or None where none was chosen."""
    chosen = {t.key: t.chosen.variant for t in tunings if t.chosen is not None}
    return choices.store(chosen) if chosen else None


def custom_table_lines(tunings: list[CustomStepTuning]) -> list[str]:
    """The text table of each custom step's trials: passing ones fastest first, the reference's time beside."""
    from ..core.texttable import text_table

    lines: list[str] = []
    for tuned in tunings:
        chosen = tuned.chosen
        lines.append(f"{tuned.step}  ({tuned.op}; float64 reference on the host: {tuned.reference_ms:.3f} ms)")
        order = sorted(tuned.trials, key=lambda t: (0, t.ms) if t.status == "ok" else (1, 0.0))
        rows = [(t.variant, f"{t.ms:.4f}" if t.ms is not None else "-",
                 f"{t.max_abs_error:.2e}" if t.max_abs_error is not None else "-",
                 t.status + (f": {t.reason}" if t.reason else ""), "*" if t is chosen else "") for t in order]
        lines += text_table(("implementation", "median ms", "max abs vs ref", "result", "chosen"), rows, right=(1, 2), indent="  ")
        if chosen is None:
            lines.append("  no implementation passed: the node keeps its default order (the reference last)")
        lines.append("")
    return lines
