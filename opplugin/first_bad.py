"""Which step went wrong first, when `check` fails.

A step's error in the chained run mixes its own error with what it was given: every
step after a bad one may fail too. So each plugin step runs again on its own, fed
onnxruntime's values of its inputs, and its output is compared with onnxruntime's:
that is the step's own error. The first step (in plan order) whose own error exceeds
the tolerance is the first bad node; a step that fails only in the chained run
carries error in from upstream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .check import CheckResult, ErrorStats
from .sessions import Reference

# Images each step is re-run on: enough to meet a bad element, few enough to be quick.
ISOLATION_IMAGES = 64


@dataclass
class StepVerdict:
    step: str
    implementation: str
    own: dict[str, Any] | None  # figures on onnxruntime's inputs (None: could not be re-run)
    chained: dict[str, Any] | None  # figures in the chained run, from the check
    note: str | None = None

    @property
    def own_passed(self) -> bool:
        return self.own is not None and self.own["passed"]


def isolate_steps(runner, feeds: dict[str, np.ndarray], result: CheckResult, atol: float, rtol: float,
                  images: int = ISOLATION_IMAGES) -> list[StepVerdict]:
    """Each plugin step's own error (on onnxruntime's inputs) beside its chained one."""
    plan = runner.plan
    batched = runner.layout.batched_inputs if runner.layout.chunkable else frozenset()
    piece = {name: (value[:images] if name in batched else value) for name, value in feeds.items()}
    original = {o for n in plan.model.original.graph.node for o in n.output} | {i.name for i in plan.model.original.graph.input}
    wanted = [n for step in plan.plugin_steps for n in [*step.inputs, *step.outputs] if n in original]
    theirs = Reference(plan.model.original, list(dict.fromkeys(wanted)))(piece)
    theirs.update(piece)
    chained = {r["step"]: r for r in result.records}
    verdicts = []
    for step in plan.plugin_steps:
        kernel = runner.kernels[step.name]
        record = chained.get(step.name)
        missing = [n for n in [*step.inputs, *step.outputs] if n and n not in theirs and n not in runner.constants]
        if missing:
            verdicts.append(StepVerdict(step.name, kernel.name, None, record,
                                        f"{', '.join(missing)} not in the model as loaded (simplified away), so not re-run alone"))
            continue
        args = [_argument(runner, name, theirs) for name in step.inputs]
        outputs = kernel(args, None)
        stats = ErrorStats(atol, rtol)
        for name, value in zip(step.outputs, outputs):
            stats.add(_to_host(value), theirs[name])
        verdicts.append(StepVerdict(step.name, kernel.name, stats.result(), record))
    return verdicts


def _argument(runner, name: str, theirs: dict[str, np.ndarray]) -> Any:
    if not name:
        return None
    if name in runner.constants:
        return runner.constants[name]
    value = np.ascontiguousarray(theirs[name], dtype=np.float32)
    if runner.device.is_cuda:
        from . import cuda

        return cuda.to_device(value)
    return value


def _to_host(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    import cupy

    return cupy.asnumpy(value)


def first_bad(verdicts: list[StepVerdict]) -> StepVerdict | None:
    return next((v for v in verdicts if v.own is not None and not v.own_passed), None)


def format_verdicts(verdicts: list[StepVerdict], images: int) -> str:
    """A line naming the first bad step (or saying the error comes from elsewhere), then one line per step."""
    bad = first_bad(verdicts)
    if bad is not None:
        head = (f"First bad node: {bad.step} ({bad.implementation}): its own max abs error is {bad.own['max_abs_error']:.2e} "
                f"on onnxruntime's inputs ({images} images), so the error starts there")
    else:
        head = "No plugin step fails on onnxruntime's inputs: the error is carried in, or comes from an onnxruntime step"
    lines = [head, "Each plugin step re-run alone on onnxruntime's inputs, beside its error in the chained run:"]
    for v in verdicts:
        own = "not re-run: " + v.note if v.own is None else f"own max abs {v.own['max_abs_error']:.2e} {'pass' if v.own_passed else 'FAIL'}"
        chained = v.chained
        chain = "" if not chained or "max_abs_error" not in chained else \
            f"; chained {chained['max_abs_error']:.2e} {'pass' if chained['passed'] else 'FAIL'}"
        carried = "  (carried in from upstream)" if v.own_passed and chained and not chained["passed"] else ""
        lines.append(f"  {v.step}: {own}{chain}{carried}")
    return "\n".join(lines)
