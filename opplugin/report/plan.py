"""The plan as text and as plain data, for `plan` and `plan --json`: both read one
PlanRecord (runtime/records.py), never a live runner or plan.

One entry per step, in execution order: its name, kind, ops, implementation (as
`run` reports it), the tensors it reads and writes with their shapes at the
record's batch, and its ONNX nodes. A node left to onnxruntime carries the
reason: the answer of the plugin for its op type, or that there is none.
"simplified" says what load-time simplification did (graph/simplify.py): "constants_folded"
and "dropped" map op types to counts, "batchnorms_folded" counts BatchNormalization
nodes folded into their Conv. "user_kernels" lists what each `--kernel` source does with
each node of its op type, as the text's "User kernels" lines say it: `kernel` (the
file's name), `path` (as given), `op_type`, `step`, `status` ("compiled", "rejected":
the built-in choice runs the node, "not_compiled": no NVRTC here, "unused": no node of
its op type is a plugin step, `step` null), `reason` (why rejected or not compiled),
`fused` (the op types fused after the node) and `fused_by_kernel` (whether the source
applies them itself; null when nothing is fused). Empty without `--kernel`.
"precision" is the precision asked for (`--precision`; "fp32" by default), and each step's own
`precision` ("fp32", "tf32", "fp16", "bf16") what its kernel computes its products in, with
`precision_reason`: why it stays fp32 under a reduced precision (null otherwise), and `channel_last`: the tensors
it reads or writes channel-last in that 16-bit format, between steps that can (plan/channel_last.py). "budget", under precision
"mixed": the --budget, the images it was measured on, the nodes it keeps in FP32 and why (each step that computes
one says so in its precision_reason), and the emulated outputs' errors; null otherwise.
"""
from __future__ import annotations

from typing import Any

from .jsonout import header
from ..runtime.records import PlanRecord, StepRecord
from ..core.texttable import LINE_WIDTH, elide_middle, summarise_ops

# 5: precision (asked for), and each step's precision and precision_reason (plan/precision.py)
# 6: budget (plan --precision mixed --budget: cli/budget.py), null otherwise
# 7: each step's channel_last (the tensors it reads or writes channel-last in its 16-bit format)
SCHEMA = "opplugin-plan/7"
STEP_KEYS = ("name", "kind", "ops", "implementation", "precision", "precision_reason", "channel_last", "inputs", "outputs", "nodes",
             "views", "flops", "bytes_moved", "variants")

# variant -> None when a plugin offers it for a step, else why not (Plugin.variant_notes)
VariantNotes = dict[str, dict[str, str | None]]


