"""Partitioning a model into steps: plugin steps (one node each, with the
followers its plugin fuses, or a group of connected nodes one plugin kind runs
together) and onnxruntime steps (maximal runs of the remaining nodes, each one
sub-model)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Sequence

import onnx
from onnx import helper, numpy_helper

from ..gpu.device import Device
from ..gpu.kernel_cache import CompileJob
from ..core.node_reads import reads
from ..errors import ModelError, PluginError
from ..ort import known_ops
from ..graph.model import Model
from .keep import checked_keep, given_up_for_keep, hidden_outputs
from .input_views import RESHAPES, STRIDED_VIEWS, InputView, InputViewsKernel, find_input_views, reads_in_place
from .prologue import find_prologues, give_way, prologue_inputs
from ..registry import Kernel, NodeGroup, NodeInfo, Plugin, TensorInfo, is_builtin, node_name, plugins
from ..core.texttable import OP_SEPARATOR


@dataclass
class PluginStep:
    """One node (or a fused chain led by one, or a group of nodes) that a plugin runs."""

    kind: ClassVar[str] = "plugin"

    name: str
    node: NodeInfo
    plugin: Plugin
    inputs: list[str]
    outputs: list[str]
    # nodes after `node` that the plugin runs inside the same kernel (an epilogue)
    fused: list[NodeInfo] = field(default_factory=list)
    # set for a group step (registry.GroupPlugin): `node` and `fused` are its nodes, in graph order
    group: NodeGroup | None = None
    # nodes before `node` that the plugin applies to its first input as it loads it (prologue.py)
    prologue: list[NodeInfo] = field(default_factory=list)
    # input position -> the layout nodes that make the operand there from the step's input, as views (input_views.py)
    views: dict[int, InputView] = field(default_factory=dict)

    @property
    def ops(self) -> list[str]:
        """The op of each node the kernel runs: its type, with the domain for one outside ONNX's (op_key)."""
        return [n.op_key for n in (*self.prologue, self.node, *self.fused)]

    @property
    def node_names(self) -> list[str]:
        """The node of each op in `ops` (the view nodes have their own line: `views`)."""
        return [n.name for n in (*self.prologue, self.node, *self.fused)]

    @property
    def view_nodes(self) -> list[NodeInfo]:
        """The layout nodes the step applies as views to its inputs, each after the node it reads (chains that
        share a node share all before it: the first chain lists them first)."""
        return list({n.name: n for view in self.views.values() for n in view.nodes}.values())

    @property
    def kernel_nodes(self) -> list[NodeInfo]:
        """Every node the step's kernel runs, in graph order."""
        return [*self.view_nodes, *self.prologue, self.node, *self.fused]

    def build(self, device: Device, variant: str | None = None, graphed: bool = True) -> Kernel:
        """The step's kernel; `graphed`: it will be launched from CUDA graphs (see registry.Plugin)."""
        if self.group is not None:
            kernel = self.plugin.build_group(self.group, device, variant, graphed=graphed)
            strided = False  # a group's generated kernel reads its operands contiguous
        else:
            kernel = self.plugin.build(self.node, device, variant, fused=self.fused, prologue=self.prologue, graphed=graphed)
            strided = self.plugin.reads_views(self.node, self.fused)
        if self.views:
            kernel = InputViewsKernel(kernel, [self.views[i].function() if i in self.views else None for i in range(len(self.inputs))],
                                      contiguous=not strided)
        return kernel

    def compile_jobs(self, device: Device, variant: str | None = None, graphed: bool = True) -> Sequence[CompileJob]:
        """The kernel sources `build` with the same arguments will compile (Plugin.compile_jobs)."""
        if self.group is not None:
            return self.plugin.group_compile_jobs(self.group, device, variant, graphed=graphed)
        return self.plugin.compile_jobs(self.node, device, variant, fused=self.fused, prologue=self.prologue, graphed=graphed)

    def kernel_name(self, device: Device, variant: str | None = None, graphed: bool = True) -> str | None:
        """The name `build` with the same arguments would give the kernel (Plugin.kernel_name)."""
        return self.plugin.kernel_name(self.node, device, variant, fused=self.fused, prologue=self.prologue, graphed=graphed)


