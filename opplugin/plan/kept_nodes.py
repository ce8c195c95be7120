"""Which plan step computes each node of the graph as loaded: where a mixed-precision run keeps a node in FP32
(Runner's keep_fp32, a budget's choice by the node's name in the file), the step that computes it stays FP32.

A step names the nodes of the simplified graph it runs (PluginStep.kernel_nodes, OrtStep.nodes), and a node that
survives simplification keeps its name (graph/model.py names every node before it). A node that simplification
folds into another (a BatchNormalization into its Conv; GELU's Div, Add and Muls into one Gelu named after the
Erf) or drops (an Identity) is in no step by its name, but its values are computed all the same: by the node that
now writes a tensor downstream of it that the simplified graph still has (graph/simplify.py keeps tensor names,
and says which tensors it writes in another layout). That node's step holds it.
"""
from __future__ import annotations

from typing import Iterable

import onnx

from ..errors import InputError
from ..registry import node_name
from .partition import Plan, PluginStep, Step


def steps_holding(plan: Plan, nodes: Iterable[str], flag: str = "keep_fp32") -> dict[str, list[str]]:
    """Step name -> the nodes of `nodes` (names in the graph as loaded) it computes, in the order given. A name
    that is no node of the model is an InputError in one line, starting with `flag`."""
    by_node, by_tensor = _where_computed(plan)
    original = {node_name(n): n for n in plan.model.original.graph.node}
    readers = _readers(plan.model.original.graph)
    held: dict[str, list[str]] = {}
    for name in nodes:
        if name not in original:
            raise InputError(f"{flag} names {name!r}, which is no node of {plan.model.name}")
        for step in _steps_computing(original[name], original, readers, by_node, by_tensor):
            held.setdefault(step, []).append(name)
    return held


def nodes_computed_only_by(plan: Plan, steps: set[str]) -> set[str]:
    """The nodes of the graph as loaded (by name) whose values only `steps` compute, or no step at all (folded into
    constants at load, in FP32)."""
    by_node, by_tensor = _where_computed(plan)
    original = {node_name(n): n for n in plan.model.original.graph.node}
    readers = _readers(plan.model.original.graph)
    return {name for name, node in original.items() if _steps_computing(node, original, readers, by_node, by_tensor) <= steps}


def _steps_computing(start: onnx.NodeProto, original: dict[str, onnx.NodeProto], readers: dict[str, list[str]],
                     by_node: dict[str, str], by_tensor: dict[str, str]) -> set[str]:
    """The steps that compute `start`'s values: its own step where it survives, else those that write the first
    tensors downstream of it that the simplified graph still has."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        name = node_name(node)
        if name in seen:
            continue
        seen.add(name)
        if name in by_node:
            found.add(by_node[name])
            continue
        for tensor in (o for o in node.output if o):
            if tensor in by_tensor:
                found.add(by_tensor[tensor])
            else:  # taken into a later node: follow it to where its values still leave a node
                todo += [original[reader] for reader in readers.get(tensor, ())]
    return found


def _where_computed(plan: Plan) -> tuple[dict[str, str], dict[str, str]]:
    """(node name -> its step, tensor -> the step that writes it) over the simplified graph's nodes; a tensor written
    in another layout also under its name in the graph as loaded."""
    by_node: dict[str, str] = {}
    by_tensor: dict[str, str] = {}
    views = plan.model.simplification.views
    for step in plan.steps:
        for node in _nodes_of(step):
            by_node[node_name(node)] = step.name
            for tensor in (o for o in node.output if o):
                by_tensor[tensor] = step.name
                if tensor in views:
                    by_tensor.setdefault(views[tensor][0], step.name)
    return by_node, by_tensor


def _nodes_of(step: Step) -> list[onnx.NodeProto]:
    return [n.node for n in step.kernel_nodes] if isinstance(step, PluginStep) else list(step.nodes)


def _readers(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """Tensor -> the names of the nodes that read it."""
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for tensor in dict.fromkeys(i for i in node.input if i):
            readers.setdefault(tensor, []).append(node_name(node))
    return readers
