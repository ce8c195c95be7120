"""Which chunks of a run saw NaN or Inf after a fused plugin step.

A fused Conv > activation > MaxPool kernel propagates NaN and +inf through its
pool windows (see ops/epilogue.py), but onnxruntime's MaxPool keeps or drops a
NaN depending on where it sits in the window, so such a chunk must be rerun on
onnxruntime's own nodes. Every fused output gets one flag per chunk, set on the
device by a single reduction on the chunk's stream (no host wait), and the
flags are read once, after the run has finished anyway.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.cache
def _any_nonfinite_kernel():
    """A CuPy reduction: true when any element is NaN or +-inf (one pass, one launch)."""
    import cupy

    return cupy.ReductionKernel(
        "T x", "bool flag", "!isfinite(x)", "a || b", "flag = a", "false", "opplugin_any_nonfinite", reduce_type="bool"
    )


class NonFiniteFlags:
    """flags[chunk, slot]: did fused output `slot` of this chunk hold a NaN or an Inf?"""

    def __init__(self, chunks: int, slots: int, on_device: bool):
        self.on_device = on_device
        if on_device:
            import cupy

            # every entry is written by its chunk, so no fill (which would run on
            # another stream than the chunks' and could land after their writes)
            self._flags = cupy.empty((chunks, slots), dtype=cupy.bool_)
        else:
            self._flags = np.zeros((chunks, slots), dtype=bool)

    def record(self, chunk: int, slot: int, value: Any) -> None:
        """Flag this output; on a device, enqueued on the current stream."""
        if isinstance(value, np.ndarray) or not self.on_device:
            self._flags[chunk, slot] = not bool(np.isfinite(np.asarray(value)).all())
        elif value.size == 0:
            self._flags[chunk, slot] = False
        else:
            _any_nonfinite_kernel()(value, out=self._flags[chunk, slot])

    def raised(self) -> list[int]:
        """The chunks with any flag set. On a device, call once every chunk's stream has finished."""
        flags = self._flags.get() if self.on_device else self._flags
        return [int(i) for i in np.flatnonzero(flags.any(axis=1))]
