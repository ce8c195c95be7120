"""A chain of layout nodes that only moves whole rows (a row: the last axis) becomes one Gather of rows
by constant indices: Swin's window partition and reverse and its cyclic shift (Roll, exported as Slice +
Concat on two axes), the padding to whole windows and the crop back, or any such mix of Reshape, Transpose,
Slice, Concat, Split, Gather, Pad (with zeros, or edge and reflect copies), Squeeze and Unsqueeze. Each copying node of the chain was a pass over memory; the Gather is one, and a product that
reads it can take its indices in (ops/gemm/row_map.py), so that it costs none.

What a chain does is not derived from its nodes' attributes but measured: onnxruntime runs it on a
tensor whose every element holds its own position (from 1: a padded zero is 0), one image's worth and two
images' worth. The chain moves whole rows when each output row holds one input row's positions in order,
or zeros; it moves them the
same way in every image when the second image's rows come from the second input image at the same
places. Those rows are then the Gather's indices, and the rewrite holds at any batch:

    Reshape(X, [-1, rows per image, C]) > Gather(axis 1, indices) > Reshape(to Y's shape, -1 for the batch)

with a Pad of one zero row after each image's rows before the Gather where the chain makes rows of zeros.

The chain's end Y keeps its name and values; its inner tensors are gone. Where X is what a product by a
constant matrix (and its bias Add) writes for the chain alone, the Gather moves before the product, which
works on each row alone: it then gathers the rows of its own A, and writes Y (Swin's window reverse and
shift back after the attention's projection, whose residual Add then follows the product directly).

A chain is rewritten where it copies more than once, or where a flat product by a constant matrix reads
its end or writes its source: that product then gathers as it loads A (ops/gemm/row_prologue.py).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..evaluate import evaluate
from ..ir import DEFAULT_DOMAINS, Graph
from ..static_shapes import PROBE_BATCHES, probe_shapes

MOVERS = frozenset({"Reshape", "Transpose", "Slice", "Concat", "Split", "Gather", "Pad", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
# the nodes of a chain that make a pass over memory: the others are views, a Slice or Split one the next
# step reads through (a Concat reads its slices in place), so a lone roll along one axis is one copy already
COPIES = frozenset({"Transpose", "Concat", "Gather", "Pad"})
MIN_ROW = 8  # floats a row: shorter rows gather poorly, and the strided views serve them (a head's 32 is fine)
# elements of one image of a chain's source at most, for its measurement: two images' positions in int32 take
# 8 bytes each (a 1024 x 1024 Swin's first stage is 6.3M elements an image)
MAX_MEASURED = 2 ** 25


def gather_rows(graph: Graph) -> dict[str, int]:
    """Rewrite each such chain (see the module); "row-moving layout nodes" -> how many nodes of the graph as
    loaded it replaced. A Gather moved before a product can meet the Gather that product's A came from: a
    chain of two, measured and written as one in another round."""
    if graph.scoped:  # a subgraph could read an inner tensor by name
        return {}
    made: set[int] = set()  # the nodes the rewrites wrote (id), so that one of them is not rewritten as itself
    replaced, moved = 0, True
    while moved:
        shapes, moved = None, False
        for end in [n for n in graph.nodes if _is_mover(n)]:
            if not any(n is end for n in graph.nodes):
                continue
            chain = _chain_ending_at(graph, end)
            if chain is None or _written_already(chain, made) or not _worth_it(graph, chain, end):
                continue
            shapes = shapes or probe_shapes(graph)
            rewrite = _measured_rewrite(graph, chain, end, shapes)
            if rewrite is None:
                continue
            source, rows, indices, out_shape = rewrite
            # a zero row made before a product would come out as its bias: only gathers of input rows move before one
            product = _product_writing(graph, source, chain) if (indices >= 0).all() else None
            if product is not None:
                new = _move_before_product(graph, chain, end, product, rows, indices, out_shape)
                moved = True
            elif _in_order(indices, rows):  # every row where it was (a roll and its reverse): a reshape
                new = _reshape_only(graph, chain, end, source, out_shape)
            else:
                new = _replace(graph, chain, end, source, rows, indices, out_shape)
            replaced += sum(id(n) not in made for n in chain)
            made.update(id(n) for n in new)
    return {"row-moving layout nodes": replaced} if replaced else {}


def _in_order(indices: np.ndarray, rows: int) -> bool:
    return np.array_equal(indices, np.arange(rows))


def _written_already(chain: list[onnx.NodeProto], made: set[int]) -> bool:
    """Whether the chain is one Gather a rewrite wrote (with its Reshapes and Pad): nothing to gain."""
    return all(id(n) in made for n in chain) and sum(n.op_type == "Gather" for n in chain) == 1


def _is_mover(node: onnx.NodeProto) -> bool:
    return node.op_type in MOVERS and node.domain in DEFAULT_DOMAINS


def _pads_rows_of_zeros_or_copies(graph: Graph, node: onnx.NodeProto) -> bool:
    """A Pad whose new rows are zeros (constant mode, value 0) or copies of rows (edge, reflect): rows
    a gather can make. A constant pad of another value makes rows no input row nor zero row is."""
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
    if mode != "constant":
        return True
    value = next((a.f for a in node.attribute if a.name == "value"), 0.0)  # opset < 11
    if len(node.input) > 2 and node.input[2]:
        constant = graph.constant(node.input[2])
        value = None if constant is None else (0.0 if constant.size == 0 else float(constant.reshape(-1)[0]))
    return value == 0.0


def _data_inputs(graph: Graph, node: onnx.NodeProto) -> list[str]:
    """What a layout node moves (its non-constant inputs); its shape, slice or index inputs are constants."""
    return [name for name in node.input if name and graph.constant(name) is None]


def _chain_ending_at(graph: Graph, end: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The layout nodes (graph order) between one source tensor and `end`'s single output, every inner
    tensor read only inside the chain; None where `end` does not end such a chain (its output feeds
    another layout node, or the nodes before it read more than one computed tensor)."""
    if len([o for o in end.output if o]) != 1 or any(map(_is_mover, graph.readers(end.output[0]))):
        return None
    if end.op_type == "Pad" and not _pads_rows_of_zeros_or_copies(graph, end):
        return None
    chain = [end]
    frontier = list(_data_inputs(graph, end))
    while frontier:
        name = frontier.pop()
        writer = graph.writer(name)
        if writer is None or not _is_mover(writer) or writer in chain or name in graph.outputs:
            continue
        if writer.op_type == "Pad" and not _pads_rows_of_zeros_or_copies(graph, writer):
            continue
        inside = {id(n) for n in chain}
        outputs = [o for o in writer.output if o]
        if any(id(r) not in inside for o in outputs for r in graph.readers(o)) or any(o in graph.outputs for o in outputs):
            continue  # the writer's output is read outside: it stays, and its output is a source
        chain.append(writer)
        frontier += _data_inputs(graph, writer)
    chain.sort(key=graph.nodes.index)
    produced = {o for n in chain for o in n.output if o}
    sources = {name for n in chain for name in _data_inputs(graph, n) if name not in produced}
    return chain if len(sources) == 1 else None


