"""Transpose, Slice, Split and Gather as strided views: how a node's output is its data input seen
through other strides (NumPy's and CuPy's transpose and basic slicing), so that a step reading it can
apply the node itself, with no copy and no step for it (LayoutPlugin.view_of, plan/input_views.py).

`view_of(op_type, spec, output)` gives the function from the input array to the output's view, or None
for an op whose outputs are no views (a Concat, a Pad, a Resize).
"""
from __future__ import annotations

from typing import Any, Callable

from .spec import GatherSpec, SliceSpec, SplitSpec, TransposeSpec

View = Callable[[Any], Any]


def view_of(op_type: str, spec: Any, output: int) -> View | None:
    """The function taking the node's data input (its first input) to its output number `output`, made
    from the node's spec (LayoutPlugin.make_spec); None where the op makes no views."""
    maker = _MAKERS.get(op_type)
    return None if maker is None else maker(spec, output)


def _transpose(spec: TransposeSpec, _output: int) -> View:
    return lambda x: x.transpose(spec.perm)


def _slice(spec: SliceSpec, _output: int) -> View:
    return lambda x: x[spec.slices(x.shape)]


def _split(spec: SplitSpec, output: int) -> View:
    return lambda x: x[spec.slices(x.shape)[output]]


def _gather(spec: GatherSpec, _output: int) -> View | None:
    if spec.table is not None:  # indices that do not step evenly: no strides say them
        return None
    lead = (slice(None),) * spec.axis
    if not spec.index_shape:  # one index: the axis goes
        return lambda x: x[(*lead, spec.first)]
    taken = (*lead, slice(spec.first, spec.first + spec.step * spec.indices().size, spec.step))
    return lambda x: x[taken].reshape(spec.output_shape(tuple(x.shape)))


_MAKERS: dict[str, Callable[[Any, int], View]] = {"Transpose": _transpose, "Slice": _slice, "Split": _split, "Gather": _gather}