@dataclass
class OrtStep:
    """A maximal run of nodes no plugin claims: one onnxruntime sub-model and session."""

    kind: ClassVar[str] = "onnxruntime"

    name: str
    nodes: list[onnx.NodeProto]
    inputs: list[str]
    outputs: list[str]
    model: onnx.ModelProto

    @property
    def ops(self) -> list[str]:
        return [n.op_type for n in self.nodes]

    @property
    def node_names(self) -> list[str]:
        return [node_name(n) for n in self.nodes]


Step = PluginStep | OrtStep


@dataclass
class Plan:
    """The model split into plugin and onnxruntime steps in graph order, at one batch,
    with the shape of every tensor."""

    model: Model
    batch: int
    device: Device
    steps: list[Step]
    tensors: dict[str, TensorInfo]
    # node name -> why its plugin does not run it (only nodes some plugin claims)
    fallbacks: dict[str, str] = field(default_factory=dict)
    # plugin node name -> why a fusion its plugin would make was given up
    fusions_given_up: dict[str, str] = field(default_factory=dict)
    # tensors every step leaves visible, so that a run can hand them back (make_plan's `keep`)
    keep: tuple[str, ...] = ()

    @property
    def plugin_steps(self) -> list[PluginStep]:
        return [s for s in self.steps if isinstance(s, PluginStep)]

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape


def make_plan(model: Model, batch: int, device: Device, registry: dict[str, Plugin] | None = None,
              tensors: dict[str, TensorInfo] | None = None, keep: Sequence[str] = ()) -> Plan:
    """The plan at `batch`; `tensors`: every tensor's shape at that batch where the caller has them (else inferred).
    `keep`: tensors a run must be able to hand back, which no step may hide (keep.py): a fusion or prologue
    that would is given up (fusions_given_up says so); InputError for a name that is no tensor of the graph."""
    kept = checked_keep(model, keep)
    registry = {**(plugins() if registry is None else registry), **model.declarations}  # the model's custom ops too
    tensors = model.infer(batch) if tensors is None else tensors
    grouping = _Grouping.of(model.node_infos(batch, tensors), model, device, registry, frozenset(kept))
    consumed_later = _consumers_after(grouping.groups, grouping.fused, [*model.outputs, *kept], grouping.prologues, grouping.views)
    steps: list[Step] = []
    for index, group in enumerate(grouping.groups):
        if isinstance(group, NodeInfo) and group.name in grouping.node_groups:
            nodes = grouping.node_groups[group.name]
            inputs, views = grouping.read_through_views(group.name, list(nodes.inputs))
            steps.append(PluginStep(group.name, group, registry[group.op_key], inputs, list(nodes.outputs),
                                    grouping.fused[group.name], nodes, views=views))
            continue
        if isinstance(group, NodeInfo):
            followers = grouping.fused[group.name]
            outputs = list((followers[-1] if followers else group).node.output)
            inputs = step_inputs(group, followers, model)
            prologue = grouping.prologues.get(group.name, [])
            if prologue:
                inputs = prologue_inputs(prologue, registry[group.op_key].prologue_input, inputs, model.initializers)
            inputs, views = grouping.read_through_views(group.name, inputs)
            steps.append(PluginStep(group.name, group, registry[group.op_key], inputs, outputs, followers, prologue=prologue, views=views))
            continue
        number = sum(isinstance(s, OrtStep) for s in steps) + 1
        nodes = [info.node for info in group]
        _refuse_unknown_ops(nodes, model)
        outputs = [o for n in nodes for o in n.output if o and o in consumed_later[index]]
        if not outputs:  # dead code: nothing reads what these nodes write, and onnxruntime runs nothing for nobody
            continue
        inputs = outside_inputs(nodes, model)
        sub = sub_model(model, f"{model.name}_part{number}", nodes, inputs, outputs, tensors)
        steps.append(OrtStep(f"onnxruntime{number}", nodes, inputs, outputs, sub))
    return Plan(model, batch, device, steps, tensors, grouping.fallbacks, grouping.given_up, kept)


