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
A Concat's output may itself be a slice of a later Concat: one of its inputs (nested Inception
blocks), or a Concat whose inputs are a run of the later one's, where every reader of it reads
strided views (`in_views`: DenseNet's Concat of every earlier layer is a prefix of the next one's,
so each layer's output is copied once, not once per later layer). The views chain.

All of this is along axis 1 of FP32 NCHW buffers. A tensor linked channel-last in 16 bits (plan/channel_last.py)
is never placed: a linked Concat's slices are [..., start:stop] of the last axis of uint16 [N][H][W][C], which
no producer's kernel writes, so the linked Concat copies each input itself (ops/layout/linked_concat.py); nor is a
linked Concat's output a view of a later Concat's buffer, nor a buffer any tensor is placed in. A linked Concat
links all of its tensors or none, so an FP32 Concat has FP32 inputs and output alone: both rules hold for each
Concat as a whole (`linked`: the plan's linked tensors).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, MutableMapping, Sequence

import numpy as np

from ..gpu import cuda
from ..errors import PluginError
from ..plan.partition import OrtStep, Plan, PluginStep
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
    # it runs through InPlace.call, with its slice of the buffer: never prebound an array of its own, nor replayed
    out_view = ""
    replayable = False

    def __init__(self, concat: Kernel, copier: Kernel | None):
        self.concat, self.copier = concat, copier
        self.name = copier.name if copier is not None else f"{concat.name}(written in place)"
        self.device_work = copier is not None
        self.variant = concat.variant

    def flops(self, batch: int) -> int:
        return 0

    def bytes_moved(self, batch: int) -> int:
        return self.copier.bytes_moved(batch) if self.copier is not None else 0

    def __call__(self, inputs: Sequence[Any], stream: Any = None, **out: Any) -> list[Any]:
        return self.concat(inputs, stream, **out)


def _is_concat(kernel: Kernel | None) -> bool:
    """Whether `kernel` (None: an onnxruntime step's) copies its inputs into slices of its output (Kernel.input_slices)."""
    return kernel is not None and kernel.input_slices is not None


def _reads_views(kernel: Kernel | None) -> bool:
    """Whether `kernel` (None: an onnxruntime step's) reads a view of a Concat's buffer as it is: a Concat,
    or a kernel with in_views."""
    return _is_concat(kernel) or (kernel is not None and kernel.in_views)


def assign_buffers(plan: Plan, kernels: dict[str, Kernel], linked: frozenset[str] = frozenset()) -> BufferAssignment:
    """`linked`: the tensors kept channel-last in 16 bits between steps, which no slot holds nor is."""
    return _Assigner(plan, kernels, linked).assign()


class _Assigner:
    """The two passes of assign_buffers: first, Concats whose inputs are a run of a later Concat's
    inputs become views of its buffer (DenseNet: each layer's Concat is a prefix of the next), so
    that a tensor already copied into the shared buffer is not copied again; then, producers that
    can write their output into its slice of a Concat's buffer."""

    def __init__(self, plan: Plan, kernels: dict[str, Kernel], linked: frozenset[str]):
        self.plan, self.kernels, self.steps = plan, kernels, plan.steps
        self.made_by = {name: index for index, step in enumerate(self.steps) for name in step.outputs if name}
        self.readers: dict[str, list[int]] = {}
        for index, step in enumerate(self.steps):
            for name in dict.fromkeys(n for n in step.inputs if n):
                self.readers.setdefault(name, []).append(index)
        self.ort_at = [index for index, step in enumerate(self.steps) if isinstance(step, OrtStep)]
        self.graph_outputs = set(plan.model.outputs)
        # the FP32 Concats: one with a linked tensor copies channel-last itself, and takes part in nothing here
        self.concat_at = {index: kernel for index in range(len(self.steps))
                          if _is_concat(kernel := self._kernel(index)) and len(self.steps[index].outputs) == 1
                          and not linked.intersection([*self.steps[index].inputs, *self.steps[index].outputs])}
        self.assignment = BufferAssignment()
        self.first_writer: dict[str, int] = {}  # a Concat's output -> the earliest step writing into it
        self.placed: set[tuple[str, int, str]] = set()  # (root buffer, offset along the axis, tensor) written there

    def _kernel(self, index: int) -> Kernel | None:
        step = self.steps[index]
        return self.kernels.get(step.name) if isinstance(step, PluginStep) else None

    def _crosses_onnxruntime(self, first: int, last: int) -> bool:
        """Whether an onnxruntime step runs between steps `first` and `last`: a buffer and its views live in one run."""
        return any(first < at <= last for at in self.ort_at)

    def _reach(self, name: str) -> int:
        """The last step that needs `name`'s buffer held: its Concat's, or that of the Concat it is a view into."""
        slot = self.assignment.slots.get(name)
        own = self.made_by.get(name, -1)
        return max(own, self._reach(slot.buffer)) if slot else own

    def _where(self, name: str) -> tuple[str, int]:
        """(root buffer, offset along the axis) where `name` is written; (name, 0) for a tensor of its own."""
        slot = self.assignment.slots.get(name)
        if slot is None:
            return name, 0
        root, offset = self._where(slot.buffer)
        return root, offset + slot.start

    def assign(self) -> BufferAssignment:
        for index in reversed(self.concat_at):  # later Concats first: a view's buffer is decided before it
            self._share_with_a_later_concat(index)
        for index in self.concat_at:
            self._place_inputs(index)
        return self.assignment

    def _share_with_a_later_concat(self, index: int) -> None:
        """The Concat at `index` as a view of the next Concat (same axis) that reads its inputs as a run in the
        same order, where every reader of its output reads views (a Concat, or a kernel with `in_views`)."""
        step, (axis, _bounds) = self.steps[index], self.concat_at[index].input_slices
        output, inputs = step.outputs[0], list(step.inputs)
        if output in self.graph_outputs or output not in self.readers:
            return
        if not all(_reads_views(self._kernel(r)) for r in self.readers[output]):
            return
        later = next((t for t in self.concat_at if t > index and self.concat_at[t].input_slices[0] == axis
                      and inputs[0] in self.steps[t].inputs), None)
        if later is None:
            return
        theirs = list(self.steps[later].inputs)
        at = theirs.index(inputs[0])
        if theirs[at:at + len(inputs)] != inputs or any(theirs.count(n) > 1 for n in inputs) or output in theirs:
            return
        bounds = self.concat_at[later].input_slices[1]
        first = min([self.made_by.get(n, index) for n in inputs] + [index])
        if self._crosses_onnxruntime(first, max(self.readers[output] + [self._reach(self.steps[later].outputs[0])])):
            return
        self.assignment.slots[output] = Slot(self.steps[later].outputs[0], axis, bounds[at][0], bounds[at + len(inputs) - 1][1])

    def _place_inputs(self, index: int) -> None:
        """Which inputs of the Concat at `index` are already where it would copy them (written there by their
        producer, or by an earlier Concat sharing its buffer), and which producers may write there."""
        step, kernel = self.steps[index], self.concat_at[index]
        axis, bounds = kernel.input_slices
        output = step.outputs[0]
        root, offset = self._where(output)
        rows_are_one = int(np.prod(self.plan.shape_of(output)[:axis], dtype=np.int64)) == 1
        in_place = set()
        for position, name in enumerate(step.inputs):
            target = (root, offset + bounds[position][0])
            if self._where(name) == target or (*target, name) in self.placed:
                in_place.add(position)
            elif self._producer_writes_in_place(name, step.inputs, rows_are_one, self._reach(output)):
                self.assignment.slots[name] = Slot(output, axis, *bounds[position])
                self.first_writer[output] = min(self.first_writer.get(output, index), self.first_writer.get(name, self.made_by[name]))
                in_place.add(position)
        self.placed.update((root, offset + start, name) for name, (start, _stop) in zip(step.inputs, bounds))
        if in_place:
            self.assignment.concats[index] = kernel.copying(frozenset(in_place))

    def _producer_writes_in_place(self, name: str, inputs: Sequence[str], rows_are_one: bool, reach: int) -> bool:
        producer = self.made_by.get(name)
        if producer is None or inputs.count(name) > 1 or name in self.graph_outputs or name in self.assignment.slots:
            return False
        maker = self.steps[producer]
        kernel = self._kernel(producer)
        mode = kernel.out_view if kernel is not None else ""  # an onnxruntime step writes no view
        if len(maker.outputs) != 1 or mode not in ("strided", "contiguous") or (mode == "contiguous" and not rows_are_one):
            return False
        if not all(_is_concat(self._kernel(r)) for r in self.readers[name]):
            return False
        return not self._crosses_onnxruntime(self.first_writer.get(name, producer), max(self.readers[name] + [reach]))


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

    def places(self, index: int) -> bool:
        """Whether step `index` writes into a Concat's buffer (or is a Concat): `call` runs it."""
        step = self.plan.steps[index]
        return index in self.assignment.concats or (len(step.outputs) == 1 and step.outputs[0] in self.assignment.slots)

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
