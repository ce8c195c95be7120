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

A step of several inputs that links all of them and its output or none (ChannelLast.all_or_none: a Concat, whose
output holds its inputs as they come) needs every one of them from a step with a format, all in one format; then
each of its tensors is linked as any other, and where one is not (a graph output, an FP32 reader), none is: the
step stays FP32, its neighbours read and write FP32 there, and its precision says why. Such a step copies what it
links, where in FP32 a producer writes straight into its slice of the output (runtime/buffers.py); so none is
linked whose input another such step reads too: DenseNet's Concats, each of every earlier layer's output, would
copy each output once per later layer, where FP32 writes it once into one buffer the Concats share.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..errors import PluginError
from ..registry import ChannelLast
from .partition import Plan, PluginStep


@dataclass(frozen=True)
class Support:
    """What each plugin step can keep channel-last (step name -> ChannelLast, the format resolved), which of
    them took the format of their neighbours (ChannelLast.format None), and why a step that links all of its
    tensors or none found no one format among its producers (step name -> the reason)."""

    steps: dict[str, ChannelLast]
    any_format: frozenset[str]
    declined: dict[str, str] = field(default_factory=dict)


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
    declined: dict[str, str] = {}
    written_in: dict[str, str] = {}  # tensor -> the format its producer keeps tensors in, linked or not
    for step in plan.plugin_steps:
        answer = None if step.name in frozen else _channel_last(plan, step, variants.get(step.name))
        if answer is not None and answer.format is None:
            taken = [step.inputs[p] for p in sorted(answer.inputs) if p < len(step.inputs)]
            if answer.all_or_none:
                fmt, why = _one_format(plan, taken, written_in)
                if why:
                    declined[step.name] = why
            else:
                fmt = next((written_in[name] for name in taken if name in written_in), None)
            answer = replace(answer, format=fmt) if fmt else None
            if answer is not None:
                any_format.add(step.name)
        if answer is not None:
            found[step.name] = answer
            written_in.update((name, answer.format) for name in step.outputs)
    return Support(found, frozenset(any_format), declined)


def _one_format(plan: Plan, inputs: list[str], written_in: dict[str, str]) -> tuple[str | None, str | None]:
    """(the format, None) where every one of `inputs` comes from a step that keeps tensors in one format; else
    (None, why not)."""
    fp32 = next((name for name in inputs if name not in written_in), None)
    if fp32 is not None:
        producer = next((step.name for step in plan.steps if fp32 in step.outputs), None)
        source = f"step {producer}, which keeps FP32 tensors" if producer else "the graph's inputs"
        return None, f"its input {fp32} comes in FP32 NCHW from {source}"
    formats = sorted({written_in[name] for name in inputs})
    if len(formats) > 1:
        return None, f"its inputs come in {' and '.join(formats)}"
    return (formats[0] if formats else None), None


def _linked(plan: Plan, support: Support, unlinked: dict[str, str] | None = None) -> set[str]:
    """The tensors to keep channel-last; `unlinked` (where given) gets, for each step that links all of its tensors
    or none and links none, why."""
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
    whys = _all_or_none(plan, support, readers, linked)
    if unlinked is not None:
        unlinked.update(support.declined)
        unlinked.update(whys)
    return linked


def _all_or_none(plan: Plan, support: Support, readers: dict[str, list[tuple[object, int]]], linked: set[str]) -> dict[str, str]:
    """`linked` less every tensor of each step that links all of its tensors or none (ChannelLast.all_or_none) and
    cannot link one of them, or whose input another such step reads too; again until none changes, as unlinking one
    such step's tensors may leave another without one. Step name -> why, for each such step it unlinks."""
    whole = {step.name: (step, answer) for step in plan.plugin_steps
             if (answer := support.steps.get(step.name)) is not None and answer.all_or_none}
    why: dict[str, str] = {}
    for name, (step, answer) in whole.items():
        for tensor in _tensors_of(step, answer):
            other = next((r.name for r, _ in readers.get(tensor, []) if r.name in whole and r.name != name), None)
            if other is not None and tensor not in step.outputs:
                why[name] = (f"its input {tensor} is an input of {other} too: linked, each would copy it (DenseNet's Concats: "
                             "once per later layer), where in FP32 its producer writes it once into their shared buffer")
                break
    dropped: dict[str, str] = {}  # tensor -> the first such step that unlinked it
    changed = True
    while changed:
        changed = False
        for name, (step, answer) in whole.items():
            tensors = _tensors_of(step, answer)
            if name not in why:
                missing = next((t for t in tensors if t not in linked), None)
                if missing is None:
                    continue
                why[name] = (f"{missing} is also a tensor of {dropped[missing]}, which stays FP32" if missing in dropped
                             else _why_not_linked(plan, missing, readers, support, step))
            for tensor in linked.intersection(tensors):
                dropped.setdefault(tensor, name)
                linked.discard(tensor)
                changed = True
    return why


def _tensors_of(step: PluginStep, answer: ChannelLast) -> list[str]:
    """The tensors a step that links all of its tensors or none links: its inputs at `answer.inputs`, its output."""
    return [step.inputs[p] for p in sorted(answer.inputs) if p < len(step.inputs)] + list(step.outputs[:1])


def _why_not_linked(plan: Plan, tensor: str, readers: dict[str, list[tuple[object, int]]], support: Support, step: PluginStep) -> str:
    """Why `tensor`, one of `step`'s, is not linked (so `step`, which links all of its tensors or none, is not)."""
    if tensor in plan.model.outputs or tensor in plan.keep:
        return f"{tensor} is handed back by the run (a graph output or kept), in FP32 NCHW"
    producer = next((s for s in plan.steps if tensor in s.outputs), None)
    answer = support.steps.get(producer.name) if producer is not None else None
    if producer is not step and (answer is None or not answer.output):
        return f"{tensor} is written in FP32 NCHW by {producer.name if producer is not None else 'no step (a graph input)'}"
    fmt = support.steps[step.name].format
    reader = next((r.name for r, position in readers.get(tensor, []) if not _takes(r, position, fmt, support)), None)
    return f"{reader} reads {tensor} in FP32 NCHW" if reader else f"no step reads {tensor} channel-last"


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
    unlinked: dict[str, str] = {}
    linked = _linked(plan, support, unlinked)
    rewritten = linked_variants(plan, variants, linked, support)
    steps = {step.name: step for step in plan.steps}
    linked_precisions = {}
    for name, p in precisions.items():
        if name in rewritten:
            tensors = tuple(t for t in [*steps[name].inputs, *steps[name].outputs] if t in linked)
            p = replace(p, variant=rewritten[name], channel_last=tensors)
            if name in support.any_format:
                p = replace(p, precision=support.steps[name].format, reason=None)
        elif name in unlinked and p.variant is None:  # an FP32 step that could have been linked: why not
            p = replace(p, reason=f"not linked channel-last: {unlinked[name]}")
        linked_precisions[name] = p
    return linked_precisions
