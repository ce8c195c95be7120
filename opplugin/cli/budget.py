"""`run` and `plan --precision mixed --budget rel_l2=E|top1=A`: which ONNX nodes stay FP32, found by check's search
(verify/mixed_precision.plan_mixed, on its CPU emulation against float64) on the first images of the run's own
inputs, and handed to the runner as keep_fp32. The search runs the model many times, so one line on stderr says
what it is doing before it starts."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Collection

import numpy as np

from ..errors import InputError
from ..verify import mixed_precision
from ..verify.mixed_precision import Budget, MixedPlan
from .progress import PassBars

# check --precision's images without --batch; a mixed run or plan measures at most these of its inputs, whatever its
# batch: every tensor is kept, in float64 and in FP16, for a pass per step of the search
PRECISION_IMAGES = 32


def first_images(feeds: dict[str, Any], images: int) -> dict[str, np.ndarray]:
    """The first `images` rows of every feed: the images a precision search measures."""
    return {name: np.asarray(value)[:images] for name, value in feeds.items()}


@dataclass(frozen=True)
class BudgetSearch:
    """What the search found for a run's budget: the nodes it keeps in FP32 and the emulated outputs."""

    budget: Budget
    found: MixedPlan

    @property
    def keep_fp32(self) -> dict[str, str]:
        return self.found.keep_fp32()

    def as_json(self) -> dict[str, Any]:
        found = self.found
        return {"flag": self.budget.as_flag(), "kind": self.budget.kind, "value": self.budget.value, "images": found.batch,
                "emulated": True, "nodes": found.nodes, "in_fp32_anyway": found.in_fp32_anyway, "passes": found.passes,
                "kept_in_fp32": [{"name": k.name, "op": k.op, "own_fp16_error": k.own, "why": k.why()} for k in found.kept],
                "outputs": found.outputs, "outputs_all_fp16": found.low_outputs}


def search_budget(model, feeds: dict[str, Any], budget: Budget, in_fp32_anyway: Collection[str] = ()) -> BudgetSearch:
    """The nodes `model` (a loaded Model) keeps in FP32 to meet `budget` on the first PRECISION_IMAGES rows of
    `feeds`, among those the run can lower (`in_fp32_anyway`: the rest, plan/precision.nodes_in_fp32_anyway); an
    InputError in one line where even FP32 throughout misses the budget."""
    measured = first_images(feeds, PRECISION_IMAGES)
    images = int(next(iter(measured.values())).shape[0]) if measured else 0
    print(f"Finding which nodes stay FP32 for budget {budget.as_flag()} on {images} images "
          "(FP16 emulated on the CPU against float64, a pass through the model per step of the search)", file=sys.stderr)
    bar = PassBars(sys.stderr, unit="nodes")
    try:
        found = mixed_precision.plan_mixed(model.original, measured, budget, model.name, bar, in_fp32_anyway)
    finally:
        bar.close()
    if not found.met:
        raise InputError(f"--budget {budget.as_flag()}: no assignment meets it on these {images} images, FP32 throughout "
                         f"gives {mixed_precision.errors_text(found.outputs)}; give a wider budget")
    return BudgetSearch(budget, found)
