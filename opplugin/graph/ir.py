"""The graph every load-time pass rewrites (graph/passes/): the model's nodes as a list of
NodeProtos that passes edit in place, its constants as arrays, and the questions the passes ask
of it (who reads a tensor, who writes it, which constant it is, a free name for a new tensor).

Names are the graph's identity here, as in the ONNX file: a pass keeps `check` meaningful by
having a rewritten node write the name the original node wrote (graph/simplify.py states the
rule and asserts it after the passes). Names a pass needs for new tensors come from new_name,
which remembers them so that the rule can tell them from names that merely went missing.

Why not onnx_ir, the IR onnxscript's optimizer and rewriter work on: it would bring sympy, mpmath and
ml_dtypes (about 90 MB, and 0.25 s more to import) into an install whose core needs only onnx and
numpy; its tensors are Value objects whose names follow them, where these passes keep `check`
meaningful by having a new node write an old name; and moving the passes onto it would put at
risk the exact graphs, names and counts the tests pin, for no rewrite that needs it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from ..core.node_reads import has_subgraphs, reads, rename_reads
from .bare import copy_without_initializers
from .functions import default_opset

DEFAULT_DOMAINS = ("", "ai.onnx")


class Graph:
    """A model's graph while the passes rewrite it; write_back puts the nodes into `proto`."""

    def __init__(self, model: onnx.ModelProto):
        self.proto = copy_without_initializers(model)  # `model` stays untouched: the passes edit nodes in place
        graph = self.proto.graph
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.inputs: set[str] = {i.name for i in graph.input if i.name not in self.constants}
        self.outputs: set[str] = {o.name for o in graph.output}
        self.views: dict[str, tuple] = {}  # see Simplification.views
        # whether a node's subgraph may read a tensor by name (node_reads.py); passes make no such node
        self.scoped = any(has_subgraphs(n) for n in self.nodes)
        self.new_names: set[str] = set()  # every name new_name handed out
        # every tensor name of the model as loaded: a new tensor never takes one, even where the tensor
        # is gone (a dropped Identity's output), or `check` would compare it with the original's values
        self.original_names: frozenset[str] = frozenset(
            {*self.constants, *self.inputs, *(o for n in model.graph.node for o in n.output if o)})

    @property
    def opset(self) -> int:
        """The model's opset of the default ONNX domain."""
        return default_opset(self.proto)

    def readers(self, name: str) -> list[onnx.NodeProto]:
        """The nodes that read `name`: as an input, or in a subgraph (an If's branch reading it by name)."""
        return [n for n in self.nodes if name in self.reads(n)]

    def reads(self, node: onnx.NodeProto) -> Sequence[str]:
        """What `node` reads (its inputs, and in a graph with subgraphs what they read by name)."""
        return reads(node) if self.scoped else node.input

    def writer(self, name: str) -> onnx.NodeProto | None:
        """The node that writes `name`; None for a graph input or a constant."""
        return next((n for n in self.nodes if name in n.output), None)

    def only_reader(self, name: str, op_type: str | None = None) -> onnx.NodeProto | None:
        """The node that alone reads `name`, when `name` is no graph output (a pass may then
        rewrite the pair as one), and with `op_type` only an ONNX node of that type; else None."""
        readers = self.readers(name)
        if len(readers) != 1 or name in self.outputs:
            return None
        reader = readers[0]
        if op_type is not None and (reader.op_type != op_type or reader.domain not in DEFAULT_DOMAINS):
            return None
        return reader

    def constant(self, name: str) -> np.ndarray | None:
        """The value of the constant `name`; None where `name` is computed or an input."""
        return self.constants.get(name)

    def rename_reads(self, old: str, new: str) -> None:
        for node in self.nodes:
            rename_reads(node, old, new)

    def used(self, name: str) -> bool:
        return name in self.outputs or any(name in self.reads(n) for n in self.nodes)

    def new_name(self, base: str) -> str:
        """`base`, or `base` with the first free suffix: no tensor of the graph as loaded or as it is
        now has it, and new_name never handed it out before."""
        taken = self.original_names | self.new_names | set(self.constants) | {o for n in self.nodes for o in n.output}
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        self.new_names.add(name)
        return name

    def write_nodes(self) -> None:
        """The nodes as they are now into `proto` (shape inference reads them there)."""
        self.proto.graph.ClearField("node")
        self.proto.graph.node.extend(self.nodes)

    def write_back(self) -> None:
        """The nodes into `proto`, and only the constants some node (or the output) reads kept."""
        self.write_nodes()
        graph = self.proto.graph
        used = self.outputs | {name for node in self.nodes for name in self.reads(node)}
        self.constants = {name: value for name, value in self.constants.items() if name in used}
        # IR 3 lists initializers among the graph inputs: with_initializers lists them again
        inputs = [i for i in graph.input if i.name in self.inputs]
        graph.ClearField("input")
        graph.input.extend(inputs)
        graph.ClearField("value_info")  # stale after renames: shape inference makes them again
