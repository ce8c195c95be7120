"""Which step went wrong first when `check` fails, and whether it is wrong at all.

A step's error in the chained run mixes its own error with what it was given: every
step after a bad one may fail too. So each plugin step runs again on its own, fed
onnxruntime's values of its inputs, and its output is compared with onnxruntime's:
that is the step's own error. The images are those where the chained comparison
failed (then the first ones).

Where a step's own error exceeds the tolerance, float64 arbitrates: the step's ONNX
nodes run in float64 on the same inputs (float64.py), and both sides are measured
against that exact result. The step is sound when opplugin is within the tolerance of
the exact result, or within the FP32 error bound of its nodes (float64.fp32_bound), or
no further from the exact result than onnxruntime: in a deep, ill-conditioned network
two float32 implementations differ without either being wrong. The first step
(in plan order) that is not sound is the first bad node.

When every plugin step is sound, the chained differences are float32 rounding carried
through the network, and `arbitrate` passes the comparisons that failed only by their
size (NaN and Inf out of place, or a wrong shape, still fail).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import float64
from .check import CheckResult, ErrorStats, comparable_tensors
from ..errors import first_line
from .references import float64_ops, reference_for

# Images each step is re-run on: enough to meet a bad element, few enough to be quick.
ISOLATION_IMAGES = 64
# Of those, the images a failing step is evaluated on in float64 (the first where it fails).
ARBITRATION_IMAGES = 8


@dataclass
class StepVerdict:
    step: str
    implementation: str
    own: dict[str, Any] | None  # figures on onnxruntime's inputs (None: could not be re-run)
    chained: dict[str, Any] | None  # figures in the chained run, from the check
    note: str | None = None
    # where `own` fails: each side's figures against float64 on the same inputs ("opplugin",
    # "onnxruntime"), or None with `note` saying why there are none
    exact: dict[str, dict[str, Any]] | None = None
    # where every element of opplugin's output is within the FP32 error bound of the step's
    # nodes (float64.fp32_bound) around the exact result: the largest bound; else None
    fp32_bound: float | None = None

    @property
    def own_passed(self) -> bool:
        return self.own is not None and self.own["passed"]

    @property
    def closer_to_exact(self) -> bool:
        """Whether float64 acquits the step: opplugin within the tolerance of the exact result or
        within the FP32 error bound of the step's nodes, or no further from it than onnxruntime."""
        if self.exact is None:
            return False
        ours, theirs = self.exact["opplugin"], self.exact["onnxruntime"]
        if "error" in ours:
            return False
        if ours["passed"] or self.fp32_bound is not None:
            return True
        if not ours["same_specials"] and theirs.get("same_specials", True):  # NaN or Inf where neither has them
            return False
        return "max_abs_error" in theirs and ours["max_abs_error"] <= theirs["max_abs_error"]  # NaN compares false

    @property
    def sound(self) -> bool:
        """Own error within tolerance, or acquitted by float64; a step not re-run is sound when its chained figures pass."""
        if self.own is None:
            return bool(self.chained and self.chained["passed"])
        return self.own_passed or self.closer_to_exact


def _images(runner, feeds: dict[str, np.ndarray], result: CheckResult, images: int) -> tuple[dict[str, np.ndarray], int]:
    """Up to `images` images of the feeds: first those where the check failed, then the first ones."""
    batched = runner.layout.batched_inputs if runner.layout.chunkable else frozenset()
    if not batched:
        return dict(feeds), 0
    total = len(feeds[next(iter(batched))])
    rows = list(dict.fromkeys([r for r in result.bad_rows if r < total] + list(range(min(images, total)))))[:images]
    rows.sort()
    return {name: (value[rows] if name in batched else value) for name, value in feeds.items()}, len(rows)


def isolate_steps(runner, feeds: dict[str, np.ndarray], result: CheckResult, atol: float, rtol: float,
                  images: int = ISOLATION_IMAGES) -> list[StepVerdict]:
    """Each plugin step's own error (on onnxruntime's inputs) beside its chained one, and
    where the own error fails, both sides against float64."""
    plan = runner.plan
    piece, _ = _images(runner, feeds, result, images)
    views = plan.model.simplification.views  # tensors the simplified graph writes in another layout or shape
    comparable = comparable_tensors(plan.model)
    wanted = [n for step in plan.plugin_steps for n in [*step.inputs, *step.outputs] if n in comparable]
    theirs = reference_for(plan.model, list(dict.fromkeys(wanted)), views=views)(piece)
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
        outputs = [_to_host(value) for value in kernel(args, None)]
        stats = ErrorStats(atol, rtol)
        for name, value in zip(step.outputs, outputs):
            stats.add(value, theirs[name])
        verdict = StepVerdict(step.name, kernel.name, stats.result() | {"same_specials": stats.same_specials}, record)
        if not verdict.own_passed:  # on the images where it fails: float64 is slow
            rows = stats.bad_rows[:ARBITRATION_IMAGES] if runner.layout.chunkable else None
            read = {i for n in step.kernel_nodes for i in n.node.input if i in theirs}
            _judge_by_float64(verdict, step, plan.model, _rows(dict(zip(step.outputs, outputs)), rows, runner.layout),
                              _rows({n: theirs[n] for n in [*read, *step.outputs]}, rows, runner.layout), atol, rtol)
        verdicts.append(verdict)
    return verdicts