def _refuse_unknown_ops(nodes: list[onnx.NodeProto], model: Model) -> None:
    """ModelError for the first node that neither a plugin nor onnxruntime can run (a custom op no
    declaration names), saying how to declare it."""
    functions = frozenset((f.domain, f.name) for f in model.bare.functions)
    for node in nodes:
        unknown = known_ops.first_unknown(node, functions)
        if unknown is None:
            continue
        if unknown is not node:  # in a branch or loop body, which onnxruntime runs whole
            raise ModelError(f"{model.name}: node {node_name(node)} ({node.op_type}) holds {unknown.domain}::{unknown.op_type} "
                             f"in a subgraph; onnxruntime runs subgraphs whole and does not know that op, and custom ops "
                             f"run only at the top level of the graph")
        raise ModelError(f"{model.name}: node {node_name(unknown)} is {unknown.domain}::{unknown.op_type}, which onnxruntime "
                         f"does not know and no declaration runs; declare it in a Python file (opplugin.custom.CustomOp) "
                         f"and pass --ops FILE.py")


@dataclass
class _Grouping:
    """The nodes in graph order as groups: a plugin node is a group of its own (with the
    followers its kernel fuses), the others gather into runs, each one onnxruntime sub-model."""

    groups: list[NodeInfo | list[NodeInfo]] = field(default_factory=list)
    fused: dict[str, list[NodeInfo]] = field(default_factory=dict)  # plugin node name -> the followers its kernel runs
    node_groups: dict[str, NodeGroup] = field(default_factory=dict)  # lead node name -> its group, for a group step
    fallbacks: dict[str, str] = field(default_factory=dict)
    given_up: dict[str, str] = field(default_factory=dict)
    prologues: dict[str, list[NodeInfo]] = field(default_factory=dict)  # plugin node name -> the nodes its kernel applies first
    views: dict[str, list[InputView]] = field(default_factory=dict)  # plugin node name -> its operands read as views

    @classmethod
    def of(cls, infos: list[NodeInfo], model: Model, device: Device, registry: dict[str, Plugin],
           keep: frozenset[str] = frozenset()) -> "_Grouping":
        """`keep`: tensors no step may hide; they are treated as graph outputs, which no kernel hides either."""
        grouping, taken = cls(), set()
        readers = _readers(infos)
        made_by = {o: index for index, info in enumerate(infos) for o in info.node.output if o}
        visible = set(model.outputs) | keep
        grouping.prologues = find_prologues(infos, readers, made_by, visible, device, registry)
        if keep:
            grouping._prologues_given_up(find_prologues(infos, readers, made_by, set(model.outputs), device, registry), keep)
        taken.update(n.name for chain in grouping.prologues.values() for n in chain)
        for info in infos:
            if info.name in taken:
                continue
            plugin = registry.get(info.op_key)
            if plugin:
                info, reason = _with_spec(plugin, info)
                reason = reason or _support(plugin, info, device)
            else:
                reason = "no plugin"
            if plugin and reason is None and plugin.group_kind is not None:
                grouping.groups.append(info)
                group = _grown_group(info, infos, plugin, model, readers, made_by, taken, device, registry, visible)
                grouping.node_groups[info.name] = group
                grouping.fused[info.name] = list(group.nodes[1:])
                taken.update(n.name for n in group.nodes)
                continue
            if plugin and reason is None:
                grouping.groups.append(info)
                followers, why = _fusion(plugin, info, readers, made_by, visible, device, registry)
                grouping.fused[info.name] = followers
                if keep and not why:
                    free, _ = _fusion(plugin, info, readers, made_by, set(model.outputs), device, registry)
                    if len(free) > len(followers):
                        why = given_up_for_keep([info, *free], hidden_outputs([info, *free], last_written=True), keep, "")
                if why:  # after a prologue given up for `keep`, where there is one
                    grouping.given_up[info.name] = "; ".join(filter(None, (grouping.given_up.get(info.name), why)))
                give_way(grouping.prologues, followers, taken)  # an epilogue goes first
                taken.update(f.name for f in followers)
                continue
            if plugin:
                grouping.fallbacks[info.name] = reason
            if grouping.groups and isinstance(grouping.groups[-1], list):
                grouping.groups[-1].append(info)
            else:
                grouping.groups.append([info])
        grouping._read_views(model, registry, readers, visible)
        return grouping

    def _read_views(self, model: Model, registry: dict[str, Plugin], readers: dict[str, list[NodeInfo]], visible: set[str]) -> None:
        """Layout nodes that later steps take in as views of their inputs (input_views.py), no longer steps of
        their own: any layout view for a step whose kernel reads strided operands, reshapes for the others.
        Later steps first, so that a chain goes whole to the step at its end."""
        alone = {o: g for g in self.groups if isinstance(g, NodeInfo) and not self.fused.get(g.name) and g.name not in self.node_groups
                 and g.name not in self.prologues for o in g.node.output if o}
        joined: set[str] = set()
        for group in reversed(self.groups):
            if not isinstance(group, NodeInfo) or group.name in joined:
                continue
            followers = self.fused.get(group.name, [])
            if group.name in self.node_groups:  # a generated kernel over the group's inputs: reshapes only
                kinds, operands = RESHAPES, list(self.node_groups[group.name].inputs)
            else:
                kinds = STRIDED_VIEWS if _reads_views(registry.get(group.op_key), group, followers) else RESHAPES
                operands = step_inputs(group, followers, model)
            view_of = lambda node, output: _view_of(registry.get(node.op_key), node, output)  # noqa: E731
            views = find_input_views([group, *followers], operands, alone, readers, visible, view_of, kinds, joined)
            if group.op_type == "Concat":  # only what it reads in place: its producers may write the rest into its buffer
                axis = int(group.attributes.get("axis", 0)) % len(group.outputs[0].shape)
                cut: set[str] = set()
                # again without those nodes, which stay steps (that may write into the Concat's buffer), until
                # what is left reads in place (a chain cut short may lose more of its first nodes to other readers)
                while more := {n.name for view in views for n in _not_in_place(view, axis)} - cut:
                    cut |= more
                    views = find_input_views([group, *followers], operands, alone, readers, visible, view_of, kinds, joined | cut)
            if views:
                self.views[group.name] = views
                joined.update(n.name for view in views for n in view.nodes)
        self.groups = [g for g in self.groups if not (isinstance(g, NodeInfo) and g.name in joined)]

    def read_through_views(self, name: str, operands: list[str]) -> tuple[list[str], dict[int, InputView]]:
        """The inputs of plugin step `name`, whose kernel reads `operands`: each operand read as a view
        replaced by the view's source; and the views by input position."""
        by_operand = {view.operand: view for view in self.views.get(name, [])}
        views = {i: by_operand[operand] for i, operand in enumerate(operands) if operand in by_operand}
        return [views[i].source if i in views else operand for i, operand in enumerate(operands)], views

    def _prologues_given_up(self, free: dict[str, list[NodeInfo]], keep: frozenset[str]) -> None:
        """Note each prologue that the plan without `keep` would fuse and that hides a kept tensor."""
        for node, chain in free.items():
            if len(self.prologues.get(node, [])) >= len(chain):
                continue
            why = given_up_for_keep(chain, hidden_outputs(chain, last_written=False), keep, f" into {node}'s kernel as a prologue")
            if why:
                self.given_up[node] = why


