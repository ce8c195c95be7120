"""Each step's precision under a run's --precision: the variant its kernel is built from, the precision that
kernel computes in, and, where a step stays FP32 under a reduced precision, why.

FP32 is the default and changes nothing: each step gets the --variant of its op type, else its plugin's own
choice. Under tf32, fp16 or bf16 the choice is per step, not per op type: each plugin step whose op has no
--variant asks its plugin for the variant that runs it in that precision (Plugin.precision_variant), and
keeps FP32 where the plugin has none (no such kernel for the op, or none for this shape or fusion). A plugin
may answer with a variant in another precision (a fused attention runs in TF32 under fp16 and bf16, which it
has no kernel for): the step records what its variant computes in (Plugin.variant_precision), and why. A
--variant for the op type wins over the precision. onnxruntime steps run in FP32 (TF32 off).

Under fp16 and bf16, tensors between steps that can keep them in the format channel-last stay so
(channel_last.py): those steps' variants say which. A step exact in any format (a pool, a LayerNorm over the
channels) that is linked so runs in the format of its tensors, and its precision says so.

mixed is FP16 but for the nodes a budget keeps in FP32 (`keep_fp32`: ONNX node name -> why, by the names in the
file; verify/mixed_precision.py finds them): a plugin step that computes one of them (kept_nodes.py) stays FP32
and says why; every other step is as under fp16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..core.number_formats import FP32, REDUCED
from ..errors import InputError, PluginError
from ..registry import PrecisionChoice
from .channel_last import with_links
from .kept_nodes import nodes_computed_only_by, steps_holding
from .partition import Plan, PluginStep

MIXED = "mixed"  # FP16, but for the nodes a budget keeps in FP32
MIXED_LOW = "fp16"  # what a mixed run's other steps compute in
UNIFORM_PRECISIONS = (FP32, *REDUCED)  # one precision for every step that has a kernel in it (bench --e2e takes these alone)
PRECISIONS = (*UNIFORM_PRECISIONS, MIXED)  # what a run takes
KEPT_BY_BUDGET = "kept in FP32 by the budget"
HELP = ("fp32 (default, exact) | tf32 | fp16 | bf16: run each step that has a kernel in that precision in it (the weights "
        "converted once at build, inputs and outputs in the model's dtype, sums in FP32); every other step stays FP32, "
        "and `plan --precision` says which and why; mixed (with --budget): fp16, but for the steps whose nodes the "
        "budget keeps in FP32")


@dataclass(frozen=True)
class StepPrecision:
    """How one step runs under the run's precision."""

    variant: str | None  # what its build is given: the op's --variant, else its plugin's variant for the precision, else None
    precision: str = FP32  # what its kernel computes its products in
    # under a reduced precision, why the step does not run in it (stays FP32, runs its --variant's, or its plugin's
    # variant in another precision); None where it does
    reason: str | None = None
    # under fp16 and bf16, the step's tensors (inputs and output) kept channel-last in the format (channel_last.py)
    channel_last: tuple[str, ...] = ()


def checked_precision(precision: str, flag: str = "precision", taken: tuple[str, ...] = PRECISIONS) -> str:
    """`precision` when it is one of `taken` (a run takes PRECISIONS; a benchmark, which has no budget, all but
    mixed); an InputError in one line otherwise."""
    if precision not in taken:
        raise InputError(f"{flag} {precision!r}: one of {', '.join(taken)} (a step without a kernel in it stays fp32)")
    return precision


def checked_keep_fp32(precision: str, keep_fp32: Mapping[str, str] | None) -> dict[str, str] | None:
    """`keep_fp32` as a dict where `precision` is mixed, which needs one (empty: nothing kept), None elsewhere; an
    InputError in one line for a mixed run without it, or keep_fp32 under another precision."""
    if precision != MIXED:
        if keep_fp32 is not None:
            raise InputError(f"keep_fp32 names the nodes a precision 'mixed' run keeps in FP32; this run's precision is {precision!r}")
        return None
    if keep_fp32 is None:
        raise InputError("precision 'mixed' needs keep_fp32: ONNX node name -> why it stays FP32 "
                         "(verify.mixed_precision.plan_mixed(...).keep_fp32() finds them for a budget)")
    if not isinstance(keep_fp32, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keep_fp32.items()):
        raise InputError(f"keep_fp32 must map ONNX node names to why each stays FP32 (str -> str), got {type(keep_fp32).__name__}")
    return dict(keep_fp32)


