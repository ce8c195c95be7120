"""Calls timed the way the runner launches them by default: replayed from a CUDA graph.

A runner captures its runs of plugin steps into CUDA graphs, so a kernel's cost there is
its time on the device, without the Python that launches it eagerly. `bench` times a
candidate the same way: `calls` back-to-back calls captured into one graph, whose replay
the CUDA events time. Two capturers, one per framework that enqueues the work:

- `cupy_replay`: opplugin's kernels. The capture runs on a stream of its own, drawing on a
  memory pool of its own (a scratch buffer the calls free and reuse stays the graph's); the
  replay runs on the current stream, where the timing events are recorded.
- `torch_replay`: the cuDNN peers, through `torch.cuda.CUDAGraph` after a warm-up on a side
  stream (cuDNN's algorithm search and the allocator's first blocks stay out of the graph).

A call that cannot be captured (one that synchronises, say) raises here; the caller then
times it eagerly and says so.
"""
from __future__ import annotations

from typing import Any, Callable

Replay = Callable[[], Any]
TORCH_WARMUP_CALLS = 3


def cupy_replay(call: Callable[[], Any], calls: int) -> Replay:
    """`calls` calls of `call` (CuPy work on the current stream) captured into one graph;
    returns the function that replays it on the current stream."""
    import cupy

    from ..runtime.graphs import abandon_capture

    stream, pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            for _ in range(calls):
                call()
        except BaseException:
            abandon_capture(stream)
            raise
        graph = stream.end_capture()

    def replay() -> None:
        graph.launch(cupy.cuda.get_current_stream())
        _ = pool  # the graph's buffers live as long as the replay does

    return replay


def torch_replay(torch: Any, call: Callable[[], Any], calls: int) -> Replay:
    """`calls` calls of `call` (PyTorch work) captured into one torch CUDA graph; returns the
    function that replays it on PyTorch's current stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(TORCH_WARMUP_CALLS):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    return graph.replay