def _grown_group(lead: NodeInfo, infos: list[NodeInfo], plugin: Plugin, model: Model, readers: dict[str, list[NodeInfo]],
                 made_by: dict[str, int], taken: set[str], device: Device, registry: dict[str, Plugin],
                 visible: set[str]) -> NodeGroup:
    """The group led by `lead`: each later node, in graph order, that reads a member's output, runs on
    a plugin of the lead's group kind that supports it, and reads nothing else but constants and
    tensors written before the lead, joins where the lead's plugin admits the larger group. What
    a member reads from outside is there before the group's step runs (at the lead's place), and
    no path can leave the group and come back: a node on it would be written after the lead. The group
    writes out what is read outside it and the `visible` tensors (graph outputs, kept tensors)."""
    kind = plugin.group_kind
    lead_at = made_by[next(o for o in lead.node.output if o)]
    members, produced = [lead], {o for o in lead.node.output if o}
    for info in infos[lead_at + 1:]:
        inputs = reads(info.node)
        if info.name in taken or not produced.intersection(inputs):
            continue
        other = registry.get(info.op_key)
        if other is None or other.group_kind != kind:
            continue
        if any(i not in produced and i not in model.initializers and made_by.get(i, -1) >= lead_at for i in inputs):
            continue
        info, reason = _with_spec(other, info)
        if reason or _support(other, info, device) is not None:
            continue
        candidate = _node_group([*members, info], readers, model, visible)
        if _admitted(plugin, candidate, device):
            members.append(info)
            produced.update(o for o in info.node.output if o)
    return _node_group(members, readers, model, visible)


