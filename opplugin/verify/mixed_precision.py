"""Mixed precision by budget: `check --precision mixed --budget rel_l2=1e-3` (or `top1=0.99`) finds which nodes
must stay in FP32 for a model run in FP16 to keep within the budget against float64, and says why each; `run` and
`plan --precision mixed` keep the steps that compute them in FP32 (MixedPlan.keep_fp32, plan/precision.py).

On the emulation of precision_cost.py, where each node's own FP16 error can be told apart. The nodes are ranked by
their own FP16 error (each alone on the exact inputs); the first k of that ranking run in FP32, the rest in FP16,
and a binary search over k finds the fewest that meet the budget: a greedy choice along the ranking, not a search
over every assignment, and "fewest nodes" stands in for "fastest" until there are kernels to time. Where FP16
throughout meets the budget, nothing is kept. A run's search holds the nodes it has no FP16 kernel for in FP32 in
every pass (`in_fp32_anyway`), so that it chooses only among the nodes the run lowers. The outputs keep the
model's dtype.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import numpy as np
import onnx

from ..core.texttable import elide_middle
from ..errors import InputError
from ..plan.precision import MIXED_LOW
from ..registry import node_name
from .precision_cost import UNIT_ROUNDOFF, Emulation, output_error, own_error

SCHEMA = "opplugin-mixed-precision/1"
LOW = MIXED_LOW  # the precision every node takes unless the budget keeps it in FP32
KINDS = ("rel_l2", "top1")
LISTED = 20  # kept nodes the text names one by one


@dataclass(frozen=True)
class Budget:
    """What the model's outputs must meet against float64: a relative L2 error at most `value` (rel_l2), or
    a top-1 agreement at least `value` (top1, classifier outputs)."""

    kind: str
    value: float

    @classmethod
    def parse(cls, text: str) -> "Budget":
        kind, _, value = text.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if kind not in KINDS or not np.isfinite(number) or number <= 0 or (kind == "top1" and number > 1):
            raise InputError(f"--budget {text}: rel_l2=E (a relative L2 error above 0) or top1=A (an agreement in (0, 1])")
        return cls(kind, number)

    def met(self, outputs: dict[str, dict[str, Any]]) -> bool:
        if self.kind == "rel_l2":
            return all(error["rel_l2"] <= self.value and not error["nonfinite"] for error in outputs.values())
        return all(error["top1_agreement"] >= self.value for error in outputs.values() if error["top1_agreement"] is not None)

    def __str__(self) -> str:
        return f"relative L2 error <= {self.value:g}" if self.kind == "rel_l2" else f"top-1 agreement >= {self.value:g}"

    def as_flag(self) -> str:
        """The budget as --budget takes it: "rel_l2=0.001"."""
        return f"{self.kind}={self.value:g}"


@dataclass
class Kept:
    name: str
    op: str
    own: float  # its own FP16 error: why it stays in FP32

    def why(self) -> str:
        """Why the node stays FP32, in words: its own FP16 error against FP16's rounding."""
        if not np.isfinite(self.own):
            return f"{self.name} ({self.op}) overflows FP16 alone"
        return f"{self.name} ({self.op}) errs {self.own:.1e} alone in FP16, {self.own / UNIT_ROUNDOFF[LOW]:.1f}x its rounding"


@dataclass
class MixedPlan:
    model: str
    batch: int
    budget: Budget
    low_outputs: dict[str, dict[str, Any]]  # every node in FP16
    outputs: dict[str, dict[str, Any]]  # with `kept` in FP32
    kept: list[Kept] = field(default_factory=list)
    nodes: int = 0  # the nodes the search chooses among
    passes: int = 0
    met: bool = True
    in_fp32_anyway: int = 0  # nodes that compute numbers in FP32 in every pass: the run has no FP16 kernel for them

    def keep_fp32(self) -> dict[str, str]:
        """The kept nodes as Runner's keep_fp32 takes them: node name -> why it stays FP32."""
        return {k.name: k.why() for k in self.kept}

    def as_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "emulated": True, "model": self.model, "batch": self.batch, "low": LOW,
                "budget": {"kind": self.budget.kind, "value": self.budget.value}, "met": self.met, "nodes": self.nodes,
                "in_fp32_anyway": self.in_fp32_anyway,
                "passes": self.passes, "outputs_all_low": self.low_outputs, "outputs": self.outputs, "kept_in_fp32": [vars(k) for k in self.kept]}


