"""A plan as a PlanRecord: what `plan` prints and writes, and what a runner hands to
report/timing.py and verify/check.py.

A runner records its built kernels: each plugin step names its kernel and its cost
at the record's batch. `plan` records the plan alone and builds nothing: a plugin
step names the kernel its plugin would build (`Plugin.kernel_name`), without a cost.
"""
from __future__ import annotations

from typing import Mapping

from ..core.number_formats import FP32
from ..ort import sessions
from ..plan.partition import Plan, Step
from ..plan.precision import StepPrecision, step_precisions
from ..registry import Kernel
from . import chunking
from .records import PlanRecord, StepRecord


def record_plan(
    plan: Plan,
    batch: int,
    *,
    layout: chunking.BatchLayout,
    peak_image_bytes: int,
    chunk: int,
    ort_on_gpu: bool,
    kernels: Mapping[str, Kernel] | None = None,
    variants: Mapping[str, str] | None = None,
    variant_notes: bool = False,
    precision: str = FP32,
    precisions: Mapping[str, StepPrecision] | None = None,
) -> PlanRecord:
    """The plan at `batch`. `kernels`: a runner's built kernels, by step name; without
    them each plugin step names what its plugin would build with `variants` (op type ->
    variant) under `precision` (--precision). `precisions`: each step's variant and precision where
    the caller chose them (a runner), else chosen here. `variant_notes`: also each plugin step's
    variants and why any is not offered."""
    precisions = step_precisions(plan, precision, variants) if precisions is None else precisions
    initializers = plan.model.initializers
    names = {n for step in plan.steps for n in [*step.inputs, *step.outputs]} | set(plan.model.outputs)
    shapes = {n: _shape_at(plan, layout, n, batch) for n in names if n and n not in initializers}
    ort_name = f"onnxruntime {'CUDA' if ort_on_gpu else 'CPU'}"
    steps = []
    for step in plan.steps:
        kernel = (kernels or {}).get(step.name)
        steps.append(StepRecord(
            name=step.name,
            kind=step.kind,
            ops=tuple(step.ops),
            implementation=kernel.name if kernel else _planned_implementation(plan, step, precisions[step.name], ort_name),
            inputs=tuple(n for n in step.inputs if n and n not in initializers),
            outputs=tuple(step.outputs),
            flops=kernel.flops(batch) if kernel else None,
            bytes_moved=kernel.bytes_moved(batch) if kernel else None,
            nodes=tuple(step.node_names),
            views=tuple(view.describe() for view in step.views.values()) if step.kind == "plugin" else (),
            precision=precisions[step.name].precision,
            precision_reason=precisions[step.name].reason,
            channel_last=precisions[step.name].channel_last,
        ))
    notes = {}
    if variant_notes:
        notes = {s.name: n for s in plan.plugin_steps if (n := s.plugin.variant_notes(s.node, plan.device))}
    provider = sessions.CUDA_PROVIDER if ort_on_gpu else sessions.CPU_PROVIDER
    return PlanRecord(plan.model, plan.device, provider, batch, chunk, tuple(steps), shapes, layout, peak_image_bytes,
                      dict(plan.fallbacks), dict(plan.fusions_given_up), notes, precision)


def record_plan_alone(plan: Plan, variants: Mapping[str, str] | None = None, precision: str = FP32,
                      keep_fp32: Mapping[str, str] | None = None) -> PlanRecord:
    """The plan at its own batch with nothing built: what `opplugin plan` shows; `keep_fp32` as Runner's."""
    layout = chunking.probe_layout(plan.model)
    return record_plan(
        plan,
        plan.batch,
        layout=layout,
        peak_image_bytes=chunking.peak_image_bytes(plan.model, layout),
        chunk=plan.batch,
        ort_on_gpu=plan.device.is_cuda and sessions.has_cuda(),
        variants=variants,
        variant_notes=True,
        precision=precision,
        precisions=step_precisions(plan, precision, variants, keep_fp32),
    )


def _planned_implementation(plan: Plan, step: Step, chosen: StepPrecision, ort_name: str) -> str:
    if step.kind != "plugin":
        return ort_name
    return step.kernel_name(plan.device, chosen.variant) or f"{step.node.op_key} plugin"


def _shape_at(plan: Plan, layout: chunking.BatchLayout, name: str, batch: int) -> tuple[int, ...]:
    if layout.chunkable and layout.is_batched(name):
        return layout.shape_at(name, batch)
    return plan.shape_of(name)