def _node_group(members: list[NodeInfo], readers: dict[str, list[NodeInfo]], model: Model, visible: set[str]) -> NodeGroup:
    """The members with what they read from outside (weights left out), and what is read of them outside
    or `visible` (graph outputs, kept tensors)."""
    names = {m.name for m in members}
    written = [o for m in members for o in m.node.output if o]
    outputs = [o for o in written if o in visible or any(r.name not in names for r in readers.get(o, []))]
    return NodeGroup(tuple(members), tuple(outside_inputs([m.node for m in members], model)), tuple(outputs))


def _view_of(plugin: Plugin | None, info: NodeInfo, output: str):
    try:
        return None if plugin is None else plugin.view_of(info, output)
    except Exception:  # a plugin that cannot judge its node offers no view
        return None


def _not_in_place(view: InputView, axis: int) -> tuple[NodeInfo, ...]:
    """The fewest first nodes of `view` without which the rest reads in place for a Concat along `axis`
    (input_views.reads_in_place): all of them where not even its last node does."""
    for first in range(len(view.nodes)):
        rest = InputView(view.operand, view.nodes[first].node.input[0], view.nodes[first:], view.views[first:])
        if reads_in_place(rest, tuple(map(int, view.nodes[first].inputs[0].shape)), axis):
            return view.nodes[:first]
    return view.nodes


def _reads_views(plugin: Plugin | None, info: NodeInfo, followers: list[NodeInfo]) -> bool:
    try:
        return plugin is not None and plugin.reads_views(info, followers)
    except Exception:  # a plugin that cannot judge its node reads no views
        return False


def _admitted(plugin: Plugin, group: NodeGroup, device: Device) -> bool:
    try:
        return plugin.admits(group, device) is None
    except Exception:  # a plugin that cannot judge a group does not get it
        return False


def _readers(infos: list[NodeInfo]) -> dict[str, list[NodeInfo]]:
    readers: dict[str, list[NodeInfo]] = {}
    for info in infos:
        for name in reads(info.node):  # an If reading a tensor in its branch reads it too
            readers.setdefault(name, []).append(info)
    return readers


def _fusion(
    plugin: Plugin,
    info: NodeInfo,
    readers: dict[str, list[NodeInfo]],
    made_by: dict[str, int],
    graph_outputs: set[str],
    device: Device,
    registry: dict[str, Plugin],
) -> tuple[list[NodeInfo], str | None]:
    """The nodes after `info` that its plugin runs in the same kernel: a chain in
    which each node is the only reader of the one-output node before it (or the pair
    x * f(x)), and no intermediate tensor is a graph output (the fused kernel never
    writes it). A built-in plugin for a follower's op type never stops the fusion (a
    MaxPool the Conv kernel can pool stays inside it; one it cannot runs as the pool
    plugin's own step). A user's or third party's plugin does: a kernel someone
    registered for an op runs that op's nodes. When that cuts short a fusion, the
    second item says so (else None)."""
    chain, ends = _fusable_chain(info, readers, made_by, graph_outputs, getattr(plugin, "max_followers", MAX_FOLLOWERS))
    mine = next((i for i, follower in enumerate(chain) if follower.op_key in registry and not is_builtin(registry[follower.op_key])),
                len(chain))
    count = _fuse_count(plugin, info, chain[:mine], device, ends)
    possible = _fuse_count(plugin, info, chain, device, ends) if mine < len(chain) else 0
    if possible > mine:
        follower = chain[mine]
        would = OP_SEPARATOR.join([info.op_type, *(f.op_type for f in chain[:possible])])
        return chain[:count], (f"{would} not fused: a plugin is registered for {follower.op_type}, "
                               f"so {follower.name} runs as a step of its own")
    return chain[:count], None


