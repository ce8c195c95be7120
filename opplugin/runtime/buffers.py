"""Buffer assignment: which step outputs are written straight into their slice of a Concat's
output, so that the Concat copies nothing for them (and launches nothing when every input is
written in place: the step is gone from the device's work).

A pass over the plan and its kernels (`assign_buffers`) decides it; the executor then hands
each such producer a view of the Concat's buffer (`InPlace.call`), allocated when the first
of them runs, at the chunk's batch. A producer qualifies when:
- its kernel takes `out=` (Kernel.out_view): "strided" for any view; "contiguous" only where the
  slice is one contiguous run (every axis before the Concat's has extent 1: batch 1 along channels);
- the tensor is its only output, is no graph output, appears once among the Concat's inputs, and is
  read only by Concat steps (a Concat reads a strided view; other kernels want contiguous inputs);
- no onnxruntime step runs between it and the last of those readers, so that the buffer, the views and
  the Concat all live inside one run of plugin steps (one CUDA graph when graphs are on).
A Concat's output may itself be a slice of a later Concat (nested Inception blocks): the views chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, MutableMapping, Sequence

import numpy as np

from .. import cuda
from ..errors import PluginError
from ..plan import OrtStep, Plan, PluginStep
from ..registry import Kernel
from .chunking import BatchLayout


@dataclass(frozen=True)
class Slot:
    """Where a tensor is written: [start, stop) along `axis` of the tensor `buffer` (a Concat's output)."""

    buffer: str
    axis: int
    start: int
    stop: int

    def index(self) -> tuple[slice, ...]:
        return (slice(None),) * self.axis + (slice(self.start, self.stop),)


@dataclass
class BufferAssignment:
    """The decisions of one plan: `slots` by tensor; for each Concat step (by index) with an input written
    in place, the kernel that copies the others (None: nothing left to copy, the step launches nothing)."""

    slots: dict[str, Slot] = field(default_factory=dict)
    concats: dict[int, Kernel | None] = field(default_factory=dict)

    def removed(self, plan: Plan) -> list[str]:
        """The Concat steps whose inputs are all written in place."""
        return [plan.steps[index].name for index, copier in self.concats.items() if copier is None]

    def kernels(self, plan: Plan, kernels: dict[str, Kernel]) -> dict[str, Kernel]:
        """`kernels` with each Concat that has inputs written in place as InPlaceConcat: what the
        executor runs and the records name."""
        changed = {plan.steps[index].name: InPlaceConcat(kernels[plan.steps[index].name], copier)
                   for index, copier in self.concats.items()}
        return {**kernels, **changed}


class InPlaceConcat(Kernel):
    """A Concat step some of whose inputs their producers wrote in place: named and costed for the
    copies left (none: no device work, timed by the host clock). Called as a plain kernel (without
    the buffer assignment: the exact path), it is the whole Concat."""

    nonfinite_exact = True

    def __init__(self, concat: Kernel, copier: Kernel | None):
        self.concat, self.copier = concat, copier
        self.name = copier.name if copier is not None else f"{concat.name}(written in place)"
        self.device_work = copier is not None
        self.variant = getattr(concat, "variant", None)

    def flops(self, batch: int) -> int:
        return 0

    def bytes_moved(self, batch: int) -> int:
        return self.copier.bytes_moved(batch) if self.copier is not None else 0

    def __call__(self, inputs: Sequence[Any], stream: Any = None, **out: Any) -> list[Any]:
        return self.concat(inputs, stream, **out)


def _is_concat(kernel: Any) -> bool:
    return getattr(kernel, "input_slices", None) is not None


def assign_buffers(plan: Plan, kernels: dict[str, Kernel]) -> BufferAssignment:
    steps = plan.steps
    made_by = {name: index for index, step in enumerate(steps) for name in step.outputs if name}
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for name in dict.fromkeys(n for n in step.inputs if n):
            readers.setdefault(name, []).append(index)
    ort_at = [index for index, step in enumerate(steps) if isinstance(step, OrtStep)]
    graph_outputs = set(plan.model.outputs)
    assignment = BufferAssignment()
    first_writer: dict[str, int] = {}  # a Concat's output -> the earliest step writing into it

    def concat_kernel(index: int) -> Any:
        step = steps[index]
        return kernels.get(step.name) if isinstance(step, PluginStep) else None

    for index, step in enumerate(steps):
        kernel = concat_kernel(index)
        if not _is_concat(kernel) or len(step.outputs) != 1:
            continue
        axis, bounds = kernel.input_slices
        output = step.outputs[0]
        rows_are_one = int(np.prod(plan.shape_of(output)[:axis], dtype=np.int64)) == 1
        in_place = set()
        for position, name in enumerate(step.inputs):
            producer = made_by.get(name)
            if producer is None or step.inputs.count(name) > 1 or name in graph_outputs or name in assignment.slots:
                continue
            maker = steps[producer]
            mode = getattr(kernels.get(maker.name), "out_view", "") if isinstance(maker, PluginStep) else ""
            if len(maker.outputs) != 1 or mode not in ("strided", "contiguous") or (mode == "contiguous" and not rows_are_one):
                continue
            if not all(_is_concat(concat_kernel(r)) for r in readers[name]):
                continue
            start = first_writer.get(name, producer)
            if any(start < at <= max(readers[name]) for at in ort_at):
                continue
            assignment.slots[name] = Slot(output, axis, *bounds[position])
            first_writer[output] = min(first_writer.get(output, index), start)
            in_place.add(position)
        if in_place:
            assignment.concats[index] = kernel.copying(frozenset(in_place))
    return assignment


def _address(array: Any) -> int:
    return array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr


def _same_array(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and a.shape == b.shape and a.strides == b.strides and _address(a) == _address(b))


class InPlace:
    """Runs a plan's steps with its BufferAssignment: `call` in place of `kernel(args, stream)`.
    `pending` holds, per run of plugin steps, the Concat buffers allocated before their Concat runs."""

    def __init__(self, plan: Plan, layout: BatchLayout, assignment: BufferAssignment, on_device: bool):
        self.plan, self.layout, self.assignment, self.on_device = plan, layout, assignment, on_device
        self.buffers = {slot.buffer for slot in assignment.slots.values()}  # the Concat outputs written in place

    def call(self, index: int, kernel: Kernel, args: Sequence[Any], stream: Any, pending: MutableMapping[str, Any],
             batch: int) -> list[Any]:
        step = self.plan.steps[index]
        if index in self.assignment.concats:
            out = self._array(step.outputs[0], pending, batch, stream)
            pending.pop(step.outputs[0], None)
            copier = self.assignment.concats[index]
            return [out] if copier is None else copier(args, stream, out=out)
        slot = self.assignment.slots.get(step.outputs[0]) if len(step.outputs) == 1 else None
        if slot is None:
            return kernel(args, stream)
        view = self._array(step.outputs[0], pending, batch, stream)
        outs = kernel(args, stream, out=view)
        if len(outs) != 1 or not _same_array(outs[0], view):
            raise PluginError(f"kernel {kernel.name} of step {step.name} was handed its output's place in a Concat (out=) "
                              "but returned another array: a kernel with out_view must write into `out` and return it")
        return outs

    def _array(self, name: str, pending: MutableMapping[str, Any], batch: int, stream: Any) -> Any:
        """The array `name` is written into: its slice of its buffer, or (a buffer) allocated now."""
        if name in pending:
            return pending[name]
        slot = self.assignment.slots.get(name)
        if slot is not None:
            view = self._array(slot.buffer, pending, batch, stream)[slot.index()]
            if name in self.buffers:
                pending[name] = view  # a Concat's output inside a later Concat: its producers look it up
            return view
        shape = self.layout.shape_at(name, batch) if self.layout.chunkable and self.layout.is_batched(name) else self.plan.shape_of(name)
        dtype = self.plan.tensors[name].dtype
        if self.on_device:
            with cuda.on_stream(stream):
                pending[name] = cuda.empty(shape, dtype)
        else:
            pending[name] = np.empty(shape, dtype)
        return pending[name]