def _rows(values: dict[str, np.ndarray], rows: list[int] | None, layout) -> dict[str, np.ndarray]:
    """`values` at these rows (images) where they have the batch as their first axis; all of them for None."""
    return {name: (value[rows] if rows and layout.is_batched(name) else value) for name, value in values.items()}


def _judge_by_float64(verdict: StepVerdict, step, model, ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray],
                      atol: float, rtol: float) -> None:
    """Fill `verdict.exact`: opplugin's and onnxruntime's outputs of the step against its nodes in float64."""
    nodes = [n.node for n in step.kernel_nodes]
    try:
        exact = float64.evaluate(nodes, theirs, model.initializers, step.outputs, model.bare.opset_import,
                                 new_ops=float64_ops(model, nodes))
    except Exception as err:  # an op onnx's evaluator cannot run: no arbitration, the verdict stands
        verdict.note = f"no float64 arbitration: onnx's ReferenceEvaluator cannot run the step ({first_line(err)})"
        return
    sides = {"opplugin": ErrorStats(atol, rtol), "onnxruntime": ErrorStats(atol, rtol)}
    for name in step.outputs:
        sides["opplugin"].add(ours[name], exact[name])
        sides["onnxruntime"].add(theirs[name], exact[name])
    verdict.exact = {side: stats.result() | {"same_specials": stats.same_specials} for side, stats in sides.items()}
    verdict.fp32_bound = _within_fp32_bound(nodes, theirs, model, ours, exact, step.outputs)


def _within_fp32_bound(nodes, theirs, model, ours, exact, outputs) -> float | None:
    """The largest FP32 error bound of the step's output when every element of ours is within
    it (float64.fp32_bound), else None (no bound known, or some element beyond it)."""
    if len(outputs) != 1:
        return None
    try:
        bound = float64.fp32_bound(nodes, theirs, model.initializers, model.bare.opset_import, exact[outputs[0]] if len(nodes) == 1 else None)
    except Exception:  # no bound: the other rule alone decides
        return None
    if bound is None or bound.shape != exact[outputs[0]].shape:
        return None
    ours_out, exact_out = np.asarray(ours[outputs[0]], np.float64), exact[outputs[0]]
    same_nan = np.array_equal(np.isnan(ours_out), np.isnan(exact_out))
    with np.errstate(invalid="ignore"):
        inside = np.abs(ours_out - exact_out) <= bound
    return float(np.nanmax(bound)) if same_nan and bool(np.all(inside | np.isnan(exact_out))) else None


def _argument(runner, name: str, theirs: dict[str, np.ndarray]) -> Any:
    if not name:
        return None
    if name in runner.constants:
        return runner.constants[name]
    value = np.ascontiguousarray(theirs[name], dtype=np.float32)
    if runner.device.is_cuda:
        from ..gpu import cuda

        return cuda.to_device(value)
    return value


