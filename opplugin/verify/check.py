"""Correctness against onnxruntime: the swapped model vs. onnxruntime's CPU
provider on the same inputs, per plugin step and on the final outputs.

Intermediate tensors come from onnxruntime by listing them as extra graph
outputs of the original model, so every plugin step is compared with exactly
what onnxruntime computes for that node.

A large batch is checked in slices ("check chunks") sized from a host-memory
budget: each slice goes through our runner and through one onnxruntime session,
is compared, and is dropped; running figures (ErrorStats) fold the slices
together so that the final figures are those of one pass over the whole batch.
These slices bound host memory and onnxruntime's batch; the runner still cuts
each of them into its own chunks for device memory.

This module reads the runtime's plain records (PlanRecord, RunResult) and is
handed the runner's `run` as a function; it never holds a runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..core.number_formats import FP32, UNIT_ROUNDOFF
from ..report.jsonout import header
from ..core.row_ranges import split_rows
from ..runtime.records import PlanRecord, RunResult
from .references import reference_for
from ..core.texttable import LINE_WIDTH, NAME_WIDTH, elide_middle, text_table

# runner.run: (feeds, keep) -> RunResult
RunFunction = Callable[..., RunResult]

# The rule every element of a compared tensor meets to pass (a: ours, b: onnxruntime's).
PASS_RULE = "|a - b| <= atol * s + rtol * |b|"
SCALE_RULE = "s = max(1, RMS of b over its image)"
# ErrorStats.specials: NaN and Inf counts on each side of a comparison (keys of check's records too)
SPECIAL_COUNT_KEYS = ("nan_ours", "nan_onnxruntime", "inf_ours", "inf_onnxruntime")

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
# A run in a reduced precision (run --precision) is held, unless --atol or --rtol say otherwise, to a rule this
# many units of its format's roundoff wide, as atol and rtol alike: ViT-S in FP16 at batch 32 measured 1.2e-3
# at its worst element, a sixth of FP16's 7.8e-3; a kernel that is wrong is off by far more
REDUCED_TOLERANCE_UNITS = 16
# Host memory one check chunk may take (see check_image_bytes): our kept tensors and
# outputs, onnxruntime's, and onnxruntime's working set while it runs the chunk.
DEFAULT_CHECK_BYTES = 1 << 30
# ErrorStats remembers at most this many rows (images) holding a mismatch.
MAX_BAD_ROWS = 64
# ErrorStats compares at most this many elements at a time, so its float64
# temporaries stay small whatever the size of the arrays it is given.
COMPARE_BLOCK_ELEMENTS = 1 << 22


def default_tolerance(precision: str = FP32) -> tuple[float, float]:
    """(atol, rtol): the pass rule a run in `precision` is held to by default (FP32's, or
    REDUCED_TOLERANCE_UNITS of a reduced format's roundoff)."""
    if precision == FP32:
        return DEFAULT_ATOL, DEFAULT_RTOL
    width = REDUCED_TOLERANCE_UNITS * UNIT_ROUNDOFF[precision]
    return width, width


def _max(running: float | None, value: float) -> float:
    """The larger of the two; NaN wins, as it does in a single ndarray.max()."""
    return value if running is None else float(np.maximum(running, value))


def _image_scale(expected: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """max(1, RMS of the finite values) per row of the first axis, shaped to broadcast over `expected`."""
    if expected.ndim == 0:
        return np.asarray(max(1.0, abs(float(expected))) if finite else 1.0)
    if expected.size == 0:
        return np.ones((expected.shape[0], *([1] * (expected.ndim - 1))))
    rows = expected.reshape(expected.shape[0], -1)
    squares = np.where(finite.reshape(rows.shape), rows * rows, 0.0)
    rms = np.sqrt(squares.sum(axis=1) / max(1, rows.shape[1]))
    return np.maximum(1.0, rms).reshape(-1, *([1] * (expected.ndim - 1)))


class ErrorStats:
    """Error figures of `actual` against `expected`, fed piece by piece (say the chunks of a
    batch), whose result() equals compare() on the pieces joined along the first axis:
    maxima and counts exactly, rel L2 up to the rounding of its sums of squares.

    Passing means every element is within atol * s + rtol * |expected|, and NaN/Inf sit exactly
    where onnxruntime has them. s is the RMS of onnxruntime's finite values in the element's
    image (its row of the first axis), at least 1: a float32 sum's absolute error follows
    the size of its terms, not of its result, so an element near 0 in a tensor of large
    values (deep in a ResNet-50 with random weights, say) is held to the tensor's scale.
    Per image, so that chunking the batch changes nothing. The relative error is taken
    over elements with |expected| > atol, where it means something."""

    def __init__(self, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL):
        self.atol, self.rtol = atol, rtol
        self.error: str | None = None
        self.elements = 0
        self.mismatches = 0  # finite elements out of tolerance
        self.same_specials = True  # NaN and +-Inf where onnxruntime has them, so far
        self.actual_finite = True  # ours finite wherever onnxruntime's is
        self.within = True  # every finite element within tolerance (a NaN difference is not)
        self.max_abs: float | None = None
        self.max_rel: float | None = None
        self.diff_squares = 0.0
        self.expected_squares = 0.0
        # NaN and +-Inf on each side, counted so that the report can say where they are
        self.specials = dict.fromkeys(SPECIAL_COUNT_KEYS, 0)
        self.rows = 0  # rows of the first axis seen so far, over every piece
        self.bad_rows: list[int] = []  # the first MAX_BAD_ROWS rows with an element out of tolerance

    def add(self, actual: np.ndarray, expected: np.ndarray) -> ErrorStats:
        if self.error is not None:
            return self
        if actual.shape != expected.shape:
            self.error = f"shape {list(actual.shape)} differs from onnxruntime's {list(expected.shape)}"
            return self
        if actual.ndim == 0 or actual.size <= COMPARE_BLOCK_ELEMENTS:
            self._add_block(actual, expected, self.rows)
        else:
            rows = max(1, COMPARE_BLOCK_ELEMENTS // max(1, actual.size // actual.shape[0]))
            for start in range(0, actual.shape[0], rows):
                self._add_block(actual[start:start + rows], expected[start:start + rows], self.rows + start)
        self.rows += actual.shape[0] if actual.ndim else 1
        return self

    def _add_block(self, actual: np.ndarray, expected: np.ndarray, first_row: int) -> None:
        a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
        nan_a, nan_e = np.isnan(a), np.isnan(e)
        finite = np.isfinite(e)
        infinite = ~finite & ~nan_e
        self._count_specials(nan_a, a, nan_e, infinite)
        self.same_specials &= bool(np.array_equal(nan_a, nan_e) and np.array_equal(a[infinite], e[infinite]))
        scale = np.broadcast_to(_image_scale(e, finite), e.shape)
        if finite.all():  # the usual case: no copies through a mask
            a, e, scale = a.ravel(), e.ravel(), scale.ravel()
        else:
            a, e, scale = a[finite], e[finite], scale[finite]
        diff = np.abs(a - e)
        ref = np.abs(e)
        tolerance = self.atol * scale + self.rtol * ref
        self.actual_finite &= bool(np.all(np.isfinite(a)))
        over = diff > tolerance
        self.within &= not bool(over.any())
        self.mismatches += int(np.count_nonzero(over))
        if over.any() and len(self.bad_rows) < MAX_BAD_ROWS:
            self._note_bad_rows(over, finite, expected.shape, first_row)
        if diff.size:
            self.max_abs = _max(self.max_abs, float(diff.max()))
        meaningful = ref > self.atol
        if meaningful.any():
            self.max_rel = _max(self.max_rel, float((diff[meaningful] / ref[meaningful]).max()))
        self.diff_squares += float(diff.dot(diff))
        self.expected_squares += float(e.dot(e))
        self.elements += int(expected.size)

    def _note_bad_rows(self, over: np.ndarray, finite: np.ndarray, shape: tuple[int, ...], first_row: int) -> None:
        """Remember which rows (images) hold elements out of tolerance, so that first_bad.py
        re-runs the steps on images where they fail."""
        if not shape:
            rows = [first_row]
        else:
            full = over if over.size == finite.size else np.zeros(shape, bool)
            if full is not over:
                full[finite] = over
            rows = [first_row + int(r) for r in np.flatnonzero(full.reshape(shape[0], -1).any(axis=1))]
        self.bad_rows += rows[:MAX_BAD_ROWS - len(self.bad_rows)]

    def _count_specials(self, nan_a: np.ndarray, a: np.ndarray, nan_e: np.ndarray, inf_e: np.ndarray) -> None:
        self.specials["nan_ours"] += int(np.count_nonzero(nan_a))
        self.specials["nan_onnxruntime"] += int(np.count_nonzero(nan_e))
        self.specials["inf_ours"] += int(np.count_nonzero(np.isinf(a)))
        self.specials["inf_onnxruntime"] += int(np.count_nonzero(inf_e))

    @property
    def passed(self) -> bool:
        return self.error is None and self.same_specials and self.actual_finite and self.within

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            return {"passed": False, "error": self.error}
        norm, diff_norm = float(np.sqrt(self.expected_squares)), float(np.sqrt(self.diff_squares))
        return {
            "passed": self.passed,
            "max_abs_error": 0.0 if self.max_abs is None else self.max_abs,
            "max_rel_error": 0.0 if self.max_rel is None else self.max_rel,
            "rel_l2": diff_norm / norm if norm > 0 else diff_norm,
            # NaN/Inf in the wrong places count once, however many there are
            "mismatches": self.mismatches + (0 if self.same_specials else 1),
            "same_specials": self.same_specials,  # NaN and +-Inf in the same places, not only as many
            "elements": self.elements,
        }


def compare(actual: np.ndarray, expected: np.ndarray, atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> dict[str, Any]:
    """Error figures of `actual` against `expected` in one go (see ErrorStats)."""
    return ErrorStats(atol, rtol).add(actual, expected).result()


@dataclass
class CheckResult:
    """What `check` found: one record per compared tensor (its step, implementation, error
    figures, NaN/Inf counts, pass or fail), top-1 agreement and accuracy where the output is
    a classifier's, and the passes it was compared in."""

    records: list[dict[str, Any]] = field(default_factory=list)
    top1_agreement: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    chunks: int = 1  # check chunks the batch was compared in
    chunk_size: int = 0  # images in the largest of them
    bad_rows: list[int] = field(default_factory=list)  # rows (images) where some comparison fails, the first MAX_BAD_ROWS
    arbitrated: bool = False  # whether failing comparisons were judged against float64 (first_bad.arbitrate)
    uncompared: list[str] = field(default_factory=list)  # steps' outputs the original graph lacks (uncompared_tensors)

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.records)


def top1(probabilities: np.ndarray, images: int) -> np.ndarray | None:
    """Predicted classes when the output is a classifier's, (images, classes) with more than one
    class, else None: top-1 of any other tensor would be a figure with no meaning."""
    if probabilities.ndim != 2 or probabilities.shape[0] != images or probabilities.shape[1] < 2:
        return None
    return probabilities.argmax(axis=1)


class Top1Tally:
    """Counts of top-1 agreement with onnxruntime and of correct labels, chunk by chunk."""

    def __init__(self) -> None:
        self.images = self.agree = self.correct = self.reference_correct = 0
        self.classifier = True
        self.labelled = True

    def add(self, ours: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, images: int) -> None:
        ours_top1, ref_top1 = top1(ours, images), top1(reference, images)
        if ours_top1 is None:
            self.classifier = False
            return
        self.images += len(ours_top1)
        self.agree += int(np.count_nonzero(ours_top1 == ref_top1)) if ref_top1 is not None else 0
        if labels is None:
            self.labelled = False
            return
        self.correct += int(np.count_nonzero(ours_top1 == labels))
        self.reference_correct += int(np.count_nonzero(ref_top1 == labels)) if ref_top1 is not None else 0

    @property
    def agreement(self) -> float | None:
        """The share of images whose top-1 matches onnxruntime's; None for an output that is no classifier's."""
        return self.agree / self.images if self.classifier and self.images else None

    def figures(self) -> dict[str, float | None]:
        """CheckResult's top-1 fields: agreement, then the accuracy of both sides where there were labels."""
        labelled = self.agreement is not None and self.labelled
        return {"top1_agreement": self.agreement,
                "accuracy": self.correct / self.images if labelled else None,
                "reference_accuracy": self.reference_correct / self.images if labelled else None}


def kept_tensors(plan: PlanRecord) -> tuple[str, ...]:
    """The plugin steps' outputs that are not graph outputs and that the original graph has (or a
    recorded view of it gives): what check asks the runner to keep and compares."""
    outputs, comparable = set(plan.model.outputs), comparable_tensors(plan.model)
    return tuple(name for step in plan.plugin_steps for name in step.outputs if name not in outputs and name in comparable)


def comparable_tensors(model) -> set[str]:
    """What onnxruntime can give for `model` as loaded (a Model, or a plan record's): its tensors,
    and Simplification.views."""
    original = model.original.graph
    return {o for n in original.node for o in n.output} | {i.name for i in original.input} | set(model.simplification.views)


def uncompared_tensors(plan: PlanRecord) -> list[str]:
    """Plugin steps' outputs that simplification made and the original graph lacks (a helper tensor
    of a rewrite): no onnxruntime tensor to compare with; the steps that read them are compared."""
    comparable = comparable_tensors(plan.model)
    return [name for step in plan.plugin_steps for name in step.outputs if name not in comparable]


def onnxruntime_image_bytes(plan: PlanRecord) -> int:
    """Host bytes one image costs onnxruntime while it runs the whole model on a chunk. We
    count every tensor of the graph as if none shared memory (inputs are views of the
    caller's arrays): the planner of either side reuses buffers, so this bounds both.
    (Measured on lenet86, onnxruntime's blocked-channel layouts take about a quarter more
    than the bound.)"""
    layout = plan.layout
    inputs = {i.name for i in plan.model.inputs}
    working = sum(layout.image_bytes(name) for name in layout.sample_shapes if name not in inputs)
    return max(1, working, plan.peak_image_bytes)


def check_image_bytes(plan: PlanRecord) -> int:
    """Host bytes one image costs a check chunk: its slice of every compared tensor, held twice
    (ours and onnxruntime's), plus onnxruntime's working set while it runs the chunk."""
    compared = [*kept_tensors(plan), *plan.model.outputs]
    held = sum(plan.layout.image_bytes(name) for name in compared)
    return 2 * held + onnxruntime_image_bytes(plan)


def check_chunks(plan: PlanRecord, batch: int, budget_bytes: int = DEFAULT_CHECK_BYTES, chunk: int | None = None) -> list[slice]:
    """The row ranges a check of `batch` images compares one at a time: `chunk` images each,
    or as many as `budget_bytes` of host memory holds (at least one). A model that cannot be
    chunked is checked in one piece."""
    if not plan.layout.chunkable:
        return [slice(0, batch)]
    if chunk is None:
        chunk = max(1, int(budget_bytes) // check_image_bytes(plan))
        if chunk >= plan.chunk:  # whole device chunks, the size the kernels were picked for
            chunk -= chunk % plan.chunk
    return split_rows(batch, min(int(chunk), batch))


def _batched(plan: PlanRecord) -> frozenset[str]:
    """The inputs a check chunk takes a slice of (none when the model runs in one piece)."""
    return plan.layout.batched_inputs if plan.layout.chunkable else frozenset()


def _rows_of(plan: PlanRecord, feeds: dict[str, np.ndarray]) -> int:
    """The batch of `feeds`, which must be the plan's."""
    if not isinstance(feeds, dict):
        raise InputError(f"feeds must be a dict of input name to numpy array, got {type(feeds).__name__}")
    batched = [name for name in _batched(plan) if name in feeds]
    rows = len(feeds[batched[0]]) if batched else plan.batch
    if rows != plan.batch:
        raise InputError(f"the feeds hold {rows} images but the plan record is for batch {plan.batch}; "
                         f"take the runner's plan_record at the feeds' batch")
    return rows


def check(
    run: RunFunction,
    plan: PlanRecord,
    feeds: dict[str, np.ndarray],
    labels: np.ndarray | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    *,
    budget_bytes: int = DEFAULT_CHECK_BYTES,
    chunk: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> CheckResult:
    """Compare every plugin step's output and the model's outputs with onnxruntime's, in check
    chunks (see check_chunks) so that host memory stays near `budget_bytes` at any batch.
    `run` is the runner's run(feeds, keep=...) and `plan` its plan_record() at the feeds' batch.
    `progress(label, images_done, images)` is called after each chunk when there are several."""
    batch = _rows_of(plan, feeds)
    model = plan.model
    kept = kept_tensors(plan)
    rows_list = check_chunks(plan, batch, budget_bytes, chunk)
    batched = _batched(plan)
    reference = reference_for(model, kept, views=model.simplification.views)  # the graph as loaded, before simplification

    compared = set(kept) | set(model.outputs)
    stats = {(step.name, name): ErrorStats(atol, rtol) for step in plan.plugin_steps for name in step.outputs if name in compared}
    output_stats = {name: ErrorStats(atol, rtol) for name in model.outputs}
    tally = Top1Tally()
    for rows in rows_list:
        piece = {name: (value[rows] if name in batched else value) for name, value in feeds.items()}
        ours = run(piece, keep=kept)
        theirs = reference(piece)
        for (step_name, name), figures in stats.items():
            figures.add(ours.kept.get(name, ours.outputs.get(name)), theirs[name])
        for name, figures in output_stats.items():
            figures.add(ours.outputs[name], theirs[name])
        first = model.outputs[0]
        tally.add(ours.outputs[first], theirs[first], None if labels is None else labels[rows], rows.stop - rows.start)
        del ours, theirs, piece  # free this chunk's tensors before the next one is made
        if progress and len(rows_list) > 1:
            progress("check", rows.stop, batch)

    every = [*stats.values(), *output_stats.values()]
    implementations = {step.name: step.implementation for step in plan.steps}
    records = [{"tensor": name, "step": step_name, "implementation": implementations[step_name]} | figures.result() | figures.specials
               for (step_name, name), figures in stats.items()]
    records += [{"tensor": name, "step": "model output", "implementation": "whole model"} | figures.result() | figures.specials
                for name, figures in output_stats.items()]
    return CheckResult(records, **tally.figures(), chunks=len(rows_list), chunk_size=max(r.stop - r.start for r in rows_list),
                       bad_rows=sorted({row for figures in every for row in figures.bad_rows})[:MAX_BAD_ROWS],
                       uncompared=uncompared_tensors(plan))


# Host memory onnxruntime may use at a time while `agreement` runs the model on slices
# of the batch, so that comparing a run of 200,000 images needs little beyond its outputs.
AGREEMENT_BYTES = 256 << 20


def agreement(plan: PlanRecord, feeds: dict[str, np.ndarray], output: np.ndarray,
              atol: float = DEFAULT_ATOL, rtol: float = DEFAULT_RTOL) -> dict[str, Any]:
    """How a run's first graph output agrees with onnxruntime's on the same feeds:
    compare()'s figures plus "top1_agreement" (None when the output is no classifier's)."""
    model, batched = plan.model, _batched(plan)
    batch = _rows_of(plan, feeds)
    reference = reference_for(model)
    first = model.outputs[0]
    figures, tally = ErrorStats(atol, rtol), Top1Tally()
    rows_at_once = max(1, AGREEMENT_BYTES // onnxruntime_image_bytes(plan))
    slices = split_rows(batch, rows_at_once) if batched else [slice(0, batch)]
    for rows in slices:
        piece = {name: (value[rows] if name in batched else value) for name, value in feeds.items()}
        ours = output[rows] if batched else output
        theirs = reference(piece)[first]
        figures.add(ours, theirs)
        tally.add(ours, theirs, None, rows.stop - rows.start)
    return figures.result() | {"top1_agreement": tally.agreement}




def format_check(result: CheckResult, atol: float, rtol: float, wide: bool = False) -> str:
    """The comparison as text: a row per compared tensor, NaN/Inf counts where there are any,
    the pass rule, top-1 and accuracy where the output is a classifier's, and the verdict.
    Unless `wide`, long names are cut in the middle to keep lines near LINE_WIDTH."""
    rows = []
    for r in result.records:
        if "error" in r:  # nothing to measure: the tensors do not even line up
            rows.append([r["tensor"], r["step"], r["implementation"], "-", "-", "-", f"FAIL: {r['error']}"])
            continue
        errors = [f"{r[key]:.2e}" for key in ("max_abs_error", "max_rel_error", "rel_l2")]
        verdict = ("pass*" if r.get("arbitration") else "pass") if r["passed"] else "FAIL"
        rows.append([r["tensor"], r["step"], r["implementation"], *errors, verdict])
    header = ["tensor", "step", "implementation", "max abs", "max rel", "rel L2", "result"]
    lines = text_table(header, rows, right=(3, 4, 5), width=None if wide else LINE_WIDTH)
    lines += _special_lines(result.records, None if wide else NAME_WIDTH)
    lines += _arbitration_lines(result.records, None if wide else NAME_WIDTH)
    lines += ["", f"Pass rule: every element meets {PASS_RULE}, {SCALE_RULE} (a: opplugin, b: onnxruntime),",
              "and NaN and Inf sit where onnxruntime has them;",
              "max rel is the largest |a - b| / |b| where |b| > atol, so it may exceed rtol where atol * s covers the difference."]
    if result.uncompared:
        names = ", ".join(elide_middle(name, None if wide else NAME_WIDTH) for name in result.uncompared)
        lines.append(f"Not compared: {len(result.uncompared)} tensor{'s' if len(result.uncompared) > 1 else ''} made at load "
                     f"that the original graph lacks ({names}); the steps that read them are compared.")
    if result.top1_agreement is not None:
        lines.append(f"Top-1 agreement with onnxruntime: {result.top1_agreement:.4f}")
    if result.accuracy is not None:
        lines.append(f"Test Accuracy: {result.accuracy:.4f}  (onnxruntime alone: {result.reference_accuracy:.4f})")
    verdict = "PASS" if result.passed else "FAIL"
    arbitrated = sum(1 for r in result.records if r.get("arbitration"))
    judged = f", {arbitrated} comparison{'s' if arbitrated > 1 else ''} passed by float64 arbitration (*)" if arbitrated else ""
    lines.append(f"{verdict} at atol {atol:g}, rtol {rtol:g}{judged}")
    return "\n".join(lines)


def _arbitration_lines(records: list[dict[str, Any]], name_width: int | None) -> list[str]:
    """A line per comparison passed by float64 arbitration (first_bad.arbitrate), saying why."""
    lines = [f"{elide_middle(r['tensor'], name_width)} ({elide_middle(r['step'], name_width)}): {r['arbitration']}"
             for r in records if r.get("arbitration")]
    if not lines:
        return []
    head = ("* beyond the tolerance of onnxruntime, but every plugin step, re-run alone on onnxruntime's inputs, is within "
            "it, or within it of the float64 result, or no further from that than onnxruntime over the whole tensor: "
            "not a wrong kernel:")
    return ["", head, *("  " + line for line in lines)]


def _special_lines(records: list[dict[str, Any]], name_width: int | None) -> list[str]:
    """A line per compared tensor where either side holds NaN or Inf, with the counts."""
    lines = []
    for r in records:
        if not any(r.get(key) for key in SPECIAL_COUNT_KEYS):
            continue
        lines.append(f"{elide_middle(r['tensor'], name_width)} ({elide_middle(r['step'], name_width)}): "
                     f"NaN {r['nan_ours']:,} ours, {r['nan_onnxruntime']:,} onnxruntime's; "
                     f"Inf {r['inf_ours']:,} ours, {r['inf_onnxruntime']:,} onnxruntime's")
    return ["", "NaN and Inf:", *("  " + line for line in lines)] if lines else []


# --- the JSON of `check --json` ----------------------------------------------------------

CHECK_SCHEMA = "opplugin-check/1"
# every comparison record carries these keys; those with no value are null ("error"
# when the tensors could be compared, the figures when they could not)
CHECK_RECORD_KEYS = ("tensor", "step", "implementation", "passed", "error", "max_abs_error", "max_rel_error", "rel_l2",
                     "mismatches", "elements", *SPECIAL_COUNT_KEYS,
                     # float64 arbitration (first_bad.py), where the check failed against onnxruntime
                     "passed_against_onnxruntime", "float64_max_abs_opplugin", "float64_max_abs_onnxruntime", "arbitration")


def build_check_report(result: CheckResult, plan: PlanRecord, atol: float, rtol: float,
                       data: str | None = None, steps_alone: dict[str, Any] | None = None) -> dict[str, Any]:
    """The comparison as plain data for `check --json`: the shared header (report/jsonout.py), the
    tolerances, one record per compared tensor, and where the check failed against
    onnxruntime, each plugin step re-run alone with the first bad node
    (first_bad.verdicts_as_json; null when the check passed outright). `plan` is the record the check ran."""
    return header(CHECK_SCHEMA, plan.device, plan.model.name, plan.batch) | {
        "onnxruntime_provider": plan.onnxruntime_provider,
        "data": data,
        "atol": atol,
        "rtol": rtol,
        "passed": result.passed,
        "check_chunks": result.chunks,
        "check_chunk_size": result.chunk_size,
        "records": [dict.fromkeys(CHECK_RECORD_KEYS) | record for record in result.records],
        "top1_agreement": result.top1_agreement,
        "accuracy": result.accuracy,
        "reference_accuracy": result.reference_accuracy,
        "arbitrated_by_float64": result.arbitrated,
        "uncompared": result.uncompared,
        "steps_alone": steps_alone,
    }
