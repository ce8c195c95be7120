"""Layout nodes as strided views: how a node's output is its data input seen through other strides
(NumPy's and CuPy's transpose, basic slicing and reshape), so that a kernel that reads its operands
as they lie needs no copy and no step for them (plan/input_views.py).

`view_of(node, output)` gives the function from the input array to the output's view, or None for a
node that is no view (a Concat, a Pad, a Gather of uneven indices, a shape computed at run time). A
Reshape that merges axes not lying one after another cannot be a view: there CuPy's reshape copies,
as the node's own step would have.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...errors import PluginError
from ...gpu import cuda
from ...registry import Kernel, NodeInfo
from ..specs import spec_of
from ..view import ReshapePlugin, SqueezePlugin, UnsqueezePlugin, flatten_shape, reshape_shape
from .spec import GatherSpec, SliceSpec, SplitSpec, TransposeSpec

View = Callable[[Any], Any]


def view_of(node: NodeInfo, output: str) -> View | None:
    """The function taking the node's data input (its first input) to `output`, a view of it; None where
    the node is not one."""
    maker = _MAKERS.get(node.op_type)
    if maker is None or node.node.domain not in ("", "ai.onnx") or not node.inputs or not node.inputs[0].name:
        return None
    try:
        return maker(node, [o.name for o in node.outputs].index(output))
    except (PluginError, KeyError, ValueError):
        return None


def _transpose(node: NodeInfo, _output: int) -> View:
    perm = TransposeSpec.from_node(node).perm
    return lambda x: x.transpose(perm)


def _slice(node: NodeInfo, _output: int) -> View:
    spec = SliceSpec.from_node(node)
    return lambda x: x[spec.slices(x.shape)]


def _split(node: NodeInfo, output: int) -> View:
    spec = SplitSpec.from_node(node)
    return lambda x: x[spec.slices(x.shape)[output]]


def _gather(node: NodeInfo, _output: int) -> View:
    spec = GatherSpec.from_node(node)
    lead = (slice(None),) * spec.axis
    if not spec.index_shape:  # one index: the axis goes
        return lambda x: x[(*lead, spec.first)]
    count = len(spec.indices().reshape(-1))
    taken = (*lead, slice(spec.first, spec.first + spec.step * count, spec.step))
    return lambda x: x[taken].reshape(spec.output_shape(tuple(x.shape)))


def _reshaped(target: Callable[[tuple[int, ...]], tuple[int, ...]]) -> View:
    return lambda x: x.reshape(target(tuple(x.shape)))


def _reshape(node: NodeInfo, _output: int) -> View:
    if ReshapePlugin().supports(node, None) is not None or node.inputs[0].dtype != node.outputs[0].dtype:
        raise PluginError("not a view")
    shape = [int(d) for d in np.asarray(node.constants[node.inputs[1].name]).reshape(-1)]
    allowzero = bool(node.attributes.get("allowzero", 0))
    return _reshaped(lambda s: reshape_shape(shape, allowzero, s))


def _squeeze(node: NodeInfo, _output: int) -> View:
    axes = set(spec_of(node, SqueezePlugin().make_spec))
    return _reshaped(lambda s: tuple(d for a, d in enumerate(s) if a not in axes))


def _unsqueeze(node: NodeInfo, _output: int) -> View:
    axes = spec_of(node, UnsqueezePlugin().make_spec)

    def target(shape: tuple[int, ...]) -> tuple[int, ...]:
        dims = list(shape)
        for axis in axes:
            dims.insert(axis, 1)
        return tuple(dims)

    return _reshaped(target)


def _flatten(node: NodeInfo, _output: int) -> View:
    axis = int(node.attributes.get("axis", 1))
    return _reshaped(lambda s: flatten_shape(axis, s))


_MAKERS: dict[str, Callable[[NodeInfo, int], View]] = {
    "Transpose": _transpose, "Slice": _slice, "Split": _split, "Gather": _gather, "Reshape": _reshape,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Flatten": _flatten, "Identity": lambda node, _output: (lambda x: x),
}


def chain_view(links: Sequence[tuple[NodeInfo, str]]) -> View:
    """The view a chain makes, each link (node, its output) reading the one before's output: view_of's,
    one after the other, except that a Reshape merging axes, a Transpose of the merged axes and a Reshape
    splitting them back (how exporters transpose K per head: (N, H, T, D) > (N H, T, D) > (N H, D, T) >
    (N, H, D, T)) become one Transpose of the unmerged axes, which stays a view where the merge of
    strided axes would copy."""
    views: list[View] = []
    at = 0
    while at < len(links):
        perm = _merged_transpose(*(node for node, _ in links[at:at + 3])) if at + 3 <= len(links) else None
        if perm is not None:
            views.append(lambda x, perm=perm: x.transpose(perm))
            at += 3
            continue
        view = view_of(*links[at])
        if view is None:
            raise PluginError(f"{links[at][0].name} ({links[at][0].op_type}) is no view of its input")
        views.append(view)
        at += 1

    def apply(x: Any) -> Any:
        for view in views:
            x = view(x)
        return x

    return apply


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
    if axis != len(source):
        return None
    try:
        perm = TransposeSpec.from_node(middle).perm
    except PluginError:
        return None
    unmerged = tuple(a for p in perm for a in groups[p])
    return unmerged if tuple(source[a] for a in unmerged) == result else None


class InputViewsKernel(Kernel):
    """A kernel that reads strided operands, handed views of the step's inputs: `views[i]` (when not
    None) takes input i to the operand the inner kernel reads there. Everything else is the inner kernel's."""

    replayable = False  # each call makes new view objects; the inner kernel launches from them

    def __init__(self, inner: Kernel, views: Sequence[View | None]):
        self.inner, self.views = inner, list(views)

    def __getattr__(self, name: str) -> Any:  # name, flags, functions ...: the inner kernel's
        return getattr(self.__dict__["inner"], name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def variant(self) -> str | None:
        return getattr(self.inner, "variant", None)

    @property
    def nonfinite_exact(self) -> bool:
        return self.inner.nonfinite_exact

    @property
    def device_work(self) -> bool:
        return self.inner.device_work

    @property
    def out_view(self) -> str:
        return self.inner.out_view

    @property
    def flags_nonfinite(self) -> bool:
        return self.inner.flags_nonfinite

    def flops(self, batch: int) -> int:
        return self.inner.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.inner.bytes_moved(batch)

    def workspace_bytes(self, batch: int) -> int:
        return self.inner.workspace_bytes(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, **options: Any) -> list[Any]:
        on_host = any(isinstance(x, np.ndarray) for x in inputs)
        with cuda.on_stream(None if on_host else stream):  # a Reshape that cannot be a view copies there
            operands = [x if view is None or x is None else view(x) for x, view in zip(inputs, self.views)]
        return self.inner(operands + list(inputs[len(operands):]), stream, **options)