def _to_host(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    import cupy

    return cupy.asnumpy(value)


def first_bad(verdicts: list[StepVerdict]) -> StepVerdict | None:
    return next((v for v in verdicts if v.own is not None and not v.sound), None)


def arbitrate(result: CheckResult, verdicts: list[StepVerdict]) -> CheckResult:
    """`result` judged by float64: a new result (`result` is left as it was) in which the comparisons
    that failed only by size pass when every plugin step is sound (see the module's docstring), each
    with an "arbitration" saying why. Every record keeps what onnxruntime alone said in
    "passed_against_onnxruntime"."""
    by_step = {v.step: v for v in verdicts}
    everything_sound = all(v.sound for v in verdicts)
    return dataclasses.replace(result, arbitrated=True,
                               records=[_arbitrated(record, by_step.get(record["step"]), everything_sound) for record in result.records])


def _arbitrated(record: dict[str, Any], verdict: StepVerdict | None, everything_sound: bool) -> dict[str, Any]:
    """One comparison's record with float64's figures, passed where it failed by size alone and every step is sound."""
    record = {**record, "passed_against_onnxruntime": record["passed"]}
    if verdict is not None and verdict.exact is not None:
        record["float64_max_abs_opplugin"] = verdict.exact["opplugin"].get("max_abs_error")
        record["float64_max_abs_onnxruntime"] = verdict.exact["onnxruntime"].get("max_abs_error")
    if record["passed"] or not everything_sound or not _fails_by_size_alone(record):
        return record
    record["passed"] = True
    if verdict is not None and verdict.exact is not None:
        bound = "" if verdict.fp32_bound is None else f", every element within the FP32 bound (up to {verdict.fp32_bound:.2e})"
        record["arbitration"] = (f"float64 on the same inputs: opplugin's max abs error "
                                 f"{record['float64_max_abs_opplugin']:.2e}, onnxruntime's {record['float64_max_abs_onnxruntime']:.2e}{bound}")
    else:
        record["arbitration"] = "float32 rounding carried in: every plugin step alone matches onnxruntime or float64"
    return record


def _fails_by_size_alone(record: dict[str, Any]) -> bool:
    """A failed comparison with figures (the shapes matched) and NaN and Inf on both sides alike."""
    if "error" in record and record["error"]:
        return False
    return record.get("nan_ours", 0) == record.get("nan_onnxruntime", 0) and record.get("inf_ours", 0) == record.get("inf_onnxruntime", 0)


def verdicts_as_json(verdicts: list[StepVerdict], images: int) -> dict[str, Any]:
    """The first bad node and each step's own figures, as `check --json` carries them."""
    bad = first_bad(verdicts)

    def step(v: StepVerdict) -> dict[str, Any]:
        own = None if v.own is None else {k: v.own.get(k) for k in ("passed", "max_abs_error", "max_rel_error", "rel_l2")}
        exact = None if v.exact is None else {side: figures.get("max_abs_error") for side, figures in v.exact.items()}
        return {"step": v.step, "implementation": v.implementation, "own": own, "float64_max_abs": exact,
                "within_fp32_bound": v.fp32_bound, "acquitted_by_float64": v.closer_to_exact if v.exact is not None else None,
                "sound": v.sound, "note": v.note}

    return {"images": images, "first_bad_node": None if bad is None else step(bad), "steps": [step(v) for v in verdicts]}


def format_verdicts(verdicts: list[StepVerdict], images: int) -> str:
    """A line naming the first bad step (or saying the error comes from elsewhere), then one line per step."""
    bad = first_bad(verdicts)
    if bad is not None:
        head = (f"First bad node: {bad.step} ({bad.implementation}): its own max abs error is {bad.own['max_abs_error']:.2e} "
                f"on onnxruntime's inputs ({images} images), so the error starts there")
    elif any(v.closer_to_exact for v in verdicts):
        head = ("No plugin step is wrong: where one differs from onnxruntime on the same inputs, float64 shows it "
                "within the FP32 bound of its op or no further from the exact result than onnxruntime")
    else:
        head = "No plugin step fails on onnxruntime's inputs: the error is carried in, or comes from an onnxruntime step"
    lines = [head, "Each plugin step re-run alone on onnxruntime's inputs, beside its error in the chained run:"]
    for v in verdicts:
        own = "not re-run: " + v.note if v.own is None else f"own max abs {v.own['max_abs_error']:.2e} {'pass' if v.own_passed else 'FAIL'}"
        chained = v.chained
        chain = "" if not chained or "max_abs_error" not in chained else \
            f"; chained {chained['max_abs_error']:.2e} {'pass' if chained.get('passed_against_onnxruntime', chained['passed']) else 'FAIL'}"
        carried = "  (carried in from upstream)" if v.own_passed and chained and not chained.get("passed_against_onnxruntime", chained["passed"]) else ""
        lines.append(f"  {v.step}: {own}{chain}{carried}{_exact_text(v)}")
    return "\n".join(lines)


def _exact_text(v: StepVerdict) -> str:
    if v.exact is None:
        return f"; {v.note}" if v.own is not None and v.note else ""
    ours, theirs = v.exact["opplugin"].get("max_abs_error"), v.exact["onnxruntime"].get("max_abs_error")
    if ours is None or theirs is None:
        return "; float64: the shapes differ"
    if v.fp32_bound is not None:
        judged = f"opplugin within the FP32 bound, up to {v.fp32_bound:.2e}: sound"
    elif v.closer_to_exact:
        judged = "opplugin no further from exact: sound"
    else:
        judged = "opplugin further from exact and beyond the FP32 bound: wrong"
    return f"; vs float64: opplugin {ours:.2e}, onnxruntime {theirs:.2e} ({judged})"
