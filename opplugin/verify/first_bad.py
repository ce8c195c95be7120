"""Which step went wrong first when `check` fails, and whether it is wrong at all.

A step's error in the chained run mixes its own error with what it was given: every
step after a bad one may fail too. So each plugin step runs again on its own, fed
onnxruntime's values of its inputs, and its output is compared with onnxruntime's:
that is the step's own error. The images are those where the chained comparison
failed (then the first ones).

Where a step's own error exceeds the tolerance, float64 arbitrates: the step's ONNX
nodes run in float64 on the same inputs (float64.py), and both sides are measured
against that exact result. The step is sound when opplugin is within the tolerance of
the exact result, or no further from it than onnxruntime over the whole tensor: element
by element within onnxruntime's error plus the FP32 bound of its nodes, in norm, and at
its worst element (closeness.py). In a deep, ill-conditioned network two float32
implementations differ without either being wrong; a kernel a little wrong everywhere
is still told apart. NaN and Inf must sit where the exact result has them. The first
step (in plan order) that is not sound is the first bad node.

When every plugin step is sound, the chained differences are float32 rounding carried
through the network, and `arbitrate` passes the comparisons that failed only by their
size. NaN and Inf out of place still fail, unless a step put them where float64 has them
and onnxruntime does not (its Conv skips the taps over padding, say): then the verdict
says why, once. A wrong shape always fails.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import float64
from .closeness import Closeness, judge, why_specials_differ
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
    # where `own` fails: both sides against float64 on the same inputs (closeness.py), or None
    # with `note` saying why there is no such judgement
    closeness: Closeness | None = None
    # where float64 sides with opplugin's NaN and Inf against onnxruntime's: why they differ
    specials_reason: str | None = None

    @property
    def own_passed(self) -> bool:
        return self.own is not None and self.own["passed"]

    @property
    def closer_to_exact(self) -> bool:
        """Whether float64 acquits the step: opplugin within the tolerance of the exact result, or
        no further from it than onnxruntime over the whole tensor (closeness.py)."""
        return self.closeness is not None and self.closeness.acquits

    @property
    def explains_specials(self) -> bool:
        """A sound step whose NaN and Inf differ from onnxruntime's where float64 has them as opplugin does."""
        return self.closer_to_exact and self.closeness.specials_explained

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
    """Fill `verdict.closeness`: opplugin's and onnxruntime's outputs of the step against its nodes in float64."""
    nodes = [n.node for n in step.kernel_nodes]
    try:
        exact = float64.evaluate(nodes, theirs, model.initializers, step.outputs, model.bare.opset_import,
                                 new_ops=float64_ops(model, nodes))
    except Exception as err:  # an op onnx's evaluator cannot run: no arbitration, the verdict stands
        verdict.note = f"no float64 arbitration: onnx's ReferenceEvaluator cannot run the step ({first_line(err)})"
        return
    differ = [name for name in step.outputs if np.shape(ours[name]) != np.shape(exact[name]) or np.shape(theirs[name]) != np.shape(exact[name])]
    if differ:
        verdict.note = f"no float64 arbitration: the shape of {', '.join(differ)} differs from float64's"
        return
    verdict.closeness = judge([ours[n] for n in step.outputs], [theirs[n] for n in step.outputs], [exact[n] for n in step.outputs],
                              _fp32_bound(nodes, theirs, model, exact, step.outputs), atol, rtol)
    if verdict.closeness.specials_explained:
        verdict.specials_reason = why_specials_differ(nodes, {**model.initializers, **theirs})


