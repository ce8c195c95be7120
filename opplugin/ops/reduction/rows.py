"""A reduction's view of a tensor: (outer, extent, inner).

Every op of this package reduces one run of adjacent axes of a C-contiguous tensor. Merged,
the axes before the run are `outer`, the run is `extent` and the axes after it are `inner`,
so element (o, r, i) sits at (o * extent + r) * inner + i. A reduction over the last axes
has inner 1 (a row of `extent` contiguous floats); one over the channels of an NCHW tensor
has inner H*W, and its `extent` values lie `inner` floats apart.

The batch is the first axis and is never reduced (a chunked run cuts it), so `outer` is
the batch times `outer_per_image`, which the kernel is compiled for.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import PluginError


def product(dims) -> int:
    return int(np.prod(list(dims), dtype=np.int64))


@dataclass(frozen=True)
class Rows:
    outer_per_image: int  # the axes between the batch and the run, merged
    extent: int  # R: the reduced run, merged
    inner: int  # I: the axes after the run, merged

    @classmethod
    def of(cls, shape: tuple[int, ...], first: int, end: int) -> "Rows":
        """Axes [first, end) of `shape` reduced; first >= 1 (the batch stays whole)."""
        return cls(product(shape[1:first]), product(shape[first:end]), product(shape[end:]))

    def outer(self, batch: int) -> int:
        return batch * self.outer_per_image

    def elements(self, batch: int) -> int:
        return self.outer(batch) * self.extent * self.inner

    def view(self, x, batch: int):
        """x as an (outer, extent, inner) array (a view of a contiguous x)."""
        return x.reshape(self.outer(batch), self.extent, self.inner)


def normalised_axes(axes, rank: int, where: str) -> tuple[int, ...]:
    """Axes in 0..rank-1, sorted and distinct; a PluginError for one out of range or repeated."""
    result = []
    for axis in axes:
        axis = int(axis)
        if not -rank <= axis < rank:
            raise PluginError(f"{where}: axis {axis} is out of range for a rank-{rank} input")
        result.append(axis % rank)
    if len(set(result)) != len(result):
        raise PluginError(f"{where}: axes {list(axes)} name an axis twice")
    return tuple(sorted(result))


def runs(axes: tuple[int, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The reduced axes as runs [first, end) of adjacent axes, axes of extent 1 joining either side."""
    wanted = [a in axes for a in range(len(shape))]
    result: list[tuple[int, int]] = []
    for axis, reduced in enumerate(wanted):
        if not reduced:
            continue
        if result and all(shape[a] == 1 for a in range(result[-1][1], axis)):
            result[-1] = (result[-1][0], axis + 1)
        else:
            result.append((axis, axis + 1))
    return result


def refuse_batch_axis(axes: tuple[int, ...], where: str, what: str = "reducing") -> None:
    if 0 in axes:
        raise PluginError(f"{where}: {what} over axis 0 (the batch) is not implemented: a chunked run cuts the batch")
