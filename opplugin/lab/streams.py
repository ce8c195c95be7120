"""The bench's streams row: one Conv over a whole batch from pinned host input to
pinned host output, done serially (copy in, kernel, copy out on one stream) and
split into chunks spread over several streams, so that one chunk's copies overlap
another's kernel (the copy engines for each direction and the SMs work at once).

With pinned memory every copy is an asynchronous DMA; the figure is the device
timeline from the first copy to the last, measured with CUDA events on a stream
that forks to the workers and joins them again.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..gpu import cuda
from ..ops.conv import families
from ..ops.conv.epilogue import NONE
from ..ops.conv.families import Config
from .trial import EXACT_TOLERANCE, Problem, median_ms

STREAM_COUNTS = (2, 3, 4)
CHUNKS_PER_STREAM = 4  # more chunks than streams: the pipeline fills and drains in short pieces


def chunk_bounds(batch: int, chunks: int) -> list[tuple[int, int]]:
    """[start, stop) of `chunks` nearly equal pieces of the batch (fewer when the batch is smaller)."""
    chunks = max(1, min(chunks, batch))
    edges = [batch * i // chunks for i in range(chunks + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def host_to_host(case, batch: int, config: Config, warmup: int, repeat: int) -> dict[str, Any]:
    import cupy

    runtime = cupy.cuda.runtime
    spec = dataclasses.replace(case.spec, batch=batch)
    kernel = families.build_kernel(spec, config, (case.w, case.b))
    x_host = cuda.pinned_empty(spec.input_shape())
    x_host[...] = np.random.default_rng().standard_normal(x_host.shape, dtype=np.float32)
    y_host = cuda.pinned_empty(kernel.output_shape(batch))
    x_dev = cupy.empty(x_host.shape, dtype=cupy.float32)
    y_dev = cupy.empty(y_host.shape, dtype=cupy.float32)
    in_image, out_image = x_host[0].nbytes, y_host[0].nbytes
    weights = [cupy.asarray(case.w)] + ([cupy.asarray(case.b)] if case.b is not None else [])  # for variants that read them

    def piece(a: int, b: int, stream) -> None:
        runtime.memcpyAsync(x_dev[a:b].data.ptr, x_host[a:b].ctypes.data, (b - a) * in_image, runtime.memcpyHostToDevice, stream.ptr)
        kernel([x_dev[a:b], *weights], stream, out=y_dev[a:b])
        runtime.memcpyAsync(y_host[a:b].ctypes.data, y_dev[a:b].data.ptr, (b - a) * out_image, runtime.memcpyDeviceToHost, stream.ptr)

    serial_stream = cuda.new_stream()

    def serial() -> None:
        piece(0, batch, serial_stream)

    result: dict[str, Any] = {
        "step": case.label(False),
        "batch": batch,
        "variant": config.name(),
        "status": "ok",
        "reason": None,
        "input_bytes": int(x_host.nbytes),
        "output_bytes": int(y_host.nbytes),
        "serial_ms": None,
        "chunked": [],
        "best_streams": None,
        "best_ms": None,
        "speedup": None,
    }
    y_host.fill(np.nan)
    serial()
    serial_stream.synchronize()
    rel_error, unwritten = Problem(spec, NONE, x_dev, case.w, case.b).error(y_host)
    if unwritten or not rel_error <= EXACT_TOLERANCE:
        result.update(status="incorrect", reason=f"serial result: relative error {rel_error:.3g}, {unwritten} unwritten")
        return result
    expected = y_host.copy()
    result["serial_ms"], _ = median_ms(serial, warmup, repeat, stream=serial_stream)

    origin = cuda.new_stream()
    for count in STREAM_COUNTS:
        workers = [cuda.new_stream() for _ in range(count)]
        bounds = chunk_bounds(batch, count * CHUNKS_PER_STREAM)

        def split(workers=workers, bounds=bounds) -> None:
            fork = cupy.cuda.Event(disable_timing=True)
            fork.record(origin)
            for stream in workers:
                stream.wait_event(fork)
            for index, (a, b) in enumerate(bounds):
                piece(a, b, workers[index % len(workers)])
            for stream in workers:
                done = cupy.cuda.Event(disable_timing=True)
                done.record(stream)
                origin.wait_event(done)

        y_host.fill(np.nan)
        split()
        origin.synchronize()
        entry = {"streams": count, "chunks": len(bounds), "ms": None, "speedup": None, "correct": bool(np.array_equal(y_host, expected))}
        if entry["correct"]:
            entry["ms"], _ = median_ms(split, warmup, repeat, stream=origin)
            entry["speedup"] = result["serial_ms"] / entry["ms"]
        result["chunked"].append(entry)
    timed = [e for e in result["chunked"] if e["ms"]]
    if len(timed) < len(result["chunked"]):
        result.update(status="incorrect", reason="a chunked run's output differs from the serial run's")
    if timed:
        best = min(timed, key=lambda e: e["ms"])
        result.update(best_streams=best["streams"], best_ms=best["ms"], speedup=best["speedup"])
    return result
