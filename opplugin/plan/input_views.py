"""Input views: layout nodes that need no step of their own, because the step reading their output has
a kernel that reads strided operands as they lie (its plugin's `reads_views`: the fused attention).

Between a QKV projection and the attention, exporters write a Reshape, a Transpose that moves the
heads forward, a Slice or Split and a Squeeze per operand, and a Transpose of K: each a pass over
memory as a step of its own, though every one of them only re-indexes its input. Here, walking back
from each tensor such a step reads, the producers that are views of their input (ops/layout/views.py)
join the step while every tensor they write is read by the step or by other nodes that join it, and
is no graph output or kept tensor. The step is then handed the first input of each chain, and applies
the chain as views before its kernel runs: no copy, no launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..ops.layout.views import chain_view, view_of
from ..registry import NodeInfo


@dataclass(frozen=True)
class InputView:
    """The tensor `operand` a step's kernel reads, made from `source` by `nodes` (in order), each a view."""

    operand: str
    source: str
    nodes: tuple[NodeInfo, ...]

    def describe(self) -> str:
        return f"{self.operand} = {' > '.join(n.op_type for n in self.nodes)} of {self.source}"

    def function(self) -> Callable:
        """The array of `source` -> the view the kernel reads as `operand` (ops/layout/views.py's chain_view)."""
        outputs = [*(n.node.input[0] for n in self.nodes[1:]), self.operand]
        return chain_view(list(zip(self.nodes, outputs)))


def find_input_views(step: NodeInfo, step_nodes: Iterable[NodeInfo], operands: Iterable[str], candidates: dict[str, NodeInfo],
                     readers: dict[str, list[NodeInfo]], visible: set[str]) -> list[InputView]:
    """The views of `step`'s operands. `candidates`: tensor -> the node writing it, for the nodes that may
    join (steps of their own, fusing nothing); `readers`: tensor -> the nodes reading it."""
    inside = {n.name for n in step_nodes}
    operands = list(dict.fromkeys(o for o in operands if o))
    by_name = {n.name: n for n in candidates.values()}

    def chain_of(operand: str, allowed: set[str] | None) -> list[NodeInfo]:
        chain, tensor = [], operand
        while tensor in candidates and tensor not in visible:
            node = candidates[tensor]
            if (allowed is not None and node.name not in allowed) or view_of(node, tensor) is None:
                break
            chain.insert(0, node)
            tensor = node.node.input[0]
        return chain

    joined = {n.name for operand in operands for n in chain_of(operand, None)}
    while True:  # drop each node something outside reads, and with it what lies before it on every chain
        reads_outside = {name for name in joined for o in by_name[name].node.output if o
                         and (o in visible or any(r.name not in inside and r.name not in joined for r in readers.get(o, [])))}
        kept = {n.name for operand in operands for n in chain_of(operand, joined - reads_outside)}
        if kept == joined:
            break
        joined = kept
    return [InputView(operand, chain[0].node.input[0], tuple(chain)) for operand in operands if (chain := chain_of(operand, joined))]
