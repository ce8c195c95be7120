"""Prologue fusion: pointwise nodes before a plugin node that its kernel applies to the input
values it loads (a Conv's prologue, ops/conv/prologue.py), so they need no step of their own.

A chain of up to MAX_PROLOGUE nodes ending in the tensor a plugin node reads as its first
input is offered to that node's plugin (its `fuse_prologue`, where it declares a `prologue_input`) when:
- each node's output is read by the next node alone (the last's by the plugin node alone) and is
  no graph output: the fused kernel never writes it;
- each node transforms one tensor (its *data* input: the first that is no constant and has the
  node's shape; for a Reshape, a Gather or a Pad, its first input), the data input of the next being the output
  of the one before;
- an epilogue cannot take the chain instead: the first node's data input has another reader, or
  its producer's plugin fuses none of the chain (a Relu after a Conv goes to that Conv's epilogue);
  where the plan's epilogue fusion takes a node of it after all (the second of x * Sigmoid(x),
  which reads x twice), the prologue gives way (`give_way`).
The longest chain the plugin accepts is taken. The fused step then reads the chain's data input
in place of the node's first input, and the tensors the chain reads besides it (a scale) from the
plugin's `prologue_input` on.
"""
from __future__ import annotations

from typing import Sequence

from ..gpu.device import Device
from ..registry import NodeInfo, Plugin

# a BatchNormalization and its activation; a LayerNorm, then a row gather between Reshapes, after a Pad of a
# zero row (a flat product's)
MAX_PROLOGUE = 5
MOVED_WHOLE = ("Reshape", "Gather", "Pad")  # nodes whose first input is what they transform, into another shape


def find_prologues(infos: list[NodeInfo], readers: dict[str, list[NodeInfo]], made_by: dict[str, int], graph_outputs: set[str],
                   device: Device, registry: dict[str, Plugin]) -> dict[str, list[NodeInfo]]:
    """Plugin node name -> the nodes (graph order) its kernel applies to its first input."""
    taken: dict[str, list[NodeInfo]] = {}
    claimed: set[str] = set()
    for info in infos:
        plugin = registry.get(info.op_key)
        if plugin is None or plugin.prologue_input is None or not info.node.input or not info.node.input[0]:
            continue
        chain = _candidate_chain(info, infos, readers, made_by, graph_outputs, claimed)
        for length in range(len(chain), 0, -1):
            nodes = chain[-length:]
            if _epilogue_could_take(nodes, infos, readers, made_by, device, registry):
                continue
            if _accepted(plugin, info, nodes, device):
                taken[info.name] = nodes
                claimed.update(n.name for n in nodes)
                break
    return taken


def _candidate_chain(info: NodeInfo, infos: list[NodeInfo], readers: dict[str, list[NodeInfo]], made_by: dict[str, int],
                     graph_outputs: set[str], claimed: set[str]) -> list[NodeInfo]:
    """Up to MAX_PROLOGUE nodes before `info`, in graph order, each the only reader's producer (see the module)."""
    chain: list[NodeInfo] = []
    value, reader = info.node.input[0], info
    while len(chain) < MAX_PROLOGUE and value in made_by and value not in graph_outputs:
        if [r.name for r in readers.get(value, [])] != [reader.name]:
            break
        producer = infos[made_by[value]]
        if producer.name in claimed or [o for o in producer.node.output if o] != [value] or data_input(producer) is None:
            break
        chain.insert(0, producer)
        value, reader = data_input(producer), producer
    return chain


def give_way(prologues: dict[str, list[NodeInfo]], followers: Sequence[NodeInfo], taken: set[str]) -> None:
    """Drop the prologues that share a node with an epilogue the plan fuses (`followers`): its other
    nodes leave `taken`, to be planned as if no prologue had claimed them (they come later in graph order)."""
    names = {f.name for f in followers}
    for node, chain in list(prologues.items()):
        if names.intersection(n.name for n in chain):
            del prologues[node]
            taken.difference_update(n.name for n in chain)


def _epilogue_could_take(chain: Sequence[NodeInfo], infos: list[NodeInfo], readers: dict[str, list[NodeInfo]],
                         made_by: dict[str, int], device: Device, registry: dict[str, Plugin]) -> bool:
    """Whether the producer of the chain's data input could fuse the chain's first node into its epilogue instead."""
    data = data_input(chain[0])
    if data not in made_by or len(readers.get(data, [])) != 1:
        return False
    producer = infos[made_by[data]]
    plugin = registry.get(producer.op_key)
    try:
        return plugin is not None and plugin.fuse(producer, list(chain), device) > 0
    except Exception:  # a plugin that cannot judge a chain fuses none of it
        return False


def _accepted(plugin: Plugin, info: NodeInfo, chain: Sequence[NodeInfo], device: Device) -> bool:
    try:
        return bool(plugin.fuse_prologue(info, chain, data_input(chain[0]), device))
    except Exception:  # a plugin that cannot judge a chain does not take it
        return False


def prologue_inputs(chain: Sequence[NodeInfo], at: int, inputs: list[str], initializers) -> list[str]:
    """A fused step's inputs: `inputs` (the node's own, then its epilogue's) with the first replaced by
    the chain's data input and, from place `at` on (padded with ""), what else the chain reads."""
    produced = {o for n in chain for o in n.node.output if o}
    data = data_input(chain[0])
    extra = [i for n in chain for i in n.node.input if i and i not in produced and i != data and i not in initializers]
    inputs = [data, *inputs[1:]]
    if extra:
        inputs += [""] * (at - len(inputs))
    return inputs + list(dict.fromkeys(extra))


def data_input(node: NodeInfo) -> str | None:
    """The tensor a prologue node transforms: a pointwise node's data input, or a Reshape's, Gather's or Pad's first input."""
    if node.op_type in MOVED_WHOLE and node.node.domain in ("", "ai.onnx") and node.node.input and node.node.input[0]:
        return node.node.input[0]
    return node.data_input()
