"""The tensors a plan keeps (a run hands them back: Runner's `keep`, --keep): each name checked
against the graph as it runs, or refused in one line saying why (loading removed it, it is a
weight, no tensor has that name). partition.py then lets no step hide one: a fusion or prologue
that would is given up, and said so; a group or an onnxruntime step writes it out."""
from __future__ import annotations

import difflib
from typing import Sequence

from ..errors import InputError
from ..graph.model import Model
from ..registry import NodeInfo
from ..core.texttable import OP_SEPARATOR


def checked_keep(model: Model, names: Sequence[str], what: str = "cannot keep") -> tuple[str, ...]:
    """`names` without repeats, each a graph input or a tensor a node of the graph (as it runs,
    after load-time simplification) writes; else an InputError starting with `what` and the name."""
    written = {o for node in model.nodes for o in node.output if o}
    inputs = {value.name for value in model.inputs}
    for name in dict.fromkeys(names):
        if name not in written and name not in inputs:
            raise InputError(f"{what} {name}: {_why_absent(model, name, written | inputs)}")
    return tuple(dict.fromkeys(names))


def _why_absent(model: Model, name: str, tensors: set[str]) -> str:
    removed = model.simplification.removed.get(name)
    if removed is not None:
        same = _same_values(model, name, tensors)
        return (removed + (f"; {same} holds the same values" if same else "")
                + f"; load_model(..., keep=[{name!r}]) leaves that rewrite out, as --keep does")
    if name in model.initializers:
        return f"it is a weight of {model.name} (a constant), not computed by a run"
    near = difflib.get_close_matches(name, sorted(tensors), n=3)
    return f"{model.name} has no tensor of that name" + (f" (did you mean {', '.join(near)}?)" if near else "")


def _same_values(model: Model, name: str, tensors: set[str]) -> str | None:
    """The tensor that still holds `name`'s values where an Identity or Dropout between them was dropped."""
    for node in model.original.graph.node:
        if node.op_type in ("Identity", "Dropout") and node.input and node.output:
            pair = (node.input[0], node.output[0])
            if name in pair:
                other = pair[1 - pair.index(name)]
                if other in tensors:
                    return other
    return None


def given_up_for_keep(nodes: Sequence[NodeInfo], hidden: Sequence[str], keep: frozenset[str], where: str) -> str | None:
    """Why fusing `nodes` was given up, where one of `hidden` (the tensors the fused kernel would
    not write) is kept; None where none is. `where` says what the fusion was (an epilogue, a prologue)."""
    kept = [name for name in hidden if name in keep]
    if not kept:
        return None
    chain = OP_SEPARATOR.join(n.op_type for n in nodes)
    verb, pronoun = ("is", "it") if len(kept) == 1 else ("are", "them")
    return f"{chain} not fused{where}: {', '.join(kept)} {verb} kept, and the fused kernel would not write {pronoun}"


def hidden_outputs(nodes: Sequence[NodeInfo], last_written: bool) -> list[str]:
    """The tensors of `nodes` a kernel running them all would not write: every output, but the last
    node's where `last_written` (an epilogue's end, which leaves the step)."""
    inner = nodes[:-1] if last_written else nodes
    return [o for n in inner for o in n.node.output if o]

