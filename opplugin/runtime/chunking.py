"""How a batch is cut into chunks: which tensors scale with the batch, how many
bytes one image keeps alive, how many images fit in a budget, and the row ranges.

A model can be chunked when every tensor that crosses a step boundary (and every
graph output) has the batch as its first axis and the same per-image shape at any
batch, so that running rows [a, b) alone gives rows [a, b) of the whole result.
Shape inference at two batch sizes tells which tensors do; a Reshape that bakes
in the batch, say, makes a model unchunkable, and it then runs in one piece.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

import numpy as np

from ..errors import InputError
from ..graph.model import Model
from ..registry import TensorInfo
from ..core.row_ranges import split_rows  # chunking.split_rows: the runner cuts its chunks as check cuts its slices

# Chunks of about this much input keep several in flight, so that one chunk's
# copy to the device overlaps the previous chunk's compute. Each chunk costs the
# host about half a millisecond of Python to enqueue; at 64 MiB (2,268 lenet86
# images, over a millisecond of copying at 55 GB/s) that stays off the critical path.
PIPELINE_CHUNK_INPUT_BYTES = 64 << 20
# Below this much input in all, a single chunk is faster than a pipeline.
MIN_PIPELINED_INPUT_BYTES = 16 << 20
# A pipelined batch is cut into at least this many chunks.
MIN_PIPELINE_CHUNKS = 4
# Each chunk runs every step again, and each step costs the host tens of microseconds of
# Python and launches (about this much per node of the graph, fused or not). A pipeline
# pays that MIN_PIPELINE_CHUNKS times over, so it is used only where the input's copy to
# the device (at about COPY_BYTES_PER_MS from pinned memory) takes longer than that: lenet86
# and ece408 at 10,000 images, not ResNet-18 (49 nodes) at batch 32.
HOST_MS_PER_NODE = 0.02
COPY_BYTES_PER_MS = 50e6
# A pipeline's last chunk computes after the last copy, with nothing left to hide it behind. So the
# tail of a pipelined batch (its last full chunk and the rest) goes in halving chunks, down to
# 1/TAIL_DIVISOR of a full one: each one's compute hides behind the next one's copy wherever an
# image computes in at most half the time it takes to copy (lenet86 on an H200: 0.28 against 0.55 µs),
# and the last, small chunk's compute is all that is left after the copies. (lenet86 at 10,000 on an
# H200, host to host: 5.82 and 6.07 ms with 4, 5.98 and 6.08 with 8, 6.02 and 6.03 without: a lane
# starts its next chunk only once its last one is done, so many small chunks wait on the lanes.)
TAIL_DIVISOR = 4
# Share of the free device memory the chunks of all streams may take together;
# the rest is headroom for the allocator's rounding and onnxruntime's arena.
DEVICE_MEMORY_SHARE = 0.5
# Host memory one chunk may keep alive on the CPU device: small enough that a chunk's
# tensors stay near the caches (lenet86: 8 chunks of 10,000 images run 1.7x faster than one).
HOST_CHUNK_BYTES = 256 << 20


@dataclass(frozen=True)
class BatchLayout:
    """Per-image shapes of the tensors whose first axis is the batch."""

    batched_inputs: frozenset[str]
    sample_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    itemsizes: dict[str, int] = field(default_factory=dict)
    # None when the model can be chunked, else why not
    unchunkable: str | None = None

    @property
    def chunkable(self) -> bool:
        return self.unchunkable is None

    def is_batched(self, name: str) -> bool:
        return name in self.sample_shapes

    def shape_at(self, name: str, batch: int) -> tuple[int, ...]:
        return (batch, *self.sample_shapes[name])

    def image_bytes(self, name: str) -> int:
        """Bytes of one image's slice of a tensor; 0 for tensors that do not scale with the batch."""
        if name not in self.sample_shapes:
            return 0
        return int(np.prod(self.sample_shapes[name], dtype=np.int64)) * self.itemsizes[name]

    def input_image_bytes(self) -> int:
        return sum(self.image_bytes(name) for name in self.batched_inputs)


def probe_layout(model: Model) -> BatchLayout:
    """The layout from shape inference at batch 1 and 2 (a fixed-batch model gets an unchunkable layout)."""
    try:
        one, two = model.infer(1), model.infer(2)
    except InputError:  # a fixed first axis: the model runs only at its own batch
        first = model.inputs[0]
        fixed = first.type.tensor_type.shape.dim[0].dim_value
        return BatchLayout(frozenset(), unchunkable=f"input {first.name!r} has a fixed batch of {fixed}")
    shapes, sizes = {}, {}
    for name, a in one.items():
        b = two.get(name)
        if name in model.initializers or b is None or not a.shape or -1 in a.shape or -1 in b.shape:
            continue
        if a.shape[0] == 1 and b.shape[0] == 2 and a.shape[1:] == b.shape[1:]:
            shapes[name] = tuple(a.shape[1:])
            sizes[name] = np.dtype(a.dtype).itemsize
    batched = frozenset(i.name for i in model.inputs if i.name in shapes and not i.type.tensor_type.shape.dim[0].HasField("dim_value"))
    return BatchLayout(batched, shapes, sizes)


