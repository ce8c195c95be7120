"""What every custom kernel shares: the batch of a call, each output's shape at it, the outputs
made (poisoned with NaN for a check), and what a kernel returned held to its declaration."""
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


def call_batch(node: NodeInfo, inputs: Sequence[Any]) -> int | None:
    """The batch of this call: the first axis of the first batched input (None where none is batched)."""
    for batched, value in zip(batched_inputs(node), inputs):
        if batched and value is not None:
            return int(value.shape[0])
    return None


def output_shapes(node: NodeInfo, batch: int | None) -> list[tuple[int, ...]]:
    """Each output's shape at this call's batch: the plan's, with the batch in the first axis where it has the plan's."""
    planned = next((t.shape[0] for t, b in zip(node.inputs, batched_inputs(node)) if b), None)
    shapes = []
    for tensor in node.outputs:
        shape = tuple(tensor.shape)
        shapes.append((batch, *shape[1:]) if batch is not None and shape and planned is not None and shape[0] == planned else shape)
    return shapes


def new_outputs(node: NodeInfo, batch: int | None, poison: bool) -> list[Any]:
    """The outputs a kernel writes into, on the current CuPy stream: NaN-filled where `poison` (an
    element the kernel leaves unwritten then shows in a check), else uninitialised."""
    import cupy

    made = []
    for tensor, shape in zip(node.outputs, output_shapes(node, batch)):
        dtype = np.dtype(tensor.dtype)
        if poison and np.issubdtype(dtype, np.floating):
            made.append(cupy.full(shape, np.nan, dtype))
        else:
            made.append(cupy.empty(shape, dtype))
    return made


def held_to_declaration(op: str, variant: str, node: NodeInfo, results: Any, batch: int | None) -> list[Any]:
    """A kernel's results as a list, each checked against its output's declared shape and dtype:
    one DeclarationError line naming the node, the op and both where one differs."""
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    if len(results) != len(node.outputs):
        raise DeclarationError(f"{node.name}: {op} {variant} returned {len(results)} outputs, the op declares {len(node.outputs)}")
    for tensor, shape, value in zip(node.outputs, output_shapes(node, batch), results):
        _check(op, variant, node.name, tensor, shape, value)
    return results


def _check(op: str, variant: str, name: str, tensor: TensorInfo, shape: tuple[int, ...], value: Any) -> None:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise DeclarationError(f"{name}: {op} {variant} returned {type(value).__name__} for {tensor.name}, not an array")
    if tuple(value.shape) != shape or np.dtype(value.dtype) != np.dtype(tensor.dtype):
        raise DeclarationError(f"{name}: {op} {variant} returned {tensor.name} as {np.dtype(value.dtype)} {list(value.shape)}; "
                               f"the declaration says {np.dtype(tensor.dtype)} {list(shape)}")


def bytes_of(node: NodeInfo, batch: int) -> int:
    """Bytes of the node's inputs and outputs at this batch: the fewest a call moves."""
    flags = batched_inputs(node)
    total = 0
    for tensor, batched in zip(node.inputs, flags):
        if tensor.name:
            shape = (batch, *tensor.shape[1:]) if batched else tensor.shape
            total += int(np.prod(shape)) * np.dtype(tensor.dtype).itemsize
    for tensor, shape in zip(node.outputs, output_shapes(node, batch)):
        total += int(np.prod(shape)) * np.dtype(tensor.dtype).itemsize
    return total
