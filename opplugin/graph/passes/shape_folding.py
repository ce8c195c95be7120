"""Shape arithmetic (Shape > Gather > ... > Reshape) folded where it does not depend on the batch.

The graph stays valid at every batch: the runner runs one plan on chunks of several sizes, and
one onnxruntime session per step serves them all. So shape arithmetic is evaluated at two batches
(static_shapes.PROBE_BATCHES), and only what is the same at both folds; a Reshape target that
carries the batch gets -1 (or 0) in its place. Every shape is then concrete once the batch is:
the plan's shape inference, at the plan's batch, gives every plugin concrete H and W.
constant_folding.py runs this in turn with the folding of constant nodes.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..attributes import attribute
from ..bare import SMALL_CONSTANT
from ..evaluate import evaluate
from ..ir import Graph
from ..static_shapes import PROBE_BATCHES, Shapes, static_shapes
from .batch_broadcast import COUNT_KEY as BROADCAST_KEY
from .batch_broadcast import broadcast_to_batch
from .folding import count, fold, foldable

SHAPE_OF = ("Shape", "Size")  # read only a tensor's shape: they fold where it is static
# Ops that compute shapes from shapes: evaluated over Shape's values at each probe batch.
SHAPE_ARITHMETIC = {"Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
                    "Floor", "Ceil", "Neg", "Abs", "Min", "Max", "Reshape", "Flatten", "Identity", "ReduceProd",
                    "ReduceSum", "Equal", "Less", "Greater", "Not", "Where", "Range", "Sqrt"}
# a batch of rewrites that shape inference refuses is tried again one at a time, at most this many (each
# try infers the graph's shapes twice)
MAX_ONE_IMAGE_TRIES = 8


def fold_shape_arithmetic(graph: Graph, first: Shapes, second: Shapes, folded: dict[str, int]) -> None:
    """Shape arithmetic folded where its value does not depend on the batch.

    Shape and Size of a tensor whose shape shape inference knows, and the SHAPE_ARITHMETIC
    nodes over them, are evaluated (by onnxruntime) at the two PROBE_BATCHES. What is the
    same at both becomes a constant: a channel count, H, W. What follows the batch stays
    computed at run time, except a Reshape target: there the batch's element becomes -1
    (or 0, "as the input", beside another -1), so that the target is a constant at every
    batch, and the nodes that computed it go; likewise an Expand target's elements that are
    its input's own extents become 1. Nothing that reads a tensor's values (only
    its shape) is evaluated: data never folds."""
    shape_nodes, arithmetic, names = [], [], set()
    for node in graph.nodes:
        if not foldable(graph, node):
            continue
        if node.op_type in SHAPE_OF and node.input[0] in first and node.input[0] in second:
            shape_nodes.append(node)
        elif node.op_type in SHAPE_ARITHMETIC and any(i in names for i in node.input) and _over_shapes(graph, node, names):
            arithmetic.append(node)
        else:
            continue
        names.update(o for o in node.output if o)
    if not shape_nodes:
        return
    at = tuple({node.output[0]: _shape_value(node, shapes[node.input[0]]) for node in shape_nodes} for shapes in (first, second))
    for probe in at:  # one evaluation per probe batch, by onnxruntime
        probe.update(evaluate(graph, arithmetic, dict(probe)) if arithmetic else {})
    computed = []
    chosen = {id(n) for n in [*shape_nodes, *arithmetic]}
    for node in [n for n in graph.nodes if id(n) in chosen]:  # graph order
        outputs = [o for o in node.output if o]
        if not all(o in probe for probe in at for o in outputs):
            continue  # onnxruntime could not evaluate it: it stays
        if all(np.array_equal(at[0][o], at[1][o]) for o in outputs):
            fold(graph, node, [at[0][o] if o else None for o in node.output], folded)
        else:
            computed.append(node)
    one_image: list[tuple[onnx.NodeProto, int]] = []  # (node, place of its shape input): see _make_for_one_image
    for node in graph.nodes:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in at[0] and node.input[1] not in graph.constants:
            _fix_reshape_target(graph, node, at, first, second)
        elif node.op_type == "Gather" and node.input[1] in at[0] and node.input[1] not in graph.constants:
            _gather_in_order_as_reshape(graph, node, at, first, second)
        elif node.op_type == "Expand" and node.input[1] in at[0] and node.input[1] not in graph.constants:
            if node.input[0] in graph.constants:
                one_image.append((node, 1))
            else:
                _fix_expand_target(graph, node, at, first, second)
        elif node.op_type == "ConstantOfShape" and node.input[0] in at[0] and node.input[0] not in graph.constants:
            one_image.append((node, 0))
    _make_for_one_image(graph, one_image, at, first, second)
    leftover = [n for n in graph.nodes if n.op_type == "Expand" and n.input[1] in at[0] and n.input[1] not in graph.constants]
    if leftover and (broadcasts := broadcast_to_batch(graph, leftover, at, first, second, PROBE_BATCHES)):
        folded[BROADCAST_KEY] = folded.get(BROADCAST_KEY, 0) + broadcasts
    _drop_unread(graph, computed, folded)


def _over_shapes(graph: Graph, node: onnx.NodeProto, shape_values: set[str]) -> bool:
    """Whether every input of `node` is a small constant or a shape value."""
    return all(not name or name in shape_values or
               (name in graph.constants and np.size(graph.constants[name]) <= SMALL_CONSTANT) for name in node.input)


def _fix_reshape_target(graph: Graph, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
    """A constant target for a Reshape whose target follows the batch (see fold_shape_arithmetic)."""
    targets = [np.asarray(probe[node.input[1]]) for probe in at]
    data = node.input[0]
    if data not in first or data not in second or targets[0].shape != targets[1].shape or targets[0].ndim != 1:
        return
    varying = np.flatnonzero(targets[0] != targets[1])
    if len(varying) != 1:
        return
    axis, (small, large) = int(varying[0]), PROBE_BATCHES
    target = targets[0].astype(np.int64)
    counts = [int(np.prod(first[data])), int(np.prod(second[data]))]
    if -1 not in target and targets[0][axis] * large == targets[1][axis] * small and counts[0] * large == counts[1] * small:
        # the element count follows the batch, and so does this axis alone (the data's first axis may
        # be the batch times a patch count, as a vision transformer's tokens are): -1 finds it at any batch
        target[axis] = -1
    elif axis == 0 and [targets[0][0], targets[1][0]] == [first[data][0], second[data][0]] and not attribute(node, "allowzero", 0):
        target[axis] = 0  # the first axis as the input has it
    else:
        return
    name = graph.new_name(f"{node.name or data}_target")
    graph.constants[name] = target
    node.input[1] = name


def _fix_expand_target(graph: Graph, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
    """A constant target for an Expand whose target follows the batch where its input does: each
    element that differs between the probes is the input's own extent there (lined up from the
    last axis), so 1 (broadcasting keeps the input's extent) gives the same shape at every batch."""
    targets = [np.asarray(probe[node.input[1]]).astype(np.int64) for probe in at]
    data = node.input[0]
    if data not in first or data not in second or targets[0].shape != targets[1].shape or targets[0].ndim != 1:
        return
    target = targets[0].copy()
    for axis in np.flatnonzero(targets[0] != targets[1]):
        place = int(axis) - len(target) + len(first[data])  # the input's axis under this one, lined up from the end
        if place < 0 or [first[data][place], second[data][place]] != [targets[0][axis], targets[1][axis]]:
            return
        target[axis] = 1
    name = graph.new_name(f"{node.name or data}_target")
    graph.constants[name] = target
    node.input[1] = name


def _make_for_one_image(graph: Graph, candidates: list[tuple[onnx.NodeProto, int]], at: tuple[dict, dict], first: dict,
                        second: dict) -> None:
    """Expands of a constant, and ConstantOfShapes, to a shape whose first element is the batch (a
    positional encoding built from a mask of zeros): their values are the same for every image, so
    each is made for one (1 in the batch's place), and what reads only them folds into constants that
    broadcast along the batch. Kept only where shape inference at both probe batches shows every
    tensor keeping its shape but those computed from constants alone: all at once, else (a few)
    one at a time, each undone where it fails."""
    changes = []
    for node, position in candidates:
        targets = [np.asarray(probe[node.input[position]]).astype(np.int64) for probe in at]
        if targets[0].ndim != 1 or targets[0].shape != targets[1].shape or not targets[0].size:
            continue
        if [targets[0][0], targets[1][0]] == list(PROBE_BATCHES) and (targets[0][1:] == targets[1][1:]).all():
            target = targets[0].copy()
            target[0] = 1
            name = graph.new_name(f"{node.name or node.output[0]}_one_image")
            graph.constants[name] = target
            changes.append((node, position, node.input[position], name))
    if not changes:
        return

    def apply(chosen, on: bool) -> None:
        for node, position, computed, name in chosen:
            node.input[position] = name if on else computed

    apply(changes, True)
    if _only_constants_reshaped(graph, first, second):
        return
    apply(changes, False)
    for change in changes[:MAX_ONE_IMAGE_TRIES] if len(changes) > 1 else []:
        apply([change], True)
        if not _only_constants_reshaped(graph, first, second):
            apply([change], False)
    for node, position, computed, name in changes:
        if node.input[position] != name:
            del graph.constants[name]


def _only_constants_reshaped(graph: Graph, first: dict, second: dict) -> bool:
    """Whether, at both probe batches, every tensor shape inference knew keeps its shape, but those
    whose nodes read constants and such tensors alone (they fold), and no graph output changes."""
    for before, batch in ((first, PROBE_BATCHES[0]), (second, PROBE_BATCHES[1])):
        after = static_shapes(graph, batch)
        changed: set[str] = set()
        for node in graph.nodes:
            outputs = [o for o in node.output if o and o in before]
            if any(o not in after for o in outputs):
                return False  # shape inference no longer knows it: the change broke something
            moved = [o for o in outputs if after[o] != before[o]]
            if not moved:
                continue
            if any(o in graph.outputs for o in moved) or not all(i in graph.constants or i in changed for i in node.input if i):
                return False
            changed.update(moved)
    return True


def _gather_in_order_as_reshape(graph: Graph, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
    """A Gather from a 1-D tensor whose indices, computed from shapes, are at every probe batch all of its
    positions in order: a Reshape to the indices' shape (the batch's axis -1). Exporters write a view of a
    contiguous tensor this way (torch's as_strided becomes Range > Mul > Add > Gather over the flat data)."""
    data, indices = node.input[0], node.input[1]
    if attribute(node, "axis", 0) != 0 or data not in first or data not in second:
        return
    shapes = []
    for probe, known in zip(at, (first, second)):
        order = np.asarray(probe[indices])
        if len(known[data]) != 1 or order.size != known[data][0] or not np.array_equal(order.reshape(-1), np.arange(order.size)):
            return
        shapes.append(order.shape)
    varying = [axis for axis, (a, b) in enumerate(zip(*shapes)) if a != b]
    if len(shapes[0]) != len(shapes[1]) or len(varying) > 1:
        return
    target = np.asarray(shapes[0], np.int64)
    target[varying] = -1  # the axis that follows the batch; the others are the same at every batch
    name = graph.new_name(f"{node.name or data}_target")
    graph.constants[name] = target
    node.op_type, node.input[1] = "Reshape", name
    del node.attribute[:]


def _drop_unread(graph: Graph, nodes: list[onnx.NodeProto], folded: dict[str, int]) -> None:
    """Drop those of `nodes` (shape arithmetic) whose outputs nobody reads any more, last first."""
    for node in reversed(nodes):
        if not any(graph.used(o) for o in node.output if o):
            graph.nodes.remove(node)
            count(folded, node.op_type)


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    start, end = attribute(node, "start", 0), attribute(node, "end", None)
    return np.array(shape[start:end], dtype=np.int64)
