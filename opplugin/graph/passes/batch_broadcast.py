"""An Expand to the batch's shape, rewritten so that its target no longer needs the batch as a number.

A vision transformer's class token is a constant (1, 1, D) expanded to (batch, 1, D) before it joins
the patch tokens: `cls_token.expand(x.shape[0], -1, -1)`, exported as Shape > Concat > Expand. The
target follows the batch, so it is computed at run time, and the Expand with its shape arithmetic
falls to onnxruntime, splitting the CUDA graph. Made for one image it would not concatenate with
the batch's tokens (shape_folding's _make_for_one_image refuses it).

Broadcasting gives the same tensor without the number: Where(True, data, probe), where `probe` is
(batch, 1, ..., 1), cut from a graph input whose first axis is the batch (Slice to one element per
image, Reshape to the target's rank). Where takes every element from `data` and none from the probe,
so the probe's values, NaN or not, never matter; only its batch does. The Where writes the Expand's
own output, so `check` compares it with the original tensor. Slice, Reshape and Where all run as
plugins, and the Shape arithmetic that computed the target goes with it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper

from ..ir import Graph

COUNT_KEY = "Expand to the batch"  # "1 Expand to the batch folded": the target's arithmetic is gone
MIN_OPSET = 10  # Slice with its bounds as inputs, and Where


def broadcast_to_batch(graph: Graph, candidates: Sequence[onnx.NodeProto], at: tuple[dict, dict], first: dict, second: dict,
                       batches: tuple[int, int]) -> int:
    """Rewrite each Expand of `candidates`, of a float32 constant, whose target is (batch, then extents of
    its input or 1) at both probe batches (`at`: the evaluated shape values; `first`, `second`: the static shapes there); how many."""
    source = _batch_source(graph, first, second, batches)
    if graph.opset < MIN_OPSET or source is None:
        return 0
    done = 0
    for expand in candidates:
        if expand in graph.nodes and _broadcasts_along_the_batch(expand, _static_shape(graph, expand.input[0]), at, batches):
            _rewrite(graph, expand, source, len(at[0][expand.input[1]]), first)
            done += 1
    return done


def _batch_source(graph: Graph, first: dict, second: dict, batches: tuple[int, int]) -> str | None:
    """A float32 graph input whose first axis is the batch at both probes."""
    for value in graph.proto.graph.input:
        name = value.name
        if name in graph.inputs and value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and \
                first.get(name, ())[:1] == (batches[0],) and second.get(name, ())[:1] == (batches[1],):
            return name
    return None


def _static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    """A float32 constant's shape (Where takes its value and the probe's type alike); else None."""
    value = graph.constant(name)
    return tuple(value.shape) if value is not None and value.dtype == np.float32 else None


def _broadcasts_along_the_batch(expand: onnx.NodeProto, shape: tuple[int, ...] | None, at: tuple[dict, dict],
                                batches: tuple[int, int]) -> bool:
    """Whether the target is the batch, then for each later axis 1 or the input's own extent there
    (lined up from the last axis), and the input (of `shape`) has 1 (or no axis) under the batch's."""
    targets = [np.asarray(probe.get(expand.input[1], [])).astype(np.int64).reshape(-1) for probe in at]
    if shape is None or len(targets[0]) < 1 or targets[0].shape != targets[1].shape:
        return False
    if [targets[0][0], targets[1][0]] != list(batches) or not np.array_equal(targets[0][1:], targets[1][1:]):
        return False
    rank = len(targets[0])
    if len(shape) > rank:
        return False
    lined_up = (1,) * (rank - len(shape)) + tuple(shape)
    return lined_up[0] == 1 and all(t in (1, d) for t, d in zip(targets[0][1:], lined_up[1:]))


def _rewrite(graph: Graph, expand: onnx.NodeProto, source: str, rank: int, first: dict) -> None:
    source_rank = len(first[source])
    made = []
    probe = source
    if source_rank > 1:  # one element per image
        bounds = [graph.new_name(f"{expand.name or expand.output[0]}_{part}") for part in ("starts", "ends", "axes")]
        graph.constants[bounds[0]] = np.zeros(source_rank - 1, np.int64)
        graph.constants[bounds[1]] = np.ones(source_rank - 1, np.int64)
        graph.constants[bounds[2]] = np.arange(1, source_rank, dtype=np.int64)
        probe = graph.new_name(f"{expand.output[0]}_batch_probe")
        made.append(helper.make_node("Slice", [source, *bounds], [probe], name=graph.new_name(f"{probe}_slice")))
    shape = graph.new_name(f"{expand.output[0]}_probe_shape")
    graph.constants[shape] = np.array([-1] + [1] * (rank - 1), np.int64)
    shaped = graph.new_name(f"{expand.output[0]}_probe")
    made.append(helper.make_node("Reshape", [probe, shape], [shaped], name=graph.new_name(f"{shaped}_reshape")))
    condition = graph.new_name(f"{expand.output[0]}_all")
    graph.constants[condition] = np.array(True)
    made.append(helper.make_node("Where", [condition, expand.input[0], shaped], [expand.output[0]],
                                 name=expand.name or graph.new_name(f"{expand.output[0]}_where")))
    at = graph.nodes.index(expand)
    graph.nodes[at:at + 1] = made