def _copies(chain: list[onnx.NodeProto]) -> int:
    return sum(n.op_type in COPIES for n in chain)


def _worth_it(graph: Graph, chain: list[onnx.NodeProto], end: onnx.NodeProto) -> bool:
    """More than one copy, or one that a flat product by a constant matrix can take in as it loads A: the
    product reading the chain's end, or writing its source (the Gather then moves before it)."""
    copies = _copies(chain)
    if copies != 1:
        return copies > 1
    reader = graph.only_reader(end.output[0], "MatMul")
    if reader is not None and reader.input[0] == end.output[0] and _constant_matrix(graph, reader.input[1]):
        return True
    return _product_writing(graph, _source(graph, chain), chain) is not None


def _constant_matrix(graph: Graph, name: str) -> bool:
    value = graph.constant(name)
    return value is not None and value.ndim == 2


def _source(graph: Graph, chain: list[onnx.NodeProto]) -> str:
    produced = {o for n in chain for o in n.output if o}
    return next(name for n in chain for name in _data_inputs(graph, n) if name not in produced)


def _rows_per_image(shapes: tuple[dict, dict], name: str) -> tuple[tuple[int, ...], int, int] | None:
    """(the shape at the first probe batch, rows per image, row length) of a batch-major tensor: one whose
    shape follows the batch in its first axis alone (or not at all); None otherwise."""
    small, large = (probe.get(name) for probe in shapes)
    if small is None or large is None or len(small) < 2 or len(small) != len(large) or small[1:] != large[1:]:
        return None
    row = small[-1]
    if row < MIN_ROW:
        return None
    if small == large:  # no batch: the whole tensor is one "image"
        return small, int(np.prod(small[:-1])), row
    images = PROBE_BATCHES[0]
    rows = int(np.prod(small[:-1]))
    if rows % images or int(np.prod(large[:-1])) != rows // images * PROBE_BATCHES[1]:
        return None
    return small, rows // images, row