def plan_mixed(model: onnx.ModelProto, feeds: dict[str, np.ndarray], budget: Budget, name: str = "model",
               progress: Callable[[str, int, int], None] | None = None, in_fp32_anyway: Collection[str] = ()) -> MixedPlan:
    """`in_fp32_anyway`: names of nodes that stay FP32 in every pass (a run's steps without an FP16 kernel,
    plan/precision.nodes_in_fp32_anyway), so that "FP16" means what the run would lower, and a budget that the
    run's own FP16 meets keeps nothing."""
    emulation = Emulation(model, feeds, progress)
    if budget.kind == "top1" and not any(np.asarray(emulation.exact[o]).ndim == 2 for o in emulation.outputs):
        raise InputError("--budget top1=...: the model has no (images, classes) output to agree on; give rel_l2=... instead")
    alone = emulation.own(LOW)
    own = {index: max((own_error(alone[index][o], emulation.exact[o]) for o in emulation.float_outputs(index)), default=0.0)
           for index in range(len(emulation.body))}
    anyway = set(in_fp32_anyway)
    fixed = {i for i, node in enumerate(emulation.body) if node_name(node) in anyway and emulation.float_outputs(i)}
    # the nodes that compute numbers and may run in FP16, dearest first (a node of shapes or indices has no precision to choose)
    order = sorted((i for i in own if emulation.float_outputs(i) and i not in fixed), key=lambda i: (-own[i], i))
    passes = 0

    def errors_keeping(count: int) -> dict[str, dict[str, Any]]:
        nonlocal passes
        passes += 1
        kept = set(order[:count]) | fixed
        values = emulation.run(lambda index: "fp32" if index in kept else LOW, f"{count} in FP32")
        return {o: output_error(values[o], emulation.exact[o]) for o in emulation.outputs}

    low = errors_keeping(0)
    chosen, errors, met = 0, low, budget.met(low)
    if not met:
        errors = errors_keeping(len(order))
        met = budget.met(errors)  # FP32 throughout misses it too: a budget below FP32's own error
        lowest, highest = 0, len(order)  # meets at `highest`, misses at `lowest`
        while met and highest - lowest > 1:
            middle = (lowest + highest) // 2
            found = errors_keeping(middle)
            if budget.met(found):
                highest, errors = middle, found
            else:
                lowest = middle
        chosen = highest if met else len(order)
    batch = int(next(iter(feeds.values())).shape[0]) if feeds else 0
    kept = [Kept(node_name(emulation.body[i]), emulation.body[i].op_type, own[i]) for i in order[:chosen]]
    return MixedPlan(name, batch, budget, low, errors, kept, len(order), passes, met, len(fixed))


def format_text(plan: MixedPlan) -> str:
    lines = [f"Mixed precision for {plan.model} on {plan.batch} images: FP16 wherever the outputs keep within the budget",
             f"({plan.budget} against float64), FP32 elsewhere. Emulated, so that each node's own share shows:",
             "an FP16 node rounds every float tensor it reads and writes, and computes in FP32.", "",
             f"Every node in FP16: {errors_text(plan.low_outputs)}." if not plan.in_fp32_anyway else
             f"Every node the run can lower in FP16, {plan.in_fp32_anyway} more in FP32 (the run has no FP16 kernel for them): "
             f"{errors_text(plan.low_outputs)}."]
    if not plan.met:
        lines.append(f"No assignment meets the budget: FP32 throughout gives {errors_text(plan.outputs)}.")
    elif not plan.kept:
        lines.append("That meets the budget: no node needs FP32.")
    else:
        lines += [f"Kept in FP32: {len(plan.kept)} of {plan.nodes} nodes, the dearest by their own FP16 error (found in "
                  f"{plan.passes} passes); then {errors_text(plan.outputs)}.",
                  f"{'node':40}  {'op':20}  own FP16 error (FP16's rounding is {UNIT_ROUNDOFF[LOW]:.1e})"]
        lines += [f"{elide_middle(k.name, 40):40}  {k.op:20}  {k.own:.2e} ({k.own / UNIT_ROUNDOFF[LOW]:.1f}x)" for k in plan.kept[:LISTED]]
        rest = plan.kept[LISTED:]
        if rest:
            by_op = Counter(k.op for k in rest)
            lines.append(f"... and {len(rest)} more ({', '.join(f'{count} {op}' for op, count in by_op.most_common())}; all in --json)")
    return "\n".join(lines) + "\n"


def errors_text(outputs: dict[str, dict[str, Any]]) -> str:
    """The outputs' errors against float64 in one line: relative L2, top-1 agreement, values not finite."""
    parts = []
    for name, error in outputs.items():
        top1 = "" if error["top1_agreement"] is None else f", top-1 {error['top1_agreement']:.4f}"
        overflow = f", {error['nonfinite']} not finite" if error["nonfinite"] else ""
        parts.append(f"{name} relative L2 {error['rel_l2']:.2e}{top1}{overflow}")
    return "; ".join(parts)