def step_precisions(plan: Plan, precision: str = FP32, variants: Mapping[str, str] | None = None,
                    keep_fp32: Mapping[str, str] | None = None) -> dict[str, StepPrecision]:
    """Step name -> how it runs, for every step of `plan` under `precision`; `variants`: --variant by op key;
    `keep_fp32` (precision mixed): the ONNX nodes that stay FP32, each with why."""
    precision, variants = checked_precision(precision), variants or {}
    kept = _kept_reasons(plan, checked_keep_fp32(precision, keep_fp32) or {})
    computes = MIXED_LOW if precision == MIXED else precision
    chosen = {step.name: _step_precision(plan, step, computes, variants, kept.get(step.name)) if isinstance(step, PluginStep)
              else StepPrecision(None, FP32, None if precision == FP32 else "onnxruntime runs in fp32")
              for step in plan.steps}
    return chosen if precision == FP32 else with_links(plan, chosen, frozenset(kept))  # a step the budget keeps keeps FP32 tensors


def nodes_in_fp32_anyway(plan: Plan, variants: Mapping[str, str] | None = None) -> set[str]:
    """The nodes of the graph as loaded (by name) that a mixed run computes in FP32 whatever its budget keeps: every
    step computing them has no MIXED_LOW kernel (or is onnxruntime's). A budget's search holds them in FP32 in
    every pass, so that it chooses only among the nodes a run can lower."""
    lowered = step_precisions(plan, MIXED_LOW, variants)
    return nodes_computed_only_by(plan, {name for name, step in lowered.items() if step.precision == FP32})


def _kept_reasons(plan: Plan, keep_fp32: dict[str, str]) -> dict[str, str]:
    """Step name -> why it stays FP32, for each step that computes a node of `keep_fp32`."""
    if not keep_fp32:
        return {}
    held = steps_holding(plan, keep_fp32)
    return {step: f"{KEPT_BY_BUDGET}: {'; '.join(keep_fp32[node] or node for node in nodes)}" for step, nodes in held.items()}


def _step_precision(plan: Plan, step: PluginStep, precision: str, variants: Mapping[str, str], kept: str | None = None) -> StepPrecision:
    op = step.node.op_key
    if op in variants:  # the user's choice wins: the step runs in whatever its variant computes in
        variant = variants[op]
        ran = step.plugin.variant_precision(step.node, plan.device, variant)
        return StepPrecision(variant, ran, None if ran == precision or precision == FP32 else f"--variant {op}={variant}")
    if precision == FP32:
        return StepPrecision(None)
    if kept is not None:  # a node of it would cost the budget more than FP32 does
        return StepPrecision(None, FP32, kept)
    choice = _asked(step, plan, precision)
    if choice.variant is None:
        return StepPrecision(None, FP32, choice.reason or f"no {precision} kernel for {op}")
    ran = step.plugin.variant_precision(step.node, plan.device, choice.variant)
    return StepPrecision(choice.variant, ran, None if ran == precision else choice.reason or f"{choice.variant} computes in {ran}")


def _asked(step: PluginStep, plan: Plan, precision: str) -> PrecisionChoice:
    """The plugin's answer for the step; a group step (one generated kernel over several nodes) has none yet."""
    if step.group is not None:
        return PrecisionChoice(None, f"no {precision} kernel for a group of {step.node.op_key} and what joins it")
    try:
        return step.plugin.precision_variant(step.node, plan.device, precision, step.fused, step.prologue)
    except PluginError as err:  # a plugin that cannot judge the step keeps it in FP32, and says why
        return PrecisionChoice(None, str(err))