# A residual Add, an activation of two nodes (x * Sigmoid(x)) and a pool: the longest epilogue
MAX_FOLLOWERS = 4


def _fusable_chain(
    info: NodeInfo, readers: dict[str, list[NodeInfo]], made_by: dict[str, int], graph_outputs: set[str], limit: int = MAX_FOLLOWERS
) -> tuple[list[NodeInfo], set[int]]:
    """Up to `limit` nodes after `info` (MAX_FOLLOWERS, or the plugin's `max_followers`: a fused attention's
    chain is longer), and the lengths the chain may be cut at.

    Each link is the only reader of the one-output node before it, reading it first and then
    only constants or tensors written before `info` runs (attention's V), so that the fused step
    can read them; or an Add / two-input Sum whose other operand (a residual) is written before
    `info` runs; or two nodes computing x * f(x), the only readers of x (SiLU; a cut never
    separates them)."""
    chain: list[NodeInfo] = []
    ends = {0}
    current = info
    lead_at = min((made_by.get(o, -1) for o in info.node.output if o), default=-1)
    while len(chain) < limit:
        outputs = [o for o in current.node.output if o]
        if len(outputs) != 1 or outputs[0] in graph_outputs:
            break
        link = _next_link(outputs[0], readers, graph_outputs, lead_at, made_by)
        if not link or len(chain) + len(link) > limit:
            break
        chain += link
        ends.add(len(chain))
        current = link[-1]
    return chain, ends


def _next_link(value: str, readers: dict[str, list[NodeInfo]], graph_outputs: set[str], lead_at: int,
               made_by: dict[str, int]) -> list[NodeInfo]:
    """The node(s) that may fuse after the node writing `value` (see _fusable_chain); [] for none."""
    after = readers.get(value, [])
    if len(after) == 2:
        return _value_times_function_of_it(value, after, readers, graph_outputs)
    if len(after) != 1:
        return []
    follower = after[0]
    inputs = [i for i in follower.node.input if i]
    if follower.op_type in ("Add", "Sum") and len(inputs) == 2 and value in inputs:
        # the other operand must be there when the fused step runs: written before its lead node
        other = inputs[1 - inputs.index(value)]
        return [follower] if other != value and made_by.get(other, -1) < lead_at else []
    # the output, then constants (a Clip's bounds, which the fused kernel compiles in) or tensors written
    # before the lead node (attention's V after its Softmax), which the fused step reads
    if inputs[:1] != [value] or any(i not in follower.constants and (i == value or made_by.get(i, -1) >= lead_at)
                                    for i in inputs[1:]):
        return []
    return [follower]


def _value_times_function_of_it(value: str, pair: list[NodeInfo], readers: dict[str, list[NodeInfo]],
                                graph_outputs: set[str]) -> list[NodeInfo]:
    """[f, g] when the two readers of `value` are f, reading `value` alone, and g, reading `value`
    and f's output, f's one reader (SiLU: x * Sigmoid(x)); the plugin says whether it runs them."""
    for f, g in (pair, pair[::-1]):
        f_inputs, f_outputs = [i for i in f.node.input if i], [o for o in f.node.output if o]
        if f_inputs != [value] or len(f_outputs) != 1 or f_outputs[0] in graph_outputs:
            continue
        f_readers = readers.get(f_outputs[0], [])
        if len(f_readers) == 1 and f_readers[0] is g and sorted(i for i in g.node.input if i) == sorted([value, f_outputs[0]]):
            return [f, g]
    return []


def step_inputs(node: NodeInfo, followers: list[NodeInfo], model: Model) -> list[str]:
    """What a plugin step's kernel is given: the node's own inputs, then the tensors its
    fused followers read from outside the chain (a residual). Before those, the node's
    inputs are padded with "" to its op's formal inputs, so each keeps its place (a
    Conv without bias: [X, W, "", residual])."""
    produced = {o for n in [node, *followers] for o in n.node.output if o}
    extra = [i for f in followers for i in f.node.input if i and i not in produced and i not in model.initializers]
    inputs = list(node.node.input)
    if extra:
        try:
            formal = len(onnx.defs.get_schema(node.op_type, domain=node.node.domain).inputs)
        except onnx.defs.SchemaError:
            formal = len(inputs)
        inputs += [""] * (formal - len(inputs))
    return inputs + list(dict.fromkeys(extra))


