"""The plain records a runner hands out: what it runs (PlanRecord, StepRecord), what
one run did (RunResult, StepTime) and what repeated runs measured (Profile).

report/timing.py and verify/check.py read these and nothing else of the runtime.
"""
from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..gpu.device import Device
from ..graph.model import Model
from .chunking import BatchLayout
from .timeline import GRAPH, Span, copy_figures


@dataclass(frozen=True)
class StepRecord:
    """One step of a plan at one batch."""

    name: str
    kind: str  # "plugin" or "onnxruntime"
    ops: tuple[str, ...]
    implementation: str  # the kernel's name, or "onnxruntime CPU" / "onnxruntime CUDA"
    inputs: tuple[str, ...]  # the tensors it reads, weights left out
    outputs: tuple[str, ...]
    flops: int | None = None  # plugin steps: the kernel's count at the record's batch
    bytes_moved: int | None = None
    nodes: tuple[str, ...] = ()  # the names of the ONNX nodes it runs, one per op
    views: tuple[str, ...] = ()  # the operands it reads through layout nodes as views, each in words (plan/input_views.py)
    precision: str = "fp32"  # what its kernel computes its products in ("fp32", "tf32", "fp16", "bf16"; plan/precision.py)
    precision_reason: str | None = None  # under a reduced --precision, why the step does not run in it (None where it does)
    channel_last: tuple[str, ...] = ()  # its tensors kept channel-last in its 16-bit format (plan/channel_last.py)


@dataclass(frozen=True)
class PlanRecord:
    """What a runner runs, at one batch: its steps and the shape of every tensor
    that crosses a step boundary, with what it needs to cut a batch into chunks."""

    model: Model
    device: Device
    onnxruntime_provider: str  # "CUDAExecutionProvider" or "CPUExecutionProvider"
    batch: int
    chunk: int  # images per chunk the runner's kernels were chosen for
    steps: tuple[StepRecord, ...]
    shapes: dict[str, tuple[int, ...]]
    layout: BatchLayout
    peak_image_bytes: int
    fallbacks: dict[str, str]  # node -> why its plugin left it to onnxruntime
    fusions_given_up: dict[str, str] = field(default_factory=dict)  # plugin node -> why a fusion was given up
    # plugin step -> variant -> why it is not offered (None: offered); `plan` fills it, a runner does not
    variant_notes: dict[str, dict[str, str | None]] = field(default_factory=dict)
    precision: str = "fp32"  # the precision asked for (--precision); each step's own is its StepRecord's

    @property
    def plugin_steps(self) -> tuple[StepRecord, ...]:
        return tuple(step for step in self.steps if step.kind == "plugin")


@dataclass
class StepTime:
    """One step or copy in one run, summed over the run's chunks."""

    name: str
    kind: str  # "plugin", "onnxruntime" or "copy"
    ms: float


class RunTiming:
    """A run's spans and what they add up to. On a GPU they are read from the run's CUDA events
    when first asked for (`read`), not as the run returns: the runner reads them while its next
    run waits for the device, if no one asked before (Runner._run_chunks)."""

    def __init__(self, read: Callable[[], list[Span]], graph_steps: Callable[[list[Span]], dict[str, tuple[str, ...]]]):
        self._read, self._graph_steps = read, graph_steps

    @classmethod
    def of(cls, spans: list[Span], graphs: dict[str, tuple[str, ...]] | None = None) -> "RunTiming":
        """The timing of spans already read; `graphs` names the steps of each graph span."""
        return cls(lambda: spans, lambda _spans: dict(graphs or {}))

    @functools.cached_property
    def spans(self) -> list[Span]:
        return self._read()

    @functools.cached_property
    def times(self) -> list[StepTime]:
        return sum_by_step(self.spans)

    @functools.cached_property
    def copies(self) -> tuple[float, float, float]:
        """(copy, hidden, exposed) ms: see timeline.copy_figures."""
        return copy_figures(self.spans)

    @functools.cached_property
    def graphs(self) -> dict[str, tuple[str, ...]]:
        return self._graph_steps(self.spans)

    @functools.cached_property
    def graph_ms(self) -> dict[str, float]:
        return graph_totals(self.spans)


