"""Identity, inference Dropout whose mask nobody reads, and layout nodes that change nothing (a Pad of
zeros, a Transpose in order, a Concat of one input) dropped: their readers read the source. Exporters
write the no-op layout nodes where the model's code pads or permutes by amounts known only once the
shapes are (Swin pads each feature map to a multiple of its window, which the ImageNet sizes already are).

Where the identity writes a graph output, the node before it writes that output's name instead,
so the graph's outputs keep their names; where that node cannot (the source is a graph input or
output itself), the identity stays.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..ir import DEFAULT_DOMAINS, Graph


def drop_identities(graph: Graph) -> dict[str, int]:
    """Drop every Identity, inference Dropout and no-op layout node that can go; op type -> how many."""
    dropped: dict[str, int] = {}
    for node in list(graph.nodes):
        if node.domain not in DEFAULT_DOMAINS or not _is_identity(graph, node):
            continue
        source, result = node.input[0], node.output[0]
        if result not in graph.outputs:
            graph.nodes.remove(node)
            graph.rename_reads(result, source)
        elif _can_take_name(graph, source):
            # the graph output keeps its name: the producer writes it directly
            producer = graph.writer(source)
            graph.nodes.remove(node)
            producer.output[list(producer.output).index(source)] = result
            graph.rename_reads(source, result)
        else:
            continue
        dropped[node.op_type] = dropped.get(node.op_type, 0) + 1
    return dropped


def _is_identity(graph: Graph, node: onnx.NodeProto) -> bool:
    """Identity, a Dropout in inference mode whose mask nobody reads, or a layout node that changes nothing."""
    if node.op_type == "Identity":
        return len(node.input) == 1 and len(node.output) == 1
    if node.op_type in _NO_OP_TESTS:
        return bool(node.input) and bool(node.input[0]) and len(node.output) == 1 and _NO_OP_TESTS[node.op_type](graph, node)
    if node.op_type != "Dropout" or not node.input or not node.input[0]:
        return False
    if any(a.name == "is_test" and a.i == 0 for a in node.attribute):  # opset < 7: training
        return False
    if len(node.input) > 2 and node.input[2]:  # training_mode (opset 12+): only a constant false
        mode = graph.constant(node.input[2])
        if mode is None or bool(np.asarray(mode).any()):
            return False
    mask = node.output[1] if len(node.output) > 1 else ""
    return not (mask and graph.used(mask))


def _can_take_name(graph: Graph, source: str) -> bool:
    """Whether the node writing `source` can write a graph output's name instead."""
    return graph.writer(source) is not None and source not in graph.outputs and source not in graph.inputs


def _zero_pad(graph: Graph, node: onnx.NodeProto) -> bool:
    """Pads of zero on every side (the pads input, or before opset 11 the attribute), whatever the mode."""
    attribute = next((a for a in node.attribute if a.name == "pads"), None)
    pads = np.asarray(attribute.ints) if attribute is not None else (
        graph.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None)
    return pads is not None and not np.asarray(pads).any()


def _transpose_in_order(graph: Graph, node: onnx.NodeProto) -> bool:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return perm is not None and perm == list(range(len(perm)))  # no perm reverses the axes


def _single_concat(graph: Graph, node: onnx.NodeProto) -> bool:
    return len(node.input) == 1


_NO_OP_TESTS = {"Pad": _zero_pad, "Transpose": _transpose_in_order, "Concat": _single_concat}
