"""Tensors kept channel-last in a 16-bit format between the steps of a run in fp16 or bf16.

A Conv in FP16 multiplies its image channel-last in the format; left alone, each such step reads FP32 NCHW,
rewrites it so, and writes FP32 NCHW for the next one to rewrite again. A tensor is linked instead, and stays
in the format channel-last, when its producer can write it so and every step that reads it can take it so, in
the same format (Plugin.channel_last): the producer then writes the format's bits and its readers skip their
rewrite. A tensor a run hands back (a graph output, a --keep'd one), one onnxruntime reads and one a step reads
through a view are never linked. A linked residual operand reaches its Add rounded to the format, as it
would in a model run in FP16 throughout.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from ..errors import PluginError
from ..registry import ChannelLast
from .partition import Plan, PluginStep


def linked_tensors(plan: Plan, variants: dict[str, str | None]) -> set[str]:
    """The tensors of `plan` to keep channel-last, its plugin steps built from `variants` (step name -> variant)."""
    if not plan.device.is_cuda:
        return set()
    support = {step.name: found for step in plan.plugin_steps if (found := _channel_last(plan, step, variants.get(step.name)))}
    readers: dict[str, list[tuple[object, int]]] = defaultdict(list)
    for step in plan.steps:
        for position, name in enumerate(step.inputs):
            if name:
                readers[name].append((step, position))
    handed_back = {*plan.model.outputs, *plan.keep}
    linked = set()
    for step in plan.plugin_steps:
        writer = support.get(step.name)
        if writer is None or not writer.output or len(step.outputs) != 1 or step.outputs[0] in handed_back:
            continue
        tensor = step.outputs[0]
        if readers[tensor] and all(_takes(reader, position, writer.format, support) for reader, position in readers[tensor]):
            linked.add(tensor)
    return linked


def linked_variants(plan: Plan, variants: dict[str, str | None], linked: set[str]) -> dict[str, str]:
    """Step name -> the variant that reads and writes its `linked` tensors channel-last, for each step with one."""
    rewritten = {}
    for step in plan.plugin_steps:
        inputs = frozenset(position for position, name in enumerate(step.inputs) if name in linked)
        output = bool(step.outputs) and step.outputs[0] in linked
        if inputs or output:
            rewritten[step.name] = step.plugin.linked_variant(step.node, plan.device, variants[step.name], inputs, output,
                                                              step.fused, step.prologue)
    return rewritten


def _channel_last(plan: Plan, step: PluginStep, variant: str | None) -> ChannelLast | None:
    if variant is None or step.group is not None:
        return None
    try:
        return step.plugin.channel_last(step.node, plan.device, variant, step.fused, step.prologue)
    except PluginError:  # a step its plugin cannot judge keeps FP32 NCHW tensors
        return None


def _takes(reader: object, position: int, fmt: str, support: dict[str, ChannelLast]) -> bool:
    if not isinstance(reader, PluginStep) or position in reader.views:
        return False
    found = support.get(reader.name)
    return found is not None and found.format == fmt and position in found.inputs


def with_links(plan: Plan, precisions: dict) -> dict:
    """`precisions` (plan/precision.py's StepPrecision by step name) with each linked step's variant rewritten,
    and its linked tensors named."""
    variants = {name: p.variant for name, p in precisions.items()}
    linked = linked_tensors(plan, variants)
    rewritten = linked_variants(plan, variants, linked)
    steps = {step.name: step for step in plan.steps}
    return {name: replace(p, variant=rewritten[name], channel_last=tuple(t for t in [*steps[name].inputs, *steps[name].outputs] if t in linked))
            if name in rewritten else p for name, p in precisions.items()}