@dataclass
class RunResult:
    """One run of a batch: the graph outputs, the intermediate tensors asked to be kept,
    each step's time, the spans of the timeline, and how the batch was cut into chunks."""

    outputs: dict[str, np.ndarray]
    kept: dict[str, np.ndarray]
    total_ms: float  # host to host: the whole call, from the caller's arrays to the returned ones
    batch: int = 0
    chunks: int = 1
    chunk_size: int = 0
    streams: int = 1
    input_pinned: bool = False
    # chunks that held NaN or Inf after a fused step and ran again on the exact path
    # (fused steps split into Conv + onnxruntime's own nodes); its time is in total_ms only
    exact_reruns: int = 0
    exact_ms: float = 0.0
    # runs of plugin steps that could not be captured and ran eagerly: first step -> why
    graph_failures: dict[str, str] = field(default_factory=dict)
    timing: RunTiming = field(default_factory=lambda: RunTiming.of([]), repr=False)

    @property
    def spans(self) -> list[Span]:
        return self.timing.spans

    @property
    def times(self) -> list[StepTime]:
        """Each step's and copy's time, summed over chunks."""
        return self.timing.times

    @property
    def copy_ms(self) -> float:
        """The summed duration of every copy."""
        return self.timing.copies[0]

    @property
    def copy_hidden_ms(self) -> float:
        """Copy time that overlapped compute."""
        return self.timing.copies[1]

    @property
    def copy_exposed_ms(self) -> float:
        """Copy time with nothing computing."""
        return self.timing.copies[2]

    @property
    def graphs(self) -> dict[str, tuple[str, ...]]:
        """With CUDA graphs: each replayed graph's span name -> the plan steps it ran."""
        return self.timing.graphs

    @property
    def graph_ms(self) -> dict[str, float]:
        """Each graph replayed as a whole (its steps timed inside it, or not timed: step_times off)
        -> its replays' time (input copies included), summed over chunks."""
        return self.timing.graph_ms


@dataclass
class Profile:
    """Every timed run of one input set, the plan they ran, and medians for the report."""

    plan: PlanRecord  # at the runs' batch
    result: RunResult  # the last run's outputs
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    total_ms: list[float] = field(default_factory=list)
    copy_ms: list[float] = field(default_factory=list)
    copy_hidden_ms: list[float] = field(default_factory=list)
    copy_exposed_ms: list[float] = field(default_factory=list)
    graphs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # as in RunResult, over every timed run
    graph_ms: dict[str, list[float]] = field(default_factory=dict)  # each graph's replay time, one reading per timed run
    # each graph's replay time without step events (the runs total_ms comes from), one reading per timed pass
    untimed_graph_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.result.batch

    def median(self, name: str) -> float:
        """The median time of a step over the timed runs, in ms."""
        return statistics.median(self.step_ms[name])

    def add(self, result: RunResult, wall: RunResult | None = None) -> None:
        """Count one timed pass; the last one's outputs and spans are kept. `wall`, where given, is
        the same pass run without step events inside CUDA graphs: the host-to-host time is its."""
        self.result = result
        self.total_ms.append((wall or result).total_ms)
        if wall is not None:
            for name, ms in wall.graph_ms.items():
                self.untimed_graph_ms.setdefault(name, []).append(ms)
        self.copy_ms.append(result.copy_ms)
        self.copy_hidden_ms.append(result.copy_hidden_ms)
        self.copy_exposed_ms.append(result.copy_exposed_ms)
        self.graphs.update(result.graphs)
        for name, ms in result.graph_ms.items():
            self.graph_ms.setdefault(name, []).append(ms)
        for reading in result.times:
            self.step_ms.setdefault(reading.name, []).append(reading.ms)
            self.kinds[reading.name] = reading.kind


def sum_by_step(spans: list[Span]) -> list[StepTime]:
    """Per step name, the time summed over chunks, in the order the first chunk ran them.
    A CUDA graph's replay as a whole is left out: its steps have spans of their own."""
    times: dict[str, StepTime] = {}
    for span in spans:
        if span.kind == GRAPH:
            continue
        entry = times.setdefault(span.name, StepTime(span.name, span.kind, 0.0))
        entry.ms += span.ms
    return list(times.values())


def graph_totals(spans: list[Span]) -> dict[str, float]:
    """Per CUDA graph replayed as a span of kind GRAPH, its replays' time summed over chunks, in ms."""
    totals: dict[str, float] = {}
    for span in spans:
        if span.kind == GRAPH:
            totals[span.name] = totals.get(span.name, 0.0) + span.ms
    return totals
