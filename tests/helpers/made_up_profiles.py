"""Profiles of runs this machine cannot make: a GPU's, with CUDA-graph replays."""
from __future__ import annotations

import dataclasses

from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.runtime.records import Profile, RunResult, RunTiming
from opplugin.runtime.timeline import Span


def gpu_profile_with_a_graph():
    """Two chunks on two streams whose plugin steps replay as one CUDA graph each (made up: no GPU here)."""
    plan = Runner(load_model("lenet86"), 4, "cpu").plan_record(4)
    plan = dataclasses.replace(plan, device=Device("cuda", "Test GPU", "9.0", 80 << 30))
    names = [step.name for step in plan.steps]
    spans = []
    for chunk in (0, 1):
        t = 0.5 * chunk
        spans += [Span("copy H2D input", "copy", chunk, 0, t, t + 0.1, chunk, "device"),
                  Span("graph conv1", "graph", chunk, 1, t + 0.1, t + 0.9, chunk, "device")]
        spans += [Span(name, "plugin", chunk, 2 + i, t + 0.1 + 0.15 * i, t + 0.25 + 0.15 * i, chunk, "device")
                  for i, name in enumerate(names)]
    result = RunResult({}, {}, 1.5, batch=4, chunks=2, chunk_size=2, streams=2,
                       timing=RunTiming.of(spans, {"graph conv1": tuple(names)}))
    profile = Profile(plan, result)
    profile.add(result)
    return profile