def _fp32_bound(nodes, theirs, model, exact, outputs) -> np.ndarray | None:
    """The FP32 error bound of each element of the step's single output (float64.fp32_bound), or None."""
    if len(outputs) != 1:
        return None
    try:
        return float64.fp32_bound(nodes, theirs, model.initializers, model.bare.opset_import, exact[outputs[0]] if len(nodes) == 1 else None)
    except Exception:  # no bound: onnxruntime's largest error stands for it (closeness.py)
        return None


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
    with an "arbitration" saying why; so do those whose NaN and Inf differ from onnxruntime's when a
    sound step put them where float64 has them. Every record keeps what onnxruntime alone said in
    "passed_against_onnxruntime"."""
    by_step = {v.step: v for v in verdicts}
    everything_sound = all(v.sound for v in verdicts)
    explained = [v for v in verdicts if v.explains_specials]
    return dataclasses.replace(result, arbitrated=True, records=[
        _arbitrated(record, by_step.get(record["step"]), everything_sound, explained) for record in result.records])


def _arbitrated(record: dict[str, Any], verdict: StepVerdict | None, everything_sound: bool,
                explained: list[StepVerdict]) -> dict[str, Any]:
    """One comparison's record with float64's figures, passed where every step is sound and it failed
    by size alone, or by NaN and Inf that a step put where float64 has them."""
    record = {**record, "passed_against_onnxruntime": record["passed"]}
    closeness = None if verdict is None else verdict.closeness
    if closeness is not None:
        record["float64_max_abs_opplugin"] = closeness.max_abs["opplugin"]
        record["float64_max_abs_onnxruntime"] = closeness.max_abs["onnxruntime"]
    if record["passed"] or not everything_sound or record.get("error"):
        return record
    specials_differ = not _same_specials(record)
    if specials_differ and not explained:
        return record
    record["passed"] = True
    if specials_differ and verdict is not None and verdict.explains_specials:
        record["arbitration"] = "NaN and Inf where float64 has them, not where onnxruntime does (why: with the steps below)"
    elif specials_differ:
        record["arbitration"] = f"NaN and Inf carried in from {', '.join(v.step for v in explained)}, where float64 has them"
    elif closeness is not None:
        record["arbitration"] = (f"float64 on the same inputs: opplugin's rel L2 error {closeness.rel_l2['opplugin']:.2e} "
                                 f"(max abs {closeness.max_abs['opplugin']:.2e}), onnxruntime's {closeness.rel_l2['onnxruntime']:.2e} "
                                 f"({closeness.max_abs['onnxruntime']:.2e})" + ("" if closeness.within_tolerance else
                                 ", no further over the whole tensor"))
    else:
        record["arbitration"] = "float32 rounding carried in: every plugin step alone matches onnxruntime or float64"
    return record


def _same_specials(record: dict[str, Any]) -> bool:
    """NaN and Inf in the same places on both sides (as many, in a record made before it said where)."""
    if "same_specials" in record:
        return bool(record["same_specials"])
    return record.get("nan_ours", 0) == record.get("nan_onnxruntime", 0) and record.get("inf_ours", 0) == record.get("inf_onnxruntime", 0)


def verdicts_as_json(verdicts: list[StepVerdict], images: int) -> dict[str, Any]:
    """The first bad node and each step's own figures, as `check --json` carries them."""
    bad = first_bad(verdicts)

    def step(v: StepVerdict) -> dict[str, Any]:
        own = None if v.own is None else {k: v.own.get(k) for k in ("passed", "max_abs_error", "max_rel_error", "rel_l2")}
        closeness = v.closeness
        return {"step": v.step, "implementation": v.implementation, "own": own,
                "float64_max_abs": None if closeness is None else dict(closeness.max_abs),
                "float64": None if closeness is None else closeness.as_json(),
                "acquitted_by_float64": None if closeness is None else closeness.acquits,
                "nan_inf_differ_because": v.specials_reason, "sound": v.sound, "note": v.note}

    return {"images": images, "first_bad_node": None if bad is None else step(bad), "steps": [step(v) for v in verdicts]}


def format_verdicts(verdicts: list[StepVerdict], images: int, result: CheckResult | None = None) -> str:
    """A line naming the first bad step (or saying the error comes from elsewhere), then one line per
    step. `result`: the arbitrated check, so that the first line never says no step is wrong
    beside a comparison that still fails without saying why."""
    bad = first_bad(verdicts)
    still_failing = [] if result is None else [r for r in result.records if not r["passed"]]
    if bad is not None:
        own = bad.own.get("max_abs_error")
        if own is None:
            figure = f"it fails alone ({bad.own.get('error')})"
        elif not bad.own.get("same_specials", True):
            figure = "its own NaN and Inf differ from onnxruntime's"
        else:
            figure = f"its own max abs error is {own:.2e}"
        head = f"First bad node: {bad.step} ({bad.implementation}): {figure} on onnxruntime's inputs ({images} images), so the error starts there"
    elif still_failing and all(v.sound for v in verdicts):
        head = (f"Every plugin step is sound alone, yet {len(still_failing)} comparison{'s' if len(still_failing) > 1 else ''} "
                f"still fail{'' if len(still_failing) > 1 else 's'}: NaN or Inf out of place, or a shape, that no step's own "
                f"error explains")
    elif any(v.closer_to_exact for v in verdicts):
        head = ("No plugin step is wrong: where one differs from onnxruntime on the same inputs, float64 shows it "
                "within the tolerance of the exact result or no further from it than onnxruntime over the whole tensor")
    else:
        head = "No plugin step fails on onnxruntime's inputs: the error is carried in, or comes from an onnxruntime step"
    lines = [head]
    lines += [f"NaN and Inf differ from onnxruntime's at {v.step} as float64's do: {v.specials_reason}" for v in verdicts if v.explains_specials]
    lines.append("Each plugin step re-run alone on onnxruntime's inputs, beside its error in the chained run:")
    for v in verdicts:
        own = "not re-run: " + v.note if v.own is None else _own_text(v)
        chained = v.chained
        chain = "" if not chained or "max_abs_error" not in chained else \
            f"; chained {chained['max_abs_error']:.2e} {'pass' if chained.get('passed_against_onnxruntime', chained['passed']) else 'FAIL'}"
        carried = "  (carried in from upstream)" if v.own_passed and chained and not chained.get("passed_against_onnxruntime", chained["passed"]) else ""
        lines.append(f"  {v.step}: {own}{chain}{carried}{_exact_text(v)}")
    return "\n".join(lines)


def _own_text(v: StepVerdict) -> str:
    if "max_abs_error" not in v.own:
        return f"own FAIL: {v.own.get('error')}"
    return f"own max abs {v.own['max_abs_error']:.2e} {'pass' if v.own_passed else 'FAIL'}"


def _exact_text(v: StepVerdict) -> str:
    if v.closeness is None:
        return f"; {v.note}" if v.own is not None and v.note else ""
    c = v.closeness
    return f"; vs float64: opplugin {c.max_abs['opplugin']:.2e}, onnxruntime {c.max_abs['onnxruntime']:.2e} ({c.why()})"