def _measured_rewrite(graph: Graph, chain: list[onnx.NodeProto], end: onnx.NodeProto, shapes: tuple[dict, dict]):
    """(source, rows per source image, the Gather's indices, Y's shape with -1 for the batch) where the
    chain moves whole rows alike in every image (see the module); None otherwise."""
    source, result = _source(graph, chain), end.output[0]
    x, y = _rows_per_image(shapes, source), _rows_per_image(shapes, result)
    if x is None or y is None or x[2] != y[2]:
        return None
    (x_shape, x_rows, row), (y_shape, y_rows, _) = x, y
    batched = x_shape != shapes[1].get(source)
    maps = []
    if x_rows * row > MAX_MEASURED:
        return None
    measurable = [_on_positions(node) for node in chain]
    for images in ((1, 2) if batched else (1,)):
        shape = (x_shape[0] // PROBE_BATCHES[0] * images, *x_shape[1:]) if batched else x_shape
        positions = np.arange(1, int(np.prod(shape)) + 1, dtype=np.int32).reshape(shape)  # 0: a Pad's zero
        got = evaluate(graph, measurable, {source: positions, ZERO: np.zeros((), np.int32)}).get(result)
        if got is None or got.size != images * y_rows * row:
            return None
        taken = got.reshape(-1, row)
        first = taken[:, 0] - 1
        zero = ~taken.any(axis=1)
        whole = np.array_equal(taken[~zero], first[~zero, None] + 1 + np.arange(row)) and not (first[~zero] % row).any()
        if not whole:
            return None  # not whole rows in order
        maps.append(np.where(zero, -1, first // row))
    if batched and not np.array_equal(maps[1], np.concatenate([maps[0], np.where(maps[0] < 0, -1, maps[0] + x_rows)])):
        return None  # images mixed, or moved differently
    indices = maps[0]
    out_shape = (-1, *y_shape[1:]) if batched else y_shape
    return source, x_rows, indices, out_shape


def _replace(graph: Graph, chain: list[onnx.NodeProto], end: onnx.NodeProto, source: str, rows: int, indices: np.ndarray,
             out_shape: tuple[int, ...]) -> list[onnx.NodeProto]:
    """The chain as one Gather (and its Reshapes, and a Pad where it makes zero rows); returns the nodes it wrote."""
    made = _gather_nodes(graph, source, end.output[0], end.name, rows, out_shape[-1], indices, out_shape)
    at = graph.nodes.index(chain[-1])
    graph.nodes[at:at + 1] = made
    for node in chain[:-1]:
        graph.nodes.remove(node)
    return made


ZERO = "row_gather_zero"  # an int32 zero: a Pad's value as the measurement's positions are typed


def _on_positions(node: onnx.NodeProto) -> onnx.NodeProto:
    """`node` as it runs on int32 positions: a Pad's value (a float constant, 0 as checked) becomes an int32 zero."""
    if node.op_type != "Pad" or len(node.input) < 3 or not node.input[2]:
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[2] = ZERO
    return copy


def _reshape_only(graph: Graph, chain: list[onnx.NodeProto], end: onnx.NodeProto, source: str,
                  out_shape: tuple[int, ...]) -> list[onnx.NodeProto]:
    """A chain that leaves every row where it was, as the one Reshape it amounts to; returns that node."""
    made = [_reshape_node(graph, source, end.output[0], end.name, out_shape)]
    at = graph.nodes.index(chain[-1])
    graph.nodes[at:at + 1] = made
    for node in chain[:-1]:
        graph.nodes.remove(node)
    return made


def _reshape_node(graph: Graph, source: str, result: str, name: str, shape: tuple[int, ...]) -> onnx.NodeProto:
    constant = graph.new_name(f"{result}_shape")
    graph.constants[constant] = np.array(shape, dtype=np.int64)
    return helper.make_node("Reshape", [source, constant], [result], name=name)


def _gather_nodes(graph: Graph, source: str, result: str, name: str, rows: int, row: int, indices: np.ndarray,
                  out_shape: tuple[int, ...]) -> list[onnx.NodeProto]:
    """Reshape(source, [-1, rows, row]) [> Pad(one zero row)] > Gather(axis 1, indices, -1 the zero row) > Reshape(out_shape),
    writing `result`."""
    by_image, taken = graph.new_name(f"{result}_by_image"), graph.new_name(f"{result}_gathered")
    names = [graph.new_name(f"{result}_{what}") for what in ("image_shape", "row_indices", "shape")]
    graph.constants[names[0]] = np.array([-1, rows, row], dtype=np.int64)
    graph.constants[names[1]] = np.where(indices < 0, rows, indices).astype(np.int64)  # a zero row: the one padded on
    graph.constants[names[2]] = np.array(out_shape, dtype=np.int64)
    made = [helper.make_node("Reshape", [source, names[0]], [by_image], name=f"{name}_by_image")]
    if (indices < 0).any():  # rows of zeros: one zero row after each image's rows, which the Gather takes
        padded = graph.new_name(f"{result}_with_zero_row")
        pads = [0, 0, 0, 0, 1, 0]
        if graph.opset >= 11:
            pad_name = graph.new_name(f"{result}_pads")
            graph.constants[pad_name] = np.array(pads, dtype=np.int64)
            made.append(helper.make_node("Pad", [by_image, pad_name], [padded], name=f"{name}_zero_row", mode="constant"))
        else:
            made.append(helper.make_node("Pad", [by_image], [padded], name=f"{name}_zero_row", mode="constant", pads=pads))
        by_image = padded
    return [*made, helper.make_node("Gather", [by_image, names[1]], [taken], name=f"{name}_rows", axis=1),
            helper.make_node("Reshape", [taken, names[2]], [result], name=name)]


def _product_writing(graph: Graph, source: str, chain: list[onnx.NodeProto]) -> tuple[onnx.NodeProto, onnx.NodeProto | None] | None:
    """(the MatMul by a constant matrix, its bias Add or None) that writes `source` for the chain alone; None otherwise."""
    if source in graph.outputs or any(r not in chain for r in graph.readers(source)):
        return None
    writer = graph.writer(source)
    bias_add = None
    if writer is not None and writer.op_type == "Add" and writer.domain in DEFAULT_DOMAINS and len(writer.input) == 2:
        bias_add = writer
        computed = [name for name in writer.input if graph.constant(name) is None]
        writer = graph.writer(computed[0]) if len(computed) == 1 else None
        if writer is None or graph.only_reader(writer.output[0], "Add") is not bias_add:
            return None
    if writer is None or writer.op_type != "MatMul" or writer.domain not in DEFAULT_DOMAINS or not _constant_matrix(graph, writer.input[1]):
        return None
    if bias_add is not None:
        bias = graph.constant(next(name for name in bias_add.input if name != writer.output[0]))
        columns = graph.constant(writer.input[1]).shape[1]
        if bias is None or bias.size != bias.shape[-1] or bias.shape[-1] not in (1, columns):
            return None  # not the same for every row: the rows could not move before it
    return writer, bias_add


def _move_before_product(graph: Graph, chain: list[onnx.NodeProto], end: onnx.NodeProto, product: tuple, rows: int,
                         indices: np.ndarray, out_shape: tuple[int, ...]) -> list[onnx.NodeProto]:
    """The chain's Gather on the product's A instead of its output (a Reshape, where no row moves): the product
    (and its bias Add) then writes the chain's end, rows gathered. Returns the nodes it wrote."""
    matmul, bias_add = product
    result, depth = end.output[0], int(graph.constant(matmul.input[1]).shape[0])
    gathered = graph.new_name(f"{result}_rows_in")
    a_shape = (*out_shape[:-1], depth)
    if _in_order(indices, rows):  # no row moves: the product reads A in the end's shape, and writes the end
        made = [_reshape_node(graph, matmul.input[0], gathered, f"{end.name}_rows", a_shape)]
    else:
        made = _gather_nodes(graph, matmul.input[0], gathered, f"{end.name}_rows", rows, depth, indices, a_shape)
    last = bias_add or matmul
    if bias_add is not None:
        product_out = graph.new_name(f"{result}_product")
        bias_add.input[list(bias_add.input).index(matmul.output[0])] = product_out
        matmul.output[0] = product_out
    last.output[0] = result
    matmul.input[0] = gathered
    at = graph.nodes.index(matmul)
    graph.nodes[at:at] = made
    for node in chain:
        graph.nodes.remove(node)
    return made