def _fuse_count(plugin: Plugin, info: NodeInfo, chain: list[NodeInfo], device: Device, ends: set[int]) -> int:
    """How many of `chain` the plugin fuses, cut back to a length in `ends`."""
    try:
        count = plugin.fuse(info, chain, device) if chain else 0
    except Exception:  # a plugin that cannot judge a chain does not fuse it
        return 0
    return max(end for end in ends if end <= count)


def _with_spec(plugin: Plugin, info: NodeInfo) -> tuple[NodeInfo, str | None]:
    """The node with the plugin's record of it (made here, once), or the reason the plugin cannot read it."""
    try:
        return replace(info, spec=plugin.make_spec(info)), None
    except PluginError as err:
        return info, str(err)
    except Exception as err:  # a plugin that cannot read a node does not get it
        return info, f"{type(err).__name__}: {err}"


def _support(plugin: Plugin, info: NodeInfo, device: Device) -> str | None:
    empty = None if plugin.empty_tensors else _empty_tensor(info)
    if empty is not None:
        return empty
    try:
        return plugin.supports(info, device)
    except Exception as err:  # a plugin that cannot judge a node does not get it
        return f"{type(err).__name__}: {err}"


def _empty_tensor(info: NodeInfo) -> str | None:
    """Why a node with an empty tensor (an axis of size 0) stays with onnxruntime, which runs such
    nodes as ONNX says (an empty result), where its plugin does not declare `empty_tensors`. A node
    onnxruntime does not know (a custom op) stays with its plugin."""
    empty = next((t for t in [*info.inputs, *info.outputs] if t.name and 0 in t.shape), None)
    if empty is None or not known_ops.runs(info.node):
        return None
    return f"{empty.name} is empty ({list(empty.shape)}): onnxruntime runs nodes with empty tensors"


def _consumers_after(groups: list, fused: dict[str, list[NodeInfo]], graph_outputs: list[str],
                     prologues: dict[str, list[NodeInfo]], views: dict[str, list[InputView]]) -> list[set[str]]:
    """For each group, the tensor names read by any later group (a plugin step's fused
    followers and prologue too: a residual Add reads its other operand) or by the graph's outputs."""
    needed: set[str] = set(graph_outputs)
    after: list[set[str]] = [set() for _ in groups]
    for index in range(len(groups) - 1, -1, -1):
        after[index] = set(needed)
        group = groups[index]
        members = ([*(n for view in views.get(group.name, []) for n in view.nodes), *prologues.get(group.name, []), group,
                    *fused.get(group.name, [])] if isinstance(group, NodeInfo) else group)
        for info in members:
            needed.update(reads(info.node))
    return after


def outside_inputs(nodes: list[onnx.NodeProto], model: Model) -> list[str]:
    """The tensors `nodes` read that none of them writes, weights left out, in order of first use;
    what their subgraphs read of the graph too (an If's branch reading a tensor by name)."""
    produced = {o for n in nodes for o in n.output if o}
    return list(dict.fromkeys(i for n in nodes for i in reads(n) if i not in produced and i not in model.initializers))


def sub_model(
    model: Model, name: str, nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str], tensors: dict[str, TensorInfo]
) -> onnx.ModelProto:
    def value_info(tensor: str) -> onnx.ValueInfoProto:
        info = tensors[tensor]
        shape = [d if d >= 0 else None for d in info.shape]
        return helper.make_tensor_value_info(tensor, helper.np_dtype_to_tensor_dtype(info.dtype), shape)

    used = dict.fromkeys(i for n in nodes for i in reads(n) if i in model.initializers)
    initializers = [numpy_helper.from_array(model.initializers[name], name) for name in used]
    graph = helper.make_graph(
        nodes, name, [value_info(i) for i in inputs], [value_info(o) for o in outputs], initializer=initializers
    )
    sub = helper.make_model(graph, opset_imports=list(model.bare.opset_import), producer_name="opplugin",
                            functions=list(model.bare.functions))  # a node may call a model-local function
    sub.ir_version = max(model.bare.ir_version, 4)  # from IR 4 on, initializers need not be graph inputs
    return sub
