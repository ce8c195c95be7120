"""Load-time graph simplification: the passes of graph/passes/ run in one ordered list over one
graph (ir.Graph), and what they did counted in a Simplification.

Why our own passes and not onnxsim, onnxoptimizer or onnxscript's optimizer: the job
is small, and each of those is a large dependency (onnxsim and onnxoptimizer are
C++ extensions without wheels for every Python, onnxscript brings its own IR and
sympy) whose rewrites would also rename or drop tensors that `check` compares with the
original graph. The folding itself is not hand-written: onnxruntime, the engine
the reference runs on, evaluates the constant nodes and the shape arithmetic
(graph/evaluate.py), and onnx's shape inference, on the graph without its weights,
gives the static shapes that Shape nodes fold to (graph/static_shapes.py).

The rule that keeps `check` meaningful, asserted after the passes (names_survive): graph
inputs and outputs keep their names, and every tensor a remaining node writes exists, with
the same values, in the original graph (a Conv with a BatchNormalization folded in writes the
BatchNormalization's output name), but for the views recorded in Simplification.views and
the new intermediate tensors a pass named through Graph.new_name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import onnx

from .bare import with_initializers
from .ir import Graph
from .passes.batchnorm_conv import fold_batchnorms
from .passes.constant_folding import fold_constants
from .passes.conv_affine import fold_channel_affines
from .passes.einsum import decompose_einsums
from .passes.gelu import fold_decomposed_gelus
from .passes.identities import drop_identities
from .passes.transpose_sink import sink_transposes_through_products
from .passes.layernorm import fold_decomposed_layernorms
from .passes.layout_sink import sink_channel_last_regions
from .passes.linear_batchnorm import fold_linear_batchnorms
from .passes.linear_scale import fold_linear_scales
from .passes.matmul_scales import fold_matmul_operand_scales
from .passes.row_gather import gather_rows


@dataclass(frozen=True)
class Simplification:
    """What simplification did, counted by op type."""

    constants_folded: dict[str, int] = field(default_factory=dict)  # op type -> nodes evaluated into initializers
    batchnorms_folded: int = 0  # BatchNormalization nodes folded into the Conv before them
    dropped: dict[str, int] = field(default_factory=dict)  # op type -> identities removed (Identity, Dropout, no-op layout)
    # a tensor written in another layout than the original's -> (original tensor, perm that makes it[, axes of 1
    # inserted after[, the shape it is then reshaped to, -1 for the batch]]): graph/passes/layout_sink.py,
    # graph/passes/einsum.py, graph/passes/linear_batchnorm.py
    views: dict[str, tuple] = field(default_factory=dict)
    # a tensor of the original graph no node writes after the passes -> what removed it (REMOVED_BY), for --keep
    removed: dict[str, str] = field(default_factory=dict)
    # a pass left out because it would remove a tensor kept (simplify_apart's `keep`) -> those tensors
    kept_from: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.constants_folded or self.batchnorms_folded or self.dropped or self.kept_from)

    def summary(self) -> str:
        """One line, e.g. "53 BatchNormalization folded into Conv, 239 ConstantOfShape folded"."""
        parts = [f"{self.batchnorms_folded} BatchNormalization folded into Conv"] if self.batchnorms_folded else []
        parts += [f"{count} {op} folded" for op, count in self.constants_folded.items()]
        parts += [f"{count} {op} dropped" for op, count in self.dropped.items()]
        parts += [f"not done, for the kept {', '.join(names)}: {what}" for what, names in self.kept_from.items()]
        return ", ".join(parts) or "nothing to simplify"

    def as_json(self) -> dict:
        done = {"constants_folded": dict(self.constants_folded), "batchnorms_folded": self.batchnorms_folded, "dropped": dict(self.dropped)}
        if self.kept_from:  # only where a --keep left a pass out
            done["not_done_for_keep"] = {what: list(names) for what, names in self.kept_from.items()}
        return done


def simplify(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Simplification]:
    """A simplified copy of `model` (left untouched), whole, and what was done."""
    bare, constants, done = simplify_apart(model)
    return with_initializers(bare, constants), done


# The passes in order, each with the Simplification field its counts add to. The LayerNorm pattern's
# constants are folded before it is matched; the Conv's BatchNormalizations fold before the linear
# layers' and before the channel affines (a scale after a folded Conv folds too).
PASSES: tuple[tuple[Callable[[Graph], dict[str, int] | int], str], ...] = (
    (drop_identities, "dropped"),
    (fold_constants, "constants_folded"),
    (drop_identities, "dropped"),  # again: pads and perms that were computed are constants now
    (fold_decomposed_layernorms, "constants_folded"),
    (fold_decomposed_gelus, "constants_folded"),
    (sink_channel_last_regions, "constants_folded"),
    (decompose_einsums, "constants_folded"),
    (fold_batchnorms, "batchnorms_folded"),
    (fold_linear_batchnorms, "constants_folded"),
    (fold_channel_affines, "constants_folded"),
    (fold_linear_scales, "constants_folded"),
    (fold_matmul_operand_scales, "constants_folded"),
    (sink_transposes_through_products, "constants_folded"),
    (gather_rows, "constants_folded"),
)

# Each pass in words, for the plan's line on a pass left out for --keep.
PASS_NAMES: dict[Callable, str] = {
    drop_identities: "dropping Identity, Dropout and no-op layout nodes",
    fold_constants: "constant folding",
    fold_decomposed_layernorms: "writing decomposed LayerNormalizations as one node",
    fold_decomposed_gelus: "writing decomposed GELUs as one node",
    sink_channel_last_regions: "rewriting channel-last regions in NCHW",
    decompose_einsums: "writing Einsums as MatMul",
    fold_batchnorms: "folding BatchNormalization into Conv",
    fold_linear_batchnorms: "folding BatchNormalization into linear layers",
    fold_channel_affines: "folding per-channel scales and shifts into the layer before",
    fold_linear_scales: "folding layer scales into the linear layers before them",
    fold_matmul_operand_scales: "moving the scales of a product's operands after it",
    sink_transposes_through_products: "moving Transposes after the products by constant matrices that read them",
    gather_rows: "writing layout chains that move whole rows as one Gather",
}

# What each pass does to the tensors it removes, in words: why a tensor the file names is not computed.
REMOVED_BY: dict[Callable, str] = {
    drop_identities: "an Identity, Dropout or no-op layout node is dropped at load",
    fold_constants: "it is folded into a constant at load: its value does not depend on the inputs",
    fold_decomposed_layernorms: "it is inside a LayerNormalization pattern written as one node at load",
    fold_decomposed_gelus: "it is inside a GELU pattern written as one node at load",
    sink_channel_last_regions: "it is inside a channel-last region rewritten in NCHW at load",
    decompose_einsums: "its Einsum is written as MatMul at load",
    fold_batchnorms: "the BatchNormalization after it is folded into the Conv that writes it, at load",
    fold_linear_batchnorms: "the BatchNormalization after it is folded into the layer that writes it, at load",
    fold_channel_affines: "the per-channel scale or shift after it is folded into the layer that writes it, at load",
    fold_linear_scales: "the layer scale after it is folded into the linear layer that writes it, at load",
    fold_matmul_operand_scales: "its scale is moved after the MatMul that reads it, at load",
    sink_transposes_through_products: "its rows are permuted after the product by a constant matrix instead of before, at load",
    gather_rows: "it is inside a chain of layout nodes that only moves rows, written as one Gather at load",
}


class NamesLost(RuntimeError):
    """A pass broke the rule that names survive (see the module's docstring): `check` could not compare."""


def simplify_apart(model: onnx.ModelProto, keep: Iterable[str] = ()) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Simplification]:
    """The simplified graph without its initializers, the initializers it reads as arrays, and
    what was done; `model` is left untouched. Apart, so that the weights exist once, as arrays:
    nothing later has to serialise them to learn a shape. Raises NamesLost where a pass broke the rule.

    A pass that would remove a tensor of `keep` (--keep: a tensor a run hands back) is left out, and
    the passes run again without it: the run then computes that tensor, at the cost of the pass's
    rewrites elsewhere (Simplification.kept_from says which)."""
    keep = tuple(dict.fromkeys(keep))  # in the order given: the names each left-out pass lists
    left_out: dict[Callable, tuple[str, ...]] = {}
    while True:
        bare, constants, done, removers = _run_passes(model, [entry for entry in PASSES if entry[0] not in left_out])
        hit = {name: removers[name] for name in keep if name in done.removed}
        if not hit:
            kept_from = {PASS_NAMES.get(run, run.__name__): names for run, names in left_out.items()}
            return bare, constants, dataclasses.replace(done, kept_from=kept_from)
        for name, run in hit.items():
            left_out[run] = (*left_out.get(run, ()), name)


