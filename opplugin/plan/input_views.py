"""Input views: layout nodes that need no step of their own, because the step reading their output
applies them to its input as views: any of them where its kernel reads strided operands as they lie (its
plugin's `reads_views`: the fused attention, a Concat), reshapes for every other step.

Between a QKV projection and the attention, exporters write a Reshape, a Transpose that moves the
heads forward, a Slice or Split and a Squeeze per operand, and a Transpose of K: each a pass over
memory as a step of its own, though every one of them only re-indexes its input. Here, walking back
from each tensor a step reads, the producers that are views of their input (their plugin's `view_of`)
join the step while every tensor they write is read by the step or by other nodes that join it, and
is no graph output or kept tensor. The step is then handed the first input of each chain, and applies
the chain as views before its kernel runs (InputViewsKernel): no copy, no launch. A step whose kernel
reads C-contiguous operands only is handed a copy where a view is not contiguous.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Sequence

import numpy as np

from ..gpu import cuda
from ..registry import Kernel, NodeInfo

View = Callable[[Any], Any]
ViewOf = Callable[[NodeInfo, str], "View | None"]  # a node's plugin's view_of

# what a step whose kernel reads strided operands takes in; what any other step takes (a reshape of a
# contiguous tensor is a contiguous view)
STRIDED_VIEWS = frozenset({"Transpose", "Slice", "Split", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


@dataclass(frozen=True)
class InputView:
    """The tensor `operand` a step's kernel reads, made from `source` by `nodes` (in order), each a view
    (`views`: each node's function from its input's array to its output's)."""

    operand: str
    source: str
    nodes: tuple[NodeInfo, ...]
    views: tuple[View, ...] = field(compare=False, repr=False)

    def describe(self) -> str:
        return f"{self.operand} = {' > '.join(n.op_type for n in self.nodes)} of {self.source}"

    def function(self) -> View:
        """The array of `source` -> the view the kernel reads as `operand`: the nodes' views one after the
        other, except that a Reshape merging axes, a Transpose of the merged axes and a Reshape splitting
        them back (how exporters transpose K per head: (N, H, T, D) > (N H, T, D) > (N H, D, T) >
        (N, H, D, T)) become one Transpose of the unmerged axes, which stays a view where the merge of
        strided axes would copy."""
        steps: list[View] = []
        at = 0
        while at < len(self.nodes):
            perm = _merged_transpose(*self.nodes[at:at + 3]) if at + 3 <= len(self.nodes) else None
            if perm is not None:
                steps.append(lambda x, perm=perm: x.transpose(perm))
                at += 3
            else:
                steps.append(self.views[at])
                at += 1

        def apply(x: Any) -> Any:
            for step in steps:
                x = step(x)
            return x

        return apply


def _whole_slice(node: NodeInfo) -> bool:
    """A Slice that keeps all of its input (an export's crop back to a size the tensor already has): the
    input itself, which any step may read in its place."""
    steps = getattr(node.spec, "steps", None)
    return (node.op_type == "Slice" and steps is not None and all(step > 0 for step in steps)
            and tuple(node.inputs[0].shape) == tuple(node.outputs[0].shape))


def _merged_transpose(first: NodeInfo, middle: NodeInfo, last: NodeInfo) -> tuple[int, ...] | None:
    """The Transpose of `first`'s input that Reshape `first`, Transpose `middle`, Reshape `last` make, where
    `first` only merges runs of neighbouring axes and `last` splits each back; else None."""
    if [n.op_type for n in (first, middle, last)] != ["Reshape", "Transpose", "Reshape"]:
        return None
    source, merged, result = (tuple(int(d) for d in shape) for shape in (first.inputs[0].shape, first.outputs[0].shape, last.outputs[0].shape))
    groups: list[list[int]] = []
    axis = 0
    for extent in merged:
        group, size = [], 1
        while axis < len(source) and (not group or size < extent):
            group.append(axis)
            size *= source[axis]
            axis += 1
        if size != extent:
            return None
        groups.append(group)
    perm = tuple(int(p) for p in middle.attributes.get("perm", range(len(merged) - 1, -1, -1)))
    if axis != len(source) or sorted(perm) != list(range(len(merged))):
        return None
    unmerged = tuple(a for p in perm for a in groups[p])
    return unmerged if tuple(source[a] for a in unmerged) == result else None


def find_input_views(step_nodes: Iterable[NodeInfo], operands: Iterable[str], candidates: dict[str, NodeInfo],
                     readers: dict[str, list[NodeInfo]], visible: set[str], view_of: ViewOf,
                     kinds: frozenset[str] = STRIDED_VIEWS, taken: Container[str] = ()) -> list[InputView]:
    """The views of the operands of the step running `step_nodes`. `candidates`: tensor -> the node writing it,
    for the nodes that may join (steps of their own, fusing nothing), but those named in `taken` (joined
    to another step already); `readers`: tensor -> the nodes reading it; `kinds`: the op types that may join."""
    inside = {n.name for n in step_nodes}
    operands = list(dict.fromkeys(o for o in operands if o))
    views: dict[tuple[str, str], View | None] = {}

    def view(node: NodeInfo, tensor: str) -> View | None:
        if (node.name, tensor) not in views:
            views[node.name, tensor] = view_of(node, tensor) if node.op_type in kinds or _whole_slice(node) else None
        return views[node.name, tensor]

    def chain_of(operand: str, allowed: Container[str] | None) -> list[tuple[NodeInfo, View]]:
        chain, tensor = [], operand
        while tensor in candidates and tensor not in visible:
            node = candidates[tensor]
            made = view(node, tensor)
            if node.name in taken or (allowed is not None and node.name not in allowed) or made is None:
                break
            chain.insert(0, (node, made))
            tensor = node.node.input[0]
        return chain

    def joining(allowed: Container[str] | None) -> dict[str, NodeInfo]:
        return {n.name: n for operand in operands for n, _ in chain_of(operand, allowed)}

    joined = joining(None)
    while True:  # drop each node something outside reads, and with it what lies before it on every chain
        reads_outside = {name for name, node in joined.items() for o in node.node.output if o
                         and (o in visible or any(r.name not in inside and r.name not in joined for r in readers.get(o, [])))}
        kept = joining(joined.keys() - reads_outside)
        if kept.keys() == joined.keys():
            break
        joined = kept
    return [InputView(operand, chain[0][0].node.input[0], tuple(n for n, _ in chain), tuple(v for _, v in chain))
            for operand in operands if (chain := chain_of(operand, joined))]


def reads_in_place(view: InputView, shape: tuple[int, ...], axis: int) -> bool:
    """Whether `view`, applied to a C-contiguous tensor of `shape` (its source's), is rows of contiguous runs
    from `axis` on, as a Concat along `axis` reads an input in place; else the Concat would copy it first,
    where the node's own step writes it into the Concat's buffer at no extra cost (runtime/buffers.py)."""
    # Real (untouched, so unpaged) memory: a Reshape that cannot be a view copies, reading all of it
    probe = np.empty(shape, np.float32)
    try:
        seen = view.function()(probe)
    except ValueError:  # a view that refuses to copy
        return False
    if not np.shares_memory(seen, probe) and seen.size:
        return False
    inner = [(d, s // 4) for d, s in zip(seen.shape[axis:], seen.strides[axis:]) if d != 1]
    run = 1
    for extent, stride in reversed(inner):
        if stride != run:
            return False
        run *= extent
    return True


def _contiguous(view: View) -> View:
    def apply(x: Any) -> Any:
        y = view(x)
        if y.flags.c_contiguous:
            return y
        return np.ascontiguousarray(y) if isinstance(y, np.ndarray) else y.copy(order="C")

    return apply


class InputViewsKernel(Kernel):
    """A kernel handed views of the step's inputs: `views[i]` (when not None) takes input i to the operand
    the inner kernel reads there, copied C-contiguous with `contiguous` where it is not. Everything else is
    the inner kernel's."""

    replayable = False  # each call makes new view objects; the inner kernel launches from them
    # input_slices stays None: a Concat reading views is no in-place Concat, whose producers would write
    # their outputs straight into its buffer (runtime/buffers.py), for its inputs are views of other tensors

    def __init__(self, inner: Kernel, views: Sequence[View | None], contiguous: bool = False):
        self.inner = inner
        self.views = [view if view is None or not contiguous else _contiguous(view) for view in views]
        self.name, self.variant, self.nonfinite_exact = inner.name, getattr(inner, "variant", None), inner.nonfinite_exact
        self.device_work, self.out_view, self.flags_nonfinite = inner.device_work, inner.out_view, inner.flags_nonfinite

    def __getattr__(self, name: str) -> Any:  # functions and what else a caller asks of the inner kernel
        return getattr(self.__dict__["inner"], name)

    def flops(self, batch: int) -> int:
        return self.inner.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.inner.bytes_moved(batch)

    def workspace_bytes(self, batch: int) -> int:
        return self.inner.workspace_bytes(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, **options: Any) -> list[Any]:
        on_host = any(isinstance(x, np.ndarray) for x in inputs)
        with cuda.on_stream(None if on_host else stream):  # a view that must be copied is copied there
            operands = [x if view is None or x is None else view(x) for x, view in zip(inputs, self.views)]
        return self.inner(operands + list(inputs[len(operands):]), stream, **options)
