"""Load-time graph simplification: constant subgraphs folded into initializers,
shape arithmetic (Shape > Gather > ... > Reshape) folded where it does not depend on
the batch, inference BatchNormalization folded into the Conv before it, Identity and
inference Dropout dropped.

The graph stays valid at every batch: the runner runs one plan on chunks of several
sizes, and one onnxruntime session per step serves them all. So shape arithmetic is
evaluated at two batches, and only what is the same at both folds; a Reshape target
that carries the batch gets -1 (or 0) in its place (see _fold_shape_arithmetic).
Every shape is then concrete once the batch is: the plan's shape inference, at the
plan's batch, gives every plugin concrete H and W.

Why a hand pass and not onnxsim, onnxoptimizer or onnxscript's optimizer: the job
is small, and each of those is a large dependency (onnxsim and onnxoptimizer are
C++ extensions without wheels for every Python, onnxscript brings its own IR)
whose rewrites would also rename or drop tensors that `check` compares with the
original graph. The folding itself is not hand-written: onnxruntime, the engine
the reference runs on, evaluates the constant nodes and the shape arithmetic (onnx's
ReferenceEvaluator fails on opset-9 Unsqueeze, which DenseNet and Inception exports
use), and onnx's shape inference, on the graph without its weights (bare.py),
gives the static shapes that Shape nodes fold to.

Rules that keep `check` meaningful: graph inputs and outputs keep their names, and
every tensor a remaining node writes exists, with the same values, in the original
graph (a Conv with a BatchNormalization folded in writes the BatchNormalization's
output name).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .passes.batch_broadcast import COUNT_KEY as BROADCAST_KEY
from .passes.batch_broadcast import broadcast_to_batch
from .passes.conv_affine import fold_channel_affine, fold_channel_affines
from .passes.linear_batchnorm import batchnorm_affine, fold_linear_batchnorms
from .attributes import attribute
from .passes.layout_sink import sink_channel_last_regions
from .passes.einsum import decompose_einsums
from .passes.gelu import fold_decomposed_gelus
from .passes.layernorm import fold_decomposed_layernorms
from .bare import SMALL_CONSTANT, copy_without_initializers, skeleton, with_initializers

# Ops whose value is not a function of their inputs, and ops with subgraphs: never folded.
NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
                "If", "Loop", "Scan", "SequenceMap"}


# Ops that compute shapes from shapes: evaluated over Shape's values at each probe batch.
SHAPE_ARITHMETIC = {"Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul", "Div", "Mod",
                    "Floor", "Ceil", "Neg", "Abs", "Min", "Max", "Reshape", "Flatten", "Identity", "ReduceProd",
                    "ReduceSum", "Equal", "Less", "Greater", "Not", "Where", "Range", "Sqrt"}
# The batches shape arithmetic is evaluated at: a value the same at both does not depend on
# the batch (one small and one large, so that neither a clamp nor an integer division of the
# batch is mistaken for a constant).
PROBE_BATCHES = (2, 1009)
# a batch of rewrites that shape inference refuses is tried again one at a time, at most this many (each
# try infers the graph's shapes twice)
MAX_ONE_IMAGE_TRIES = 8


@dataclass(frozen=True)
class Simplification:
    """What simplification did, counted by op type."""

    constants_folded: dict[str, int] = field(default_factory=dict)  # op type -> nodes evaluated into initializers
    batchnorms_folded: int = 0  # BatchNormalization nodes folded into the Conv before them
    dropped: dict[str, int] = field(default_factory=dict)  # op type -> identities removed (Identity, Dropout)
    # a tensor written in another layout than the original's -> (original tensor, perm that makes it[, axes of 1
    # inserted after[, the shape it is then reshaped to, -1 for the batch]]): graph/passes/layout_sink.py,
    # graph/passes/einsum.py, graph/passes/linear_batchnorm.py
    views: dict[str, tuple] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.constants_folded or self.batchnorms_folded or self.dropped)

    def describe(self) -> str:
        """One line, e.g. "53 BatchNormalization folded into Conv, 239 ConstantOfShape folded"."""
        parts = [f"{self.batchnorms_folded} BatchNormalization folded into Conv"] if self.batchnorms_folded else []
        parts += [f"{count} {op} folded" for op, count in self.constants_folded.items()]
        parts += [f"{count} {op} dropped" for op, count in self.dropped.items()]
        return ", ".join(parts) or "nothing to simplify"

    def as_json(self) -> dict:
        return {"constants_folded": dict(self.constants_folded), "batchnorms_folded": self.batchnorms_folded,
                "dropped": dict(self.dropped)}


def simplify(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Simplification]:
    """A simplified copy of `model` (left untouched), whole, and what was done."""
    bare, constants, done = simplify_apart(model)
    return with_initializers(bare, constants), done


def simplify_apart(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Simplification]:
    """The simplified graph without its initializers, the initializers it reads as arrays, and
    what was done; `model` is left untouched. Apart, so that the weights exist once, as arrays:
    nothing later has to serialise them to learn a shape."""
    graph = _Graph(model)
    dropped = graph.drop_identities()
    folded = graph.fold_constants() | fold_decomposed_layernorms(graph)  # the LayerNorm pattern's constants are folded by now
    folded |= fold_decomposed_gelus(graph) | sink_channel_last_regions(graph) | decompose_einsums(graph)
    batchnorms = graph.fold_batchnorms()
    folded |= fold_linear_batchnorms(graph) | fold_channel_affines(graph)  # after the Conv's: a scale after one folds too
    graph.write_back()  # constants that only fed folded nodes go too
    return graph.proto, graph.constants, Simplification(folded, batchnorms, dropped, graph.views)


def _count(counts: dict[str, int], op: str) -> None:
    counts[op] = counts.get(op, 0) + 1


class _Graph:
    """The graph being simplified: its nodes as a list, its constants as arrays."""

    def __init__(self, model: onnx.ModelProto):
        self.proto = copy_without_initializers(model)  # the passes edit nodes in place
        graph = self.proto.graph
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.inputs = {i.name for i in graph.input if i.name not in self.constants}
        self.outputs = {o.name for o in graph.output}
        self.views: dict[str, tuple] = {}  # see Simplification.views

    # --- helpers --------------------------------------------------------------------------

    def readers(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.nodes if name in n.input]

    def writer(self, name: str) -> onnx.NodeProto | None:
        """The node that writes `name`; None for a graph input or a constant."""
        return next((n for n in self.nodes if name in n.output), None)

    def rename_reads(self, old: str, new: str) -> None:
        for node in self.nodes:
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new

    def used(self, name: str) -> bool:
        return name in self.outputs or any(name in n.input for n in self.nodes)

    def new_name(self, base: str) -> str:
        taken = set(self.constants) | self.inputs | {o for n in self.nodes for o in n.output}
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        return name

    # --- Identity and Dropout ---------------------------------------------------------------

    def drop_identities(self) -> dict[str, int]:
        dropped: dict[str, int] = {}
        for node in list(self.nodes):
            if node.domain not in ("", "ai.onnx") or not self._is_identity(node):
                continue
            source, result = node.input[0], node.output[0]
            if result not in self.outputs:
                self.nodes.remove(node)
                self.rename_reads(result, source)
            elif self._can_take_name(source):
                # the graph output keeps its name: the producer writes it directly
                producer = next(n for n in self.nodes if source in n.output)
                self.nodes.remove(node)
                producer.output[list(producer.output).index(source)] = result
                self.rename_reads(source, result)
            else:
                continue
            _count(dropped, node.op_type)
        return dropped

    def _is_identity(self, node: onnx.NodeProto) -> bool:
        """Identity, or a Dropout in inference mode whose mask nobody reads."""
        if node.op_type == "Identity":
            return len(node.input) == 1 and len(node.output) == 1
        if node.op_type != "Dropout" or not node.input or not node.input[0]:
            return False
        if any(a.name == "is_test" and a.i == 0 for a in node.attribute):  # opset < 7: training
            return False
        if len(node.input) > 2 and node.input[2]:  # training_mode (opset 12+): only a constant false
            mode = self.constants.get(node.input[2])
            if mode is None or bool(np.asarray(mode).any()):
                return False
        mask = node.output[1] if len(node.output) > 1 else ""
        return not (mask and self.used(mask))

    def _can_take_name(self, source: str) -> bool:
        """Whether the node writing `source` can write a graph output's name instead."""
        producers = [n for n in self.nodes if source in n.output]
        return bool(producers) and source not in self.outputs and source not in self.inputs

    # --- constant folding -------------------------------------------------------------------

    def fold_constants(self) -> dict[str, int]:
        """Evaluate every node whose inputs are all constant, and the shape arithmetic over
        Shape and Size of tensors whose shapes are static but for the batch, into initializers,
        until a pass folds nothing more (see _fold_shape_arithmetic)."""
        folded: dict[str, int] = {}
        while True:
            before = sum(folded.values())
            has_shapes = any(n.op_type in ("Shape", "Size") for n in self.nodes)
            probes = self.probe_shapes() if has_shapes else ({}, {})
            known = set(self.constants)
            batch: list[onnx.NodeProto] = []
            for node in list(self.nodes):
                if self._foldable(node) and all(name in known for name in node.input if name) and \
                        node.op_type not in ("Shape", "Size"):
                    batch.append(node)
                    known.update(o for o in node.output if o)
            values = self._evaluate(batch) if batch else {}
            for node in batch:
                if all(o in values for o in node.output if o):
                    self._fold(node, [values.get(o) for o in node.output], folded)
            if has_shapes:
                self._fold_shape_arithmetic(*probes, folded)
            if sum(folded.values()) == before:
                return folded

    def _fold_shape_arithmetic(self, first: dict[str, tuple[int, ...]], second: dict[str, tuple[int, ...]],
                               folded: dict[str, int]) -> None:
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
        for node in self.nodes:
            if not self._foldable(node):
                continue
            if node.op_type in ("Shape", "Size") and node.input[0] in first and node.input[0] in second:
                shape_nodes.append(node)
            elif node.op_type in SHAPE_ARITHMETIC and any(i in names for i in node.input) and self._over_shapes(node, names):
                arithmetic.append(node)
            else:
                continue
            names.update(o for o in node.output if o)
        if not shape_nodes:
            return
        at = tuple({node.output[0]: _shape_value(node, shapes[node.input[0]]) for node in shape_nodes} for shapes in (first, second))
        for probe in at:  # one evaluation per probe batch, by onnxruntime
            probe.update(self._evaluate(arithmetic, dict(probe)) if arithmetic else {})
        computed = []
        chosen = {id(n) for n in [*shape_nodes, *arithmetic]}
        for node in [n for n in self.nodes if id(n) in chosen]:  # graph order
            outputs = [o for o in node.output if o]
            if not all(o in probe for probe in at for o in outputs):
                continue  # onnxruntime could not evaluate it: it stays
            if all(np.array_equal(at[0][o], at[1][o]) for o in outputs):
                self._fold(node, [at[0][o] if o else None for o in node.output], folded)
            else:
                computed.append(node)
        one_image: list[tuple[onnx.NodeProto, int]] = []  # (node, place of its shape input): see _make_for_one_image
        for node in self.nodes:
            if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in at[0] and node.input[1] not in self.constants:
                self._fix_reshape_target(node, at, first, second)
            elif node.op_type == "Gather" and node.input[1] in at[0] and node.input[1] not in self.constants:
                self._gather_in_order_as_reshape(node, at, first, second)
            elif node.op_type == "Expand" and node.input[1] in at[0] and node.input[1] not in self.constants:
                if node.input[0] in self.constants:
                    one_image.append((node, 1))
                else:
                    self._fix_expand_target(node, at, first, second)
            elif node.op_type == "ConstantOfShape" and node.input[0] in at[0] and node.input[0] not in self.constants:
                one_image.append((node, 0))
        self._make_for_one_image(one_image, at, first, second)
        leftover = [n for n in self.nodes if n.op_type == "Expand" and n.input[1] in at[0] and n.input[1] not in self.constants]
        if leftover and (count := broadcast_to_batch(self, leftover, at, first, second, PROBE_BATCHES)):
            folded[BROADCAST_KEY] = folded.get(BROADCAST_KEY, 0) + count
        self._drop_unread(computed, folded)

    def _over_shapes(self, node: onnx.NodeProto, shape_values: set[str]) -> bool:
        """Whether every input of `node` is a small constant or a shape value."""
        return all(not name or name in shape_values or
                   (name in self.constants and np.size(self.constants[name]) <= SMALL_CONSTANT) for name in node.input)

    def _fix_reshape_target(self, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
        """A constant target for a Reshape whose target follows the batch (see _fold_shape_arithmetic)."""
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
        name = self.new_name(f"{node.name or data}_target")
        self.constants[name] = target
        node.input[1] = name

    def _fix_expand_target(self, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
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
        name = self.new_name(f"{node.name or data}_target")
        self.constants[name] = target
        node.input[1] = name

    def _make_for_one_image(self, candidates: list[tuple[onnx.NodeProto, int]], at: tuple[dict, dict], first: dict,
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
                name = self.new_name(f"{node.name or node.output[0]}_one_image")
                self.constants[name] = target
                changes.append((node, position, node.input[position], name))
        if not changes:
            return

        def apply(chosen, on: bool) -> None:
            for node, position, computed, name in chosen:
                node.input[position] = name if on else computed

        apply(changes, True)
        if self._only_constants_reshaped(first, second):
            return
        apply(changes, False)
        for change in changes[:MAX_ONE_IMAGE_TRIES] if len(changes) > 1 else []:
            apply([change], True)
            if not self._only_constants_reshaped(first, second):
                apply([change], False)
        for node, position, computed, name in changes:
            if node.input[position] != name:
                del self.constants[name]

    def _only_constants_reshaped(self, first: dict, second: dict) -> bool:
        """Whether, at both probe batches, every tensor shape inference knew keeps its shape, but those
        whose nodes read constants and such tensors alone (they fold), and no graph output changes."""
        for before, batch in ((first, PROBE_BATCHES[0]), (second, PROBE_BATCHES[1])):
            after = self._static_shapes(batch)
            changed: set[str] = set()
            for node in self.nodes:
                outputs = [o for o in node.output if o and o in before]
                if any(o not in after for o in outputs):
                    return False  # shape inference no longer knows it: the change broke something
                moved = [o for o in outputs if after[o] != before[o]]
                if not moved:
                    continue
                if any(o in self.outputs for o in moved) or not all(i in self.constants or i in changed for i in node.input if i):
                    return False
                changed.update(moved)
        return True

    def _gather_in_order_as_reshape(self, node: onnx.NodeProto, at: tuple[dict, dict], first: dict, second: dict) -> None:
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
        name = self.new_name(f"{node.name or data}_target")
        self.constants[name] = target
        node.op_type, node.input[1] = "Reshape", name
        del node.attribute[:]

    def _drop_unread(self, nodes: list[onnx.NodeProto], folded: dict[str, int]) -> None:
        """Drop those of `nodes` (shape arithmetic) whose outputs nobody reads any more, last first."""
        for node in reversed(nodes):
            if not any(self.used(o) for o in node.output if o):
                self.nodes.remove(node)
                _count(folded, node.op_type)

    def _foldable(self, node: onnx.NodeProto) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type in NOT_FOLDABLE:
            return False
        return not any(o in self.outputs for o in node.output)  # a graph output stays the output of a node

    def _fold(self, node: onnx.NodeProto, values: list, folded: dict[str, int]) -> None:
        self.nodes.remove(node)
        for name, value in zip(node.output, values):
            if name:
                self.constants[name] = value
        _count(folded, node.op_type)

    def _evaluate(self, nodes: list[onnx.NodeProto], extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The outputs of `nodes` (constant inputs only), evaluated by onnxruntime, the
        engine the reference runs: folded values are the ones the original graph has.
        Nodes onnxruntime cannot run as a group are tried one by one; those that still
        fail stay in the graph."""
        values = self._run(nodes, extra)
        if values is not None or len(nodes) == 1:
            return values or {}
        values = dict(extra or {})
        for node in nodes:
            if all(name in self.constants or name in values for name in node.input if name):
                values.update(self._run([node], values) or {})
        return values

    def _run(self, nodes: list[onnx.NodeProto], extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray] | None:
        from ..ort.sessions import session

        available = {**self.constants, **(extra or {})}
        produced = {o for n in nodes for o in n.output if o}
        read = dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced)
        outputs = [o for n in nodes for o in n.output if o]
        graph = helper.make_graph(nodes, "constants", [], [helper.make_empty_tensor_value_info(o) for o in outputs],
                                  initializer=[numpy_helper.from_array(np.asarray(available[i]), i) for i in read])
        model = helper.make_model(graph, opset_imports=list(self.proto.opset_import))
        model.ir_version = max(self.proto.ir_version, 4)
        try:
            results = session(model, arena=False).run(outputs, {})
        except Exception:  # an op onnxruntime cannot run on its own: it stays in the graph
            return None
        if not all(isinstance(r, np.ndarray) for r in results):  # sequences and maps stay too
            return None
        return dict(zip(outputs, results))

    def probe_shapes(self) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
        """Static shapes at each of the PROBE_BATCHES (inferred once when no input's batch is free)."""
        free = any(not i.type.tensor_type.shape.dim[:1] or not i.type.tensor_type.shape.dim[0].HasField("dim_value")
                   for i in self.proto.graph.input if i.name in self.inputs)
        if not free:
            shapes = self._static_shapes(PROBE_BATCHES[0])
            return shapes, shapes
        return self._static_shapes(PROBE_BATCHES[0]), self._static_shapes(PROBE_BATCHES[1])

    def _static_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """Tensors whose every dimension is a known number, from onnx's shape inference with
        `batch` as the first axis of the graph inputs that leave it free."""
        self.proto.graph.ClearField("node")
        self.proto.graph.node.extend(self.nodes)
        try:
            inferred = shape_inference.infer_shapes(skeleton(self.proto, self.constants, batch), data_prop=True)
        except Exception:  # no shapes: Shape nodes simply stay
            return {}
        shapes = {}
        for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
            dims = value.type.tensor_type.shape.dim
            if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shapes[value.name] = tuple(d.dim_value for d in dims)
        return shapes

    # --- BatchNormalization into Conv -------------------------------------------------------

    def fold_batchnorms(self) -> int:
        folded = 0
        for bn in list(self.nodes):
            conv = self._foldable_conv(bn)
            if conv is None:
                continue
            weights, bias = fold_batchnorm(
                self.constants[conv.input[1]],
                self.constants[conv.input[2]] if len(conv.input) > 2 and conv.input[2] else None,
                *(self.constants[name] for name in bn.input[1:5]),
                epsilon=attribute(bn, "epsilon", 1e-5),
            )
            names = [self.new_name(f"{conv.input[1]}_bn"), self.new_name(f"{bn.input[2]}_conv")]
            for name, value in zip(names, (weights, bias)):
                self.constants[name] = value
            data = conv.input[0]
            del conv.input[:]
            conv.input.extend([data, *names])
            conv.output[0] = bn.output[0]  # the folded Conv writes what the BatchNormalization wrote
            self.nodes.remove(bn)
            folded += 1
        return folded

    def _foldable_conv(self, bn: onnx.NodeProto) -> onnx.NodeProto | None:
        """The Conv that `bn` can fold into, or None: an inference BatchNormalization with
        constant parameters, after a float32 Conv with constant weights whose output
        nobody else reads."""
        if batchnorm_affine(self.constants, bn) is None:
            return None
        source = bn.input[0]
        conv = self.writer(source)
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.output) != 1:
            return None
        if source in self.outputs or len(self.readers(source)) != 1:
            return None
        constant_inputs = [n for n in conv.input[1:] if n]
        if not all(name in self.constants for name in constant_inputs):
            return None
        weights = self.constants[conv.input[1]]
        if weights.dtype != np.float32 or any(self.constants[n].shape != (weights.shape[0],) for n in bn.input[1:5]):
            return None
        return conv

    # --- writing back -----------------------------------------------------------------------

    def write_back(self) -> None:
        """The nodes into the proto, and only the constants some node (or the output) reads kept."""
        graph = self.proto.graph
        graph.ClearField("node")
        graph.node.extend(self.nodes)
        used = self.outputs | {name for node in self.nodes for name in node.input}
        self.constants = {name: value for name, value in self.constants.items() if name in used}
        # IR 3 lists initializers among the graph inputs: with_initializers lists them again
        inputs = [i for i in graph.input if i.name in self.inputs]
        graph.ClearField("input")
        graph.input.extend(inputs)
        graph.ClearField("value_info")  # stale after renames: shape inference makes them again


def fold_batchnorm(weights: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, offset: np.ndarray,
                   mean: np.ndarray, var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """A Conv's weights and bias with the inference BatchNormalization after it folded in,
    computed in float64 and stored as float32:
    W' = W * scale / sqrt(var + eps) per output channel, b' = (b - mean) * scale / sqrt(var + eps) + B."""
    factor = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + np.float64(epsilon))
    return fold_channel_affine(weights, bias, factor, offset.astype(np.float64) - mean.astype(np.float64) * factor)


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    start, end = attribute(node, "start", 0), attribute(node, "end", None)
    return np.array(shape[start:end], dtype=np.int64)

