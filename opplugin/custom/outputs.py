"""What every custom kernel shares (CallShapes): the batch of a call, each output's shape at it,
the outputs made (poisoned with NaN for a check), and what a kernel returned held to its
declaration; and the sample values a trial of a node runs on."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..registry import NodeInfo, TensorInfo
from .calling import DeclarationError


def batched_inputs(node: NodeInfo) -> list[bool]:
    """Which inputs carry the batch as their first axis: those computed at run time whose first
    axis is the plan's batch (the first input's), not the node's constants."""
    first = next((t for t in node.inputs if t.name and t.name not in node.constants and t.shape), None)
    if first is None:
        return [False] * len(node.inputs)
    planned = first.shape[0]
    return [bool(t.name) and t.name not in node.constants and bool(t.shape) and t.shape[0] == planned for t in node.inputs]


class CallShapes:
    """A node's batch layout, read once when its kernel is built: which inputs and outputs carry
    the batch, so that each call finds its batch, makes its outputs and checks what it got without
    reading the node again."""

    def __init__(self, node: NodeInfo):
        self.node = node
        self.batched = batched_inputs(node)
        planned = next((t.shape[0] for t, b in zip(node.inputs, self.batched) if b), None)
        self.outputs_batched = [planned is not None and bool(t.shape) and t.shape[0] == planned for t in node.outputs]
        self._shapes: dict[int | None, list[tuple[int, ...]]] = {}

    def batch(self, inputs: Sequence[Any]) -> int | None:
        """The batch of this call: the first axis of the first batched input (None where none is batched)."""
        for batched, value in zip(self.batched, inputs):
            if batched and value is not None:
                return int(value.shape[0])
        return None

    def output_shapes(self, batch: int | None) -> list[tuple[int, ...]]:
        """Each output's shape at this batch: the plan's, with the batch in the first axis where it has the plan's."""
        if batch not in self._shapes:
            self._shapes[batch] = [(batch, *t.shape[1:]) if batched and batch is not None else tuple(t.shape)
                                   for t, batched in zip(self.node.outputs, self.outputs_batched)]
        return self._shapes[batch]

    def new_outputs(self, batch: int | None, poison: bool) -> list[Any]:
        """The outputs a kernel writes into, on the current CuPy stream: NaN-filled where `poison` (an
        element the kernel leaves unwritten then shows in a check), else uninitialised."""
        import cupy

        made = []
        for tensor, shape in zip(self.node.outputs, self.output_shapes(batch)):
            dtype = np.dtype(tensor.dtype)
            made.append(cupy.full(shape, np.nan, dtype) if poison and np.issubdtype(dtype, np.floating) else cupy.empty(shape, dtype))
        return made

    def held(self, op: str, variant: str, results: Any, batch: int | None) -> list[Any]:
        """A kernel's results as a list, each checked against its output's declared shape and dtype:
        one DeclarationError line naming the node, the op and both where one differs."""
        node = self.node
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        if len(results) != len(node.outputs):
            raise DeclarationError(f"{node.name}: {op} {variant} returned {len(results)} outputs, the op declares {len(node.outputs)}")
        for tensor, shape, value in zip(node.outputs, self.output_shapes(batch), results):
            _check(op, variant, node.name, tensor, shape, value)
        return results

    def bytes(self, batch: int) -> int:
        """Bytes of the node's inputs and outputs at this batch: the fewest a call moves."""
        total = 0
        for tensor, batched in zip(self.node.inputs, self.batched):
            if tensor.name:
                shape = (batch, *tensor.shape[1:]) if batched else tensor.shape
                total += int(np.prod(shape)) * np.dtype(tensor.dtype).itemsize
        for tensor, shape in zip(self.node.outputs, self.output_shapes(batch)):
            total += int(np.prod(shape)) * np.dtype(tensor.dtype).itemsize
        return total


def sample_values(node: NodeInfo, rows: int | None = None, seed: int = 0, integer_high: int = 1) -> list[np.ndarray | None]:
    """Host values for a trial of the node: `rows` rows of each batched input (the plan's where None),
    standard-normal floats, integers from 0 below `integer_high` (1: zeros, valid indices), the
    node's constants as they are."""
    rng = np.random.default_rng(seed)
    values: list[np.ndarray | None] = []
    for tensor, batched in zip(node.inputs, batched_inputs(node)):
        dtype = np.dtype(tensor.dtype)
        if not tensor.name:
            values.append(None)
        elif tensor.name in node.constants:
            values.append(np.asarray(node.constants[tensor.name], dtype=dtype))
        else:
            shape = (rows, *tensor.shape[1:]) if batched and rows is not None else tuple(tensor.shape)
            drawn = rng.standard_normal(shape) if np.issubdtype(dtype, np.floating) else rng.integers(0, integer_high, shape)
            values.append(np.asarray(drawn, dtype=dtype))
    return values


def _check(op: str, variant: str, name: str, tensor: TensorInfo, shape: tuple[int, ...], value: Any) -> None:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise DeclarationError(f"{name}: {op} {variant} returned {type(value).__name__} for {tensor.name}, not an array")
    if tuple(value.shape) != shape or np.dtype(value.dtype) != np.dtype(tensor.dtype):
        raise DeclarationError(f"{name}: {op} {variant} returned {tensor.name} as {np.dtype(value.dtype)} {list(value.shape)}; "
                               f"the declaration says {np.dtype(tensor.dtype)} {list(shape)}")