def _tensors(plan: PlanRecord, names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": name, "shape": list(plan.shapes[name]) if name in plan.shapes else None} for name in names]


def _nodes(plan: PlanRecord, step: StepRecord) -> list[dict[str, Any]]:
    nodes = []
    for name, op in zip(step.nodes, step.ops):
        reason = None
        if step.kind != "plugin":
            reason = plan.fallbacks.get(name, f"no plugin for {op}")
        nodes.append({"name": name, "op": op, "reason": reason})
    return nodes


def step_entry(plan: PlanRecord, step: StepRecord, variants: dict[str, str | None] | None = None) -> dict[str, Any]:
    return {
        "name": step.name,
        "kind": step.kind,
        "ops": list(step.ops),
        "implementation": step.implementation,
        "precision": step.precision,
        "precision_reason": step.precision_reason,
        "channel_last": list(step.channel_last),
        "inputs": _tensors(plan, step.inputs),
        "outputs": _tensors(plan, step.outputs),
        "nodes": _nodes(plan, step),
        "views": list(step.views),  # the operands the step reads through layout nodes applied as views, in words
        "flops": step.flops,
        "bytes_moved": step.bytes_moved,
        "variants": variants,
    }


def build_plan_report(plan: PlanRecord, user_kernels: list[dict[str, Any]] | None = None,
                      budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan at `plan.batch`, with each plugin step's variant notes where its plugin has variants,
    the user kernels' entries (cli_support.UserKernelUse.as_json), and under precision mixed its budget
    (cli/budget.py: BudgetSearch.as_json)."""
    return header(SCHEMA, plan.device, plan.model.name, plan.batch) | {
        "onnxruntime_provider": plan.onnxruntime_provider,
        "precision": plan.precision,
        "budget": budget,
        "chunk": plan.chunk,
        "steps": [step_entry(plan, step, plan.variant_notes.get(step.name) or None) for step in plan.steps],
        "fallbacks": dict(plan.fallbacks),
        "fusions_given_up": dict(plan.fusions_given_up),
        "simplified": plan.model.simplification.as_json(),
        "user_kernels": list(user_kernels or []),
    }


# Without --wide: the most characters a step or tensor name, and an op chain, take in the text.
PLAN_NAME_WIDTH = 40
OPS_WIDTH = 72


def _own_op(step) -> str:
    """The op of the node a step is named after (its plugin's), not a prologue's first (a LayerNorm, a Reshape)."""
    return step.ops[step.nodes.index(step.name)] if step.name in step.nodes else step.ops[0]


def budget_note(budget: dict[str, Any]) -> str:
    """A mixed run's or plan's budget in a few words, for its first line (`budget`: BudgetSearch.as_json)."""
    anyway = budget.get("in_fp32_anyway")
    kept = f"budget {budget['flag']}: {len(budget['kept_in_fp32'])} of {budget['nodes']} nodes kept in fp32"
    return f"{kept}, {anyway} more without an fp16 kernel" if anyway else kept


def format_plan(plan: PlanRecord, wide: bool = False, budget: dict[str, Any] | None = None) -> str:
    """The plan as text: a line per step with its implementation, a line with its inputs, then
    why claimed nodes stay in onnxruntime, why fusions were given up, and which variants each
    plugin step is offered. Long names and op chains are shortened unless `wide`. `budget`: a mixed
    plan's (BudgetSearch.as_json), for the first line."""
    device = plan.device.name if plan.device.is_cuda else "cpu (numpy reference for plugin steps)"
    line_width, name_width = (None, None) if wide else (LINE_WIDTH, PLAN_NAME_WIDTH)
    reduced = plan.precision != "fp32"
    asked = f", precision {plan.precision} (where a step has a kernel in it; the rest fp32)" if reduced else ""
    if budget is not None:
        asked = f", precision mixed ({budget_note(budget)}; fp16 where a step has a kernel in it, the rest fp32)"
    lines = [f"Plan for {plan.model.name}, batch {plan.batch}, device {device}{asked}", ""]
    if plan.model.simplification.changed:
        lines[1:1] = [elide_middle(f"Simplified at load: {plan.model.simplification.summary()}", line_width)]
    names = {step.name: elide_middle(step.name, name_width) for step in plan.steps}
    width = max(len(name) for name in names.values())
    for number, step in enumerate(plan.steps, 1):
        runs_on = f"plugin {_own_op(step)}" if step.kind == "plugin" else "onnxruntime"
        if step.kind == "plugin" and len(step.ops) > 1:
            runs_on += " (fused)"
        first = f"  {number:>2}  {names[step.name]:<{width}}  {runs_on:<20}  "
        ops_width = None if wide else min(LINE_WIDTH - len(first), OPS_WIDTH)
        lines.append(first + summarise_ops(list(step.ops), ops_width))
        indent = f"      {'':<{width}}  "
        lines.append(elide_middle(f"{indent}runs: {step.implementation}", line_width))
        if reduced or step.precision != "fp32":  # an FP32 plan reads as it always has
            lines.append(elide_middle(f"{indent}precision: {step.precision}{f': {step.precision_reason}' if step.precision_reason else ''}",
                                      line_width))
        if step.channel_last:
            lines.append(elide_middle(f"{indent}channel-last in {step.precision}: {', '.join(step.channel_last)}", line_width))
        lines += [elide_middle(f"{indent}reads as a view: {view}", line_width) for view in step.views]
        shapes = _listed([f"{elide_middle(n, name_width)} {list(plan.shapes[n])}" for n in dict.fromkeys(step.inputs) if n in plan.shapes],
                         None if wide else LINE_WIDTH - len(indent) - 4)
        lines.append(f"{indent}in: {shapes or '-'}")
    sections = (("Left to onnxruntime:", plan.fallbacks), ("Fusions given up:", plan.fusions_given_up))
    for title, reasons in sections:
        if reasons:
            lines += ["", title]
            lines += [elide_middle(f"  {elide_middle(node, name_width)}: {why}", line_width) for node, why in reasons.items()]
    for node, notes in plan.variant_notes.items():
        offered = [v for v, reason in notes.items() if reason is None]
        lines += ["", f"{elide_middle(node, name_width)}: CUDA variants offered: {', '.join(offered) or 'none'}"]
        lines += [f"  {v} not offered: {reason}" for v, reason in notes.items() if reason]
    return "\n".join(lines)


def _listed(items: list[str], width: int | None) -> str:
    """`items` joined by commas in at most `width` characters: as many as fit, then how many more."""
    text = ", ".join(items)
    if width is None or len(text) <= width:
        return text
    for shown in range(len(items) - 1, 0, -1):
        text = ", ".join(items[:shown]) + f", and {len(items) - shown} more"
        if len(text) <= width:
            return text
    return elide_middle(f"{items[0]}, and {len(items) - 1} more", width)