def _run_passes(model: onnx.ModelProto, passes) -> tuple[onnx.ModelProto, dict[str, np.ndarray], Simplification, dict[str, Callable]]:
    """simplify_apart's one go over `passes`, with the pass that removed each removed tensor."""
    graph = Graph(model)
    counts: dict[str, Any] = {"constants_folded": {}, "batchnorms_folded": 0, "dropped": {}}
    removers: dict[str, Callable] = {}
    for run, field_name in passes:
        written = _written(graph)
        done = run(graph)
        for name in written - _written(graph):
            removers.setdefault(name, run)
        if isinstance(done, int):  # fold_batchnorms: one number
            counts[field_name] += done
        else:  # by op type, or by what the pass rewrites
            for key, count in done.items():
                counts[field_name][key] = counts[field_name].get(key, 0) + count
    graph.write_back()  # constants that only fed folded nodes go too
    names_survive(model, graph)
    left = _written(graph)  # a later pass may write a name again
    removers = {name: run for name, run in removers.items() if name not in left}
    removed = {name: REMOVED_BY.get(run, f"{run.__name__} removes it at load") for name, run in removers.items()}
    return graph.proto, graph.constants, Simplification(**counts, views=graph.views, removed=removed), removers


def _written(graph: Graph) -> set[str]:
    return {name for node in graph.nodes for name in node.output if name}


def names_survive(original: onnx.ModelProto, graph: Graph) -> None:
    """Raise NamesLost unless the rewritten `graph` keeps the names of `original` (module docstring)."""
    constants = {t.name for t in original.graph.initializer}
    inputs = [i.name for i in original.graph.input if i.name not in constants]
    if [i.name for i in graph.proto.graph.input] != inputs:
        raise NamesLost(f"graph inputs {inputs} became {[i.name for i in graph.proto.graph.input]}")
    if [o.name for o in graph.proto.graph.output] != [o.name for o in original.graph.output]:
        raise NamesLost("the graph outputs were renamed")
    written = {o for node in original.graph.node for o in node.output}
    for node in graph.nodes:
        for name in node.output:
            if name and name not in written and name not in graph.views and name not in graph.new_names:
                raise NamesLost(f"{node.op_type} node {node.name!r} writes {name!r}, a tensor the original graph does not have")
