"""The plan as plain data, for `plan --json`: built from a PlanRecord (what a runner
runs, see runtime/records.py), never from a live runner.

One entry per step, in execution order: its name, kind, ops, implementation (as
`run` reports it), the tensors it reads and writes with their shapes at the
record's batch, and its ONNX nodes. A node left to onnxruntime carries the
reason: the answer of the plugin for its op type, or that there is none.
"simplified" says what load-time simplification did (simplify.py): "constants_folded"
and "dropped" map op types to counts, "batchnorms_folded" counts BatchNormalization
nodes folded into their Conv.
"""
from __future__ import annotations

from typing import Any

from .jsonout import header
from .runtime.records import PlanRecord, StepRecord

SCHEMA = "opplugin-plan/2"
STEP_KEYS = ("name", "kind", "ops", "implementation", "inputs", "outputs", "nodes", "flops", "bytes_moved", "variants")

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
        "inputs": _tensors(plan, step.inputs),
        "outputs": _tensors(plan, step.outputs),
        "nodes": _nodes(plan, step),
        "flops": step.flops,
        "bytes_moved": step.bytes_moved,
        "variants": variants,
    }


def build_plan_report(plan: PlanRecord, variant_notes: VariantNotes | None = None) -> dict[str, Any]:
    """The plan at `plan.batch`; `variant_notes` per plugin step, where its plugin has variants."""
    notes = variant_notes or {}
    return header(SCHEMA, plan.device, plan.model.name, plan.batch) | {
        "onnxruntime_provider": plan.onnxruntime_provider,
        "chunk": plan.chunk,
        "steps": [step_entry(plan, step, notes.get(step.name) or None) for step in plan.steps],
        "fallbacks": dict(plan.fallbacks),
        "simplified": plan.model.simplification.as_json(),
    }