def tensors_at(model: Model, layout: BatchLayout, batch: int) -> dict[str, TensorInfo] | None:
    """Every tensor at `batch`, from the probes at batch 1 and 2 (Model.infer keeps them): a
    tensor that scales with the batch gets `batch` rows, one of the same shape at both keeps
    it. None when some tensor does neither: then shape inference must run at `batch`."""
    if not layout.chunkable:
        return None
    one, two = model.infer(1), model.infer(2)
    if one.keys() != two.keys():
        return None
    tensors = {}
    for name, info in one.items():
        if layout.is_batched(name):
            tensors[name] = replace(info, shape=layout.shape_at(name, batch))
        elif info.shape == two[name].shape:
            tensors[name] = info
        else:
            return None
    return tensors


def check_steps(layout: BatchLayout, boundary_tensors: Iterable[str], passed_whole: Iterable[str]) -> BatchLayout:
    """The layout, or a copy marked unchunkable when a tensor crossing a step boundary does
    not scale with the batch. `passed_whole` are weights and inputs with a fixed first axis:
    every chunk gets all of them."""
    if not layout.chunkable:
        return layout
    whole = set(passed_whole)
    for name in boundary_tensors:
        if name and name not in whole and not layout.is_batched(name):
            return replace(layout, unchunkable=f"tensor {name!r} does not have the batch as its first axis")
    return layout


def peak_image_bytes(model: Model, layout: BatchLayout) -> int:
    """The most bytes per image alive at once when the graph runs node by node:
    an upper bound on what one chunk keeps on the device, whatever the partition."""
    nodes = model.nodes
    last_use: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            last_use[name] = index
    outputs = set(model.outputs)
    live = set(layout.batched_inputs)
    peak = sum(layout.image_bytes(n) for n in live)
    for index, node in enumerate(nodes):
        live.update(o for o in node.output if o)
        peak = max(peak, sum(layout.image_bytes(n) for n in live))
        live = {n for n in live if last_use.get(n, -1) > index or n in outputs}
    return max(peak, 1)


def pipeline_chunk(batch: int, input_image_bytes: int, nodes: int = 0) -> int:
    """Images per chunk for overlap: the whole batch when its input is small, or quicker to
    copy than a pipeline's extra host work for a graph of `nodes` nodes; else chunks of about
    PIPELINE_CHUNK_INPUT_BYTES, and at least MIN_PIPELINE_CHUNKS of them."""
    total = batch * input_image_bytes
    if total <= MIN_PIPELINED_INPUT_BYTES or input_image_bytes <= 0:
        return batch
    if total / COPY_BYTES_PER_MS < MIN_PIPELINE_CHUNKS * nodes * HOST_MS_PER_NODE:
        return batch
    by_bytes = max(1, PIPELINE_CHUNK_INPUT_BYTES // input_image_bytes)
    by_count = math.ceil(batch / MIN_PIPELINE_CHUNKS)
    return max(1, min(by_bytes, by_count))


def run_rows(batch: int, chunk: int, copied: bool = True) -> list[slice]:
    """The row ranges a run of `batch` images takes in chunks of at most `chunk`: equal chunks, and
    where the chunks' inputs are `copied` to a device in a pipeline (MIN_PIPELINE_CHUNKS chunks or
    more), a tail of halving ones (TAIL_DIVISOR)."""
    rows = split_rows(batch, chunk)
    least = chunk // TAIL_DIVISOR
    if not copied or len(rows) < MIN_PIPELINE_CHUNKS or least < 1:
        return rows
    start = rows[-2].start
    rows = rows[:-2]
    while batch - start > least:
        piece = max(least, -(-(batch - start) // 2))  # at most a chunk: the tail starts under two
        rows.append(slice(start, start + piece))
        start += piece
    if start < batch:
        rows.append(slice(start, batch))
    return rows


def memory_chunk(budget_bytes: int, image_bytes: int, workspace: Callable[[int], int] = lambda n: 0) -> int:
    """The most images whose live tensors plus kernel workspace fit in `budget_bytes` (at least 1)."""
    images = max(1, budget_bytes // max(1, image_bytes))
    while images > 1:
        needed = images * image_bytes + workspace(images)
        if needed <= budget_bytes:
            break
        images = min(images - 1, max(1, images * budget_bytes // needed))
    return images

