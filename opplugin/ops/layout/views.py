"""Transpose, Slice, Split and Gather as strided views: how a node's output is its data input seen
through other strides (NumPy's and CuPy's transpose and basic slicing), so that a step reading it can
apply the node itself, with no copy and no step for it (LayoutPlugin.view_of, plan/input_views.py).

`view_of(node, output)` gives the function from the input array to the output's view, or None for a
node that is none (a Concat, a Pad, a Resize, a Gather of uneven indices, bounds computed at run time).
"""
from __future__ import annotations

from typing import Any, Callable

from ...errors import PluginError
from ...registry import NodeInfo
from .spec import GatherSpec, SliceSpec, SplitSpec, TransposeSpec

View = Callable[[Any], Any]


def view_of(node: NodeInfo, output: str) -> View | None:
    """The function taking the node's data input (its first input) to `output`, a view of it; None where
    the node is not one."""
    maker = _MAKERS.get(node.op_type)
    if maker is None or not node.inputs or not node.inputs[0].name:
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
    count = spec.indices().size
    taken = (*lead, slice(spec.first, spec.first + spec.step * count, spec.step))
    return lambda x: x[taken].reshape(spec.output_shape(tuple(x.shape)))


_MAKERS: dict[str, Callable[[NodeInfo, int], View]] = {"Transpose": _transpose, "Slice": _slice, "Split": _split, "Gather": _gather}
