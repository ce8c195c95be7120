"""Channel-last regions rewritten back to NCHW, so that their transposes go.

Exporters of channel-last blocks (ConvNeXt's MLP) write

    X (NCHW) > Transpose(0,2,3,1) > LayerNormalization(axis -1) > MatMul(C->4C) > Add bias > GELU
      > MatMul(4C->C) > Add bias > Transpose(0,3,1,2)

Every op between the two transposes acts on the last axis or elementwise, so each has an NCHW
form: a MatMul by a constant [C, K] is a 1x1 Conv (with the Add of a constant [K] as its bias),
a LayerNormalization over the last axis one over the channel axis (the opplugin-domain function
of layernorm_pattern.py, which the reduction plugin runs with the channels H*W apart), and an
elementwise op the same op with its constant operands transposed ([C] becomes [C, 1, 1]).
Written that way, the region reads X and writes the closing Transpose's output directly, and
its MatMuls run on the Conv families.

A region is found in one pass in graph (topological) order: the outputs of Transpose(0,2,3,1)
are channel-last, and so is the output of every node of the forms above whose tensor inputs
are all channel-last. Connected channel-last tensors form a region; its borders are the
Transpose(0,3,1,2) readers (dropped) and every other reader (a Reshape, a reduction over other
axes, a graph output), which gets a Transpose back to the channel-last tensor it read, under its
original name: a moved transpose never changes a result. A region is rewritten only where it
drops more transposes than it adds (or as many, and turns a MatMul into a Conv).

A tensor the region writes in NCHW under a new name is recorded as a view of the original
channel-last tensor (`views`: name -> (original, perm)), so that `check` compares it with the
original graph's tensor, transposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ..attributes import attribute
from ..functions import OPPLUGIN_DOMAIN
from ..ir import Graph
from .layernorm import FUNCTION_NAME as LAYERNORM_FUNCTION, declare_function as declare_layernorm

TO_CHANNEL_LAST = (0, 2, 3, 1)
TO_CHANNEL_FIRST = (0, 3, 1, 2)
COUNT_KEY = "channel-last Transpose"  # the summary reads "12 channel-last Transpose folded"

# elementwise ops whose first input is the tensor and whose other inputs, if any, are constants of one element
UNARY = {"Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Elu", "Softplus", "Gelu", "Erf",
         "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Identity"}
# elementwise ops of broadcasting tensors: each operand a channel-last tensor or a constant of rank <= 4
BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Sum", "PRelu"}


@dataclass
class _Region:
    """One connected set of channel-last tensors and what reads and writes them."""

    tensors: set[str] = field(default_factory=set)
    starts: list[onnx.NodeProto] = field(default_factory=list)  # Transpose(0,2,3,1): channel-last from NCHW
    ends: list[onnx.NodeProto] = field(default_factory=list)  # Transpose(0,3,1,2): back to NCHW
    nodes: list[onnx.NodeProto] = field(default_factory=list)  # the nodes rewritten to NCHW
    kept: set[str] = field(default_factory=set)  # channel-last tensors something outside reads (or the graph gives out)

    @property
    def matmuls(self) -> int:
        return sum(n.op_type == "MatMul" for n in self.nodes)

    def worth_it(self) -> bool:
        """Whether the rewrite drops more transposes than it adds (a start whose output is
        kept stays as it is); as many, where a MatMul becomes a Conv."""
        added = len(self.kept - {s.output[0] for s in self.starts})
        dropped = len(self.ends) + len([s for s in self.starts if s.output[0] not in self.kept])
        return dropped > added or (dropped == added and self.matmuls > 0)


def sink_channel_last_regions(graph: Graph) -> dict[str, int]:
    """Rewrite every worthwhile channel-last region to NCHW;
    {COUNT_KEY: transposes removed} when any, else {}."""
    regions = _Finder(graph).regions()
    removed, made = 0, {}
    for region in regions:
        if region.worth_it():
            removed += _Rewrite(graph, region, made).apply()
    return {COUNT_KEY: removed} if removed else {}



def _is_transpose(node: onnx.NodeProto, perm: tuple[int, ...]) -> bool:
    return node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and tuple(attribute(node, "perm", ()) or ()) == perm


def to_channel_first(value: np.ndarray) -> np.ndarray:
    """A constant that broadcast against a channel-last tensor, made to broadcast the same way against
    its NCHW form: padded to rank 4, transposed, and its leading ones dropped ([C] -> [C, 1, 1])."""
    value = np.asarray(value)
    if value.ndim == 0:
        return value
    padded = value.reshape((1,) * (4 - value.ndim) + value.shape).transpose(TO_CHANNEL_FIRST)
    shape = list(padded.shape)
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return np.ascontiguousarray(padded.reshape(shape))


class _Finder:
    """The channel-last tensors, the nodes that can act on them in NCHW, and their regions."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def regions(self) -> list[_Region]:
        graph = self.graph
        channel_last: set[str] = set()
        converted: list[onnx.NodeProto] = []
        parent: dict[str, str] = {}

        def find(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        def join(names: list[str]) -> None:
            roots = [find(n) for n in names]
            for root in roots[1:]:
                parent[root] = roots[0]

        starts = []
        for node in graph.nodes:
            if _is_transpose(node, TO_CHANNEL_LAST) and node.output[0] not in channel_last and node.input[0] not in graph.constants:
                channel_last.add(node.output[0])
                parent[node.output[0]] = node.output[0]
                starts.append(node)
            elif self._convertible(node, channel_last):
                tensors = [i for i in node.input if i and i not in graph.constants]
                channel_last.add(node.output[0])
                parent[node.output[0]] = node.output[0]
                join([node.output[0], *tensors])
                converted.append(node)
        by_root: dict[str, _Region] = {}

        def region_of(name: str) -> _Region:
            return by_root.setdefault(find(name), _Region())

        for name in channel_last:
            region_of(name).tensors.add(name)
        for node in starts:
            region_of(node.output[0]).starts.append(node)
        for node in converted:
            region_of(node.output[0]).nodes.append(node)
        inside = {id(n) for n in converted}
        for node in graph.nodes:
            for name in dict.fromkeys(i for i in node.input if i in channel_last):
                if _is_transpose(node, TO_CHANNEL_FIRST):
                    region_of(name).ends.append(node)
                elif id(node) not in inside:
                    region_of(name).kept.add(name)
        for name in channel_last & graph.outputs:
            region_of(name).kept.add(name)
        return list(by_root.values())

    def _convertible(self, node: onnx.NodeProto, channel_last: set[str]) -> bool:
        """Whether `node` has an NCHW form when its tensor inputs are channel-last."""
        graph = self.graph
        if node.domain not in ("", "ai.onnx", OPPLUGIN_DOMAIN) or [o for o in node.output if o] != node.output[:1]:
            return False
        if node.domain == OPPLUGIN_DOMAIN and node.op_type != "Gelu":
            return False
        tensors = [i for i in node.input if i and i not in graph.constants]
        if not tensors or any(t not in channel_last for t in tensors):
            return False
        if node.op_type in UNARY:
            others = [i for i in node.input[1:] if i]
            return len(tensors) == 1 and node.input[0] == tensors[0] and \
                all(np.size(graph.constants[i]) == 1 for i in others)
        if node.op_type in BROADCASTING:
            return all(np.ndim(graph.constants[i]) <= 4 for i in node.input if i in graph.constants)
        if node.op_type == "MatMul":
            weights = graph.constant(node.input[1])
            return node.input[0] in channel_last and weights is not None and np.ndim(weights) == 2 \
                and weights.dtype == np.float32
        if node.op_type == "LayerNormalization":
            return self._channel_layernorm(node)
        return False

    def _channel_layernorm(self, node: onnx.NodeProto) -> bool:
        """An ONNX LayerNormalization over the last axis only, scale and bias constants along it."""
        if node.domain not in ("", "ai.onnx") or attribute(node, "axis", -1) not in (-1, 3):
            return False
        params = [i for i in node.input[1:] if i]
        return all(i in self.graph.constants and np.ndim(self.graph.constants[i]) <= 1 for i in params)


class _Rewrite:
    """One region's nodes in their NCHW form."""

    def __init__(self, graph: Graph, region: _Region, made: dict[str, str]):
        self.graph, self.region, self.made = graph, region, made  # made: base -> constant made from it (all regions)
        self.nchw: dict[str, str] = {}  # channel-last tensor -> the name of its NCHW form

    def apply(self) -> int:
        graph, region = self.graph, self.region
        removed = 0
        for start in region.starts:
            self.nchw[start.output[0]] = start.input[0]
            if start.output[0] not in region.kept:
                graph.nodes.remove(start)
                removed += 1
        self._name_ends()
        for node in list(region.nodes):
            if node in graph.nodes:
                self._convert(node)
        for end in region.ends:
            removed += self._drop_end(end)
        for name in sorted(region.kept - {s.output[0] for s in region.starts}):
            self._keep_channel_last(name)
            removed -= 1
        return removed

    # --- names ---------------------------------------------------------------------------------

    def _name_ends(self) -> None:
        """Each channel-last tensor read by a Transpose(0,3,1,2) is written in NCHW under that
        Transpose's output name (a graph output's, where one is)."""
        for end in sorted(self.region.ends, key=lambda e: e.output[0] not in self.graph.outputs):
            self.nchw.setdefault(end.input[0], end.output[0])

    def name_of(self, tensor: str) -> str:
        """The NCHW form's name of a channel-last tensor: a new name, recorded as a view of the original."""
        if tensor not in self.nchw:
            name = self.graph.new_name(f"{tensor}_nchw")
            self.nchw[tensor] = name
            self.graph.views[name] = (tensor, TO_CHANNEL_FIRST)
        return self.nchw[tensor]

    def constant(self, base: str, value: np.ndarray) -> str:
        """A new constant, or the one made before from the same base (a weight several nodes share)."""
        made = self.made
        if base not in made:
            made[base] = self.graph.new_name(base)
            self.graph.constants[made[base]] = value
        return made[base]

    # --- nodes ---------------------------------------------------------------------------------

    def _convert(self, node: onnx.NodeProto) -> None:
        if node.op_type == "MatMul":
            self._matmul_as_conv(node)
        elif node.op_type == "LayerNormalization":
            self._channel_layernorm(node)
        else:
            self._elementwise(node)

    def _elementwise(self, node: onnx.NodeProto) -> None:
        graph = self.graph
        for index, name in enumerate(node.input):
            if not name:
                continue
            if name in graph.constants:
                if np.size(graph.constants[name]) > 1:
                    node.input[index] = self.constant(f"{name}_nchw", to_channel_first(graph.constants[name]))
            else:
                node.input[index] = self.name_of(name)
        node.output[0] = self.name_of(node.output[0])

    def _channel_layernorm(self, node: onnx.NodeProto) -> None:
        """LayerNormalization over the last axis -> the opplugin LayerNormalization over axis 1."""
        graph = self.graph
        channels_shaped = []
        for index, what, fill in ((1, "scale", 1.0), (2, "bias", 0.0)):
            name = node.input[index] if len(node.input) > index else ""
            value = graph.constants[name] if name else np.full(1, fill, np.float32)
            channels_shaped.append(self.constant(f"{name or node.output[0] + '_' + what}_nchw",
                                                 np.asarray(value).reshape(-1, 1, 1)))
        epsilon = float(attribute(node, "epsilon", 1e-5))
        replacement = helper.make_node(LAYERNORM_FUNCTION, [self.name_of(node.input[0]), *channels_shaped],
                                       [self.name_of(node.output[0])], name=node.name, domain=OPPLUGIN_DOMAIN,
                                       axes=[1], epsilon=epsilon)
        declare_layernorm(graph.proto)
        graph.nodes[graph.nodes.index(node)] = replacement

    def _matmul_as_conv(self, node: onnx.NodeProto) -> None:
        """MatMul(X, B[C, K]) -> Conv(X, B^T as [K, C, 1, 1]), with the Add of a constant [K]
        that is the MatMul's one reader as the Conv's bias."""
        graph = self.graph
        weights = np.asarray(graph.constants[node.input[1]])
        kernel = self.constant(f"{node.input[1]}_conv", np.ascontiguousarray(weights.T).reshape(*weights.T.shape, 1, 1))
        inputs, output = [self.name_of(node.input[0]), kernel], node.output[0]
        bias_add = self._bias_add(node)
        if bias_add is not None:
            bias = next(i for i in bias_add.input if i != output)
            inputs.append(self.constant(f"{bias}_conv", np.asarray(graph.constants[bias], np.float32).reshape(-1)))
            graph.nodes.remove(bias_add)
            output = bias_add.output[0]
        conv = helper.make_node("Conv", inputs, [self.name_of(output)], name=node.name, kernel_shape=[1, 1])
        graph.nodes[graph.nodes.index(node)] = conv

    def _bias_add(self, matmul: onnx.NodeProto) -> onnx.NodeProto | None:
        """The Add of a float32 constant [K] (or [1, .., K]) that alone reads the MatMul's output."""
        graph, output = self.graph, matmul.output[0]
        add = graph.only_reader(output)
        if add is None or output in self.region.kept:
            return None
        if add.op_type != "Add" or add not in self.region.nodes or len(add.input) != 2 or add.input[0] == add.input[1]:
            return None
        bias = graph.constant(next(i for i in add.input if i != output))
        outputs = np.asarray(graph.constants[matmul.input[1]]).shape[1]
        if bias is None or bias.dtype != np.float32 or bias.ndim > 4 or bias.size != outputs or bias.shape[-1] != outputs:
            return None
        return add

    def _drop_end(self, end: onnx.NodeProto) -> int:
        """A Transpose(0,3,1,2) goes: its readers read the NCHW form (a graph output's name stays, copied by an Identity)."""
        graph = self.graph
        source = self.nchw.get(end.input[0]) or self.name_of(end.input[0])
        result = end.output[0]
        if source == result:
            graph.nodes.remove(end)
            return 1
        if result in graph.outputs:
            graph.nodes[graph.nodes.index(end)] = helper.make_node("Identity", [source], [result], name=end.name)
            return 1
        graph.nodes.remove(end)
        graph.rename_reads(result, source)
        return 1

    def _keep_channel_last(self, tensor: str) -> None:
        """A Transpose(0,2,3,1) writes the channel-last tensor that something outside the region reads."""
        graph = self.graph
        source = self.name_of(tensor)
        producer = next(n for n in graph.nodes if source in n.output)
        transpose = helper.make_node("Transpose", [source], [tensor], name=graph.new_name(f"{tensor}_channel_last"),
                                     perm=list(TO_CHANNEL_LAST))
        graph.nodes.insert(graph.nodes.index(producer) + 1, transpose)
