"""Tensors kept channel-last in a 16-bit format between the steps of a run in fp16 or bf16.

A Conv in FP16 multiplies its image channel-last in the format; left alone, each such step reads FP32 NCHW,
rewrites it so, and writes FP32 NCHW for the next one to rewrite again. A tensor is linked instead, and stays
in the format channel-last, when its producer can write it so and every step that reads it can take it so, in
the same format (Plugin.channel_last): the producer then writes the format's bits and its readers skip their
rewrite. A tensor a run hands back (a graph output, a --keep'd one), one onnxruntime reads and one a step reads
through a view are never linked. A linked residual operand reaches its Add rounded to the format, as it
would in a model run in FP16 throughout.

A step exact in any 16-bit format (a max pool; an average pool or a LayerNorm over the channels, which compute in
FP32 and round once as they store) says so with no format of its own (ChannelLast.format None): it takes the format
of the producer of its input, in graph order, so that a chain Conv > MaxPool > Conv links in the Convs' format; one
whose input comes from no step with a format (an FP32 step, a graph input) is not linked at all. Every plugin step
is asked, also one the precision gave no variant (its plugin's own choice), but for the steps `frozen` keeps in
FP32 (a mixed run's budget) and group steps. A linked step of any format runs in the format of its tensors, and its
precision says so.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from ..errors import PluginError
from ..registry import ChannelLast
from .partition import Plan, PluginStep


@dataclass(frozen=True)
class Support:
    """What each plugin step can keep channel-last (step name -> ChannelLast, the format resolved), and which of
    them took the format of their neighbours (ChannelLast.format None)."""

    steps: dict[str, ChannelLast]
    any_format: frozenset[str]


def linked_tensors(plan: Plan, variants: dict[str, str | None], frozen: frozenset[str] = frozenset()) -> set[str]:
    """The tensors of `plan` to keep channel-last, its plugin steps built from `variants` (step name -> variant);
    `frozen`: steps that keep FP32 tensors whatever their plugins can do."""
    return _linked(plan, supported(plan, variants, frozen))


def supported(plan: Plan, variants: dict[str, str | None], frozen: frozenset[str] = frozenset()) -> Support:
    """Each step's answer to Plugin.channel_last, a step of any format given that of the producer of the first
    input it can take so (graph order: the producer was answered first); left out where that has none."""
    if not plan.device.is_cuda:
        return Support({}, frozenset())
    found: dict[str, ChannelLast] = {}
    any_format: set[str] = set()
    written_in: dict[str, str] = {}  # tensor -> the format its producer keeps tensors in, linked or not
    for step in plan.plugin_steps:
        answer = None if step.name in frozen else _channel_last(plan, step, variants.get(step.name))
        if answer is not None and answer.format is None:
            taken = (step.inputs[p] for p in sorted(answer.inputs) if p < len(step.inputs))
            fmt = next((written_in[name] for name in taken if name in written_in), None)
            answer = replace(answer, format=fmt) if fmt else None
            if answer is not None:
                any_format.add(step.name)
        if answer is not None:
            found[step.name] = answer
            written_in.update((name, answer.format) for name in step.outputs)
    return Support(found, frozenset(any_format))


def _linked(plan: Plan, support: Support) -> set[str]:
    readers: dict[str, list[tuple[object, int]]] = defaultdict(list)
    for step in plan.steps:
        for position, name in enumerate(step.inputs):
            if name:
                readers[name].append((step, position))
    handed_back = {*plan.model.outputs, *plan.keep}
    linked = set()
    for step in plan.plugin_steps:
        writer = support.steps.get(step.name)
        if writer is None or not writer.output or len(step.outputs) != 1 or step.outputs[0] in handed_back:
            continue
        tensor = step.outputs[0]
        if readers[tensor] and all(_takes(reader, position, writer.format, support) for reader, position in readers[tensor]):
            linked.add(tensor)
    return linked


def linked_variants(plan: Plan, variants: dict[str, str | None], linked: set[str], support: Support) -> dict[str, str]:
    """Step name -> the variant that reads and writes its `linked` tensors channel-last, for each step with one."""
    rewritten = {}
    for step in plan.plugin_steps:
        inputs = frozenset(position for position, name in enumerate(step.inputs) if name in linked)
        output = bool(step.outputs) and step.outputs[0] in linked
        if inputs or output:
            rewritten[step.name] = step.plugin.linked_variant(step.node, plan.device, variants.get(step.name), inputs, output,
                                                              support.steps[step.name].format, step.fused, step.prologue)
    return rewritten


def _channel_last(plan: Plan, step: PluginStep, variant: str | None) -> ChannelLast | None:
    if step.group is not None:
        return None
    try:
        return step.plugin.channel_last(step.node, plan.device, variant, step.fused, step.prologue)
    except PluginError:  # a step its plugin cannot judge keeps FP32 NCHW tensors
        return None


def _takes(reader: object, position: int, fmt: str | None, support: Support) -> bool:
    if not isinstance(reader, PluginStep) or position in reader.views:
        return False
    found = support.steps.get(reader.name)
    return found is not None and found.format == fmt and position in found.inputs


def with_links(plan: Plan, precisions: dict, frozen: frozenset[str] = frozenset()) -> dict:
    """`precisions` (plan/precision.py's StepPrecision by step name) with each linked step's variant rewritten,
    and its linked tensors named; a linked step of any format runs in its tensors' (`frozen`: see supported)."""
    variants = {name: p.variant for name, p in precisions.items()}
    support = supported(plan, variants, frozen)
    linked = _linked(plan, support)
    rewritten = linked_variants(plan, variants, linked, support)
    steps = {step.name: step for step in plan.steps}
    linked_precisions = {}
    for name, p in precisions.items():
        if name in rewritten:
            tensors = tuple(t for t in [*steps[name].inputs, *steps[name].outputs] if t in linked)
            p = replace(p, variant=rewritten[name], channel_last=tensors)
            if name in support.any_format:
                p = replace(p, precision=support.steps[name].format, reason=None)
        linked_precisions[name] = p
    return linked_precisions
