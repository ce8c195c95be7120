"""One trial of a Conv configuration: the loop `opplugin bench` and `opplugin tune`
share. A trial builds the configuration (compiled by NVRTC, weights uploaded),
optionally screens it for spills (local memory), runs it once into an output
poisoned with NaN, checks the images it wrote against the float64 oracle, and
only then times it with CUDA events. A configuration that fails any step is
recorded with the reason, never timed, and never raises.

Times are medians of samples after warm-up. A sample covers enough back-to-back
calls to last about a millisecond (MIN_SAMPLE_MS), so at small batches the
figure is the launch-bound rate a caller really gets rather than a single
launch's latency. Given a capturer (graphed.py), a sample is instead one replay of a
CUDA graph of those calls, as a runner launches its steps by default: the figure is then
the device's time per call, free of the host's launch cost.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..gpu import cuda
from ..errors import first_line
from ..ops.conv import families, reference
from ..ops.conv.epilogue import Epilogue
from ..ops.conv.families import Config
from ..ops.conv.families.base import Family, Weights
from ..ops.conv.prologue import PROLOGUE_INPUT
from ..ops.conv.spec import ConvSpec
from .format_bound import FormatBound, bound_fraction

# relative L2 error against float64 a result may have and still count as correct
EXACT_TOLERANCE = 1e-5  # the bound every FP32-exact kernel is held to
# `opplugin bench` (every suite, --e2e too): untimed calls, then timed samples whose median it reports
BENCH_WARMUP = 3
BENCH_REPEAT = 20
# bench --e2e: every candidate's warm-up also lasts this long, so that each is timed as clocks and caches
# have settled for it, whatever ran before (the first model of a run came out up to 10% slower without)
E2E_WARMUP_MS = 50.0
MAX_WARMUP_CALLS = 1000
CHECKED_IMAGES_PER_END = 4
MIN_SAMPLE_MS = 1.0  # one timing sample spans at least this much work
MAX_CALLS_PER_SAMPLE = 256
# (fn, calls) -> a function replaying `calls` calls of fn from one CUDA graph (graphed.py)
Capture = Callable[[Callable[[], Any], int], Callable[[], Any]]


def check_indices(batch: int) -> list[int]:
    """Images checked against float64: a few at each end of the batch and the middle one."""
    ends = list(range(min(batch, CHECKED_IMAGES_PER_END))) + list(range(max(0, batch - CHECKED_IMAGES_PER_END), batch))
    return sorted(set(ends + [batch // 2]))


class Problem:
    """One Conv step's test data on the device (x, and the weights for families that
    read them at call time) and the float64 oracle's answer on the checked images."""

    def __init__(self, spec: ConvSpec, epilogue: Epilogue, x: Any, w: np.ndarray, b: np.ndarray | None, residual: Any = None):
        import cupy

        self.spec, self.epilogue = spec, epilogue
        self.weights: Weights = (w, b)
        self.x = x
        self.inputs = [x, cupy.asarray(w)] + ([cupy.asarray(b)] if b is not None else [])
        self.residual = None
        if epilogue.residual:  # the step's inputs: X, W, B (None without one), the residual operand
            shape = spec.output_shape(int(x.shape[0]))
            self.residual = cupy.random.standard_normal(shape, dtype=cupy.float32) if residual is None else residual
            self.inputs = self.inputs[:2] + [self.inputs[2] if b is not None else None, self.residual]
        self.scale = None
        if epilogue.prologue and epilogue.prologue.takes_operand:  # then the prologue's scale, input 4 of the step
            self.scale = cupy.random.uniform(-2.0, 2.0, (int(x.shape[0]), spec.in_channels, 1, 1), dtype=cupy.float32)
            self.inputs = self.inputs + [None] * (PROLOGUE_INPUT - len(self.inputs)) + [self.scale]
        self.indices = check_indices(int(x.shape[0]))
        r = None if self.residual is None else cupy.asnumpy(self.residual[self.indices])
        s = None if self.scale is None else cupy.asnumpy(self.scale[self.indices])
        self.checked_operands = (cupy.asnumpy(x[self.indices]), w, b, r, s)  # the checked images' operands, on the host
        self.expected = reference.expected(spec, epilogue, *self.checked_operands)
        self._bounds: dict[FormatBound, np.ndarray] = {}  # each bound's elements, the same for every candidate

    @classmethod
    def random(cls, spec: ConvSpec, epilogue: Epilogue, weights: Weights | None = None) -> "Problem":
        """Fresh standard-normal input of the spec's shape (and residual operand, if the
        epilogue has one); the node's weights, or standard-normal ones when it has none
        (weights computed at run time)."""
        import cupy

        x = cupy.random.standard_normal(spec.input_shape(), dtype=cupy.float32)
        if weights is None:
            rng = np.random.default_rng()
            w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
            b = rng.standard_normal(spec.out_channels, dtype=np.float32) if spec.has_bias else None
        else:
            w = np.asarray(weights[0], np.float32)
            b = None if weights[1] is None else np.asarray(weights[1], np.float32)
        return cls(spec, epilogue, x, w, b)

    def checked(self, out: Any) -> tuple[np.ndarray, int]:
        """(the checked images of `out` in float64, elements that are NaN anywhere).
        `out` is a CuPy array, a host array, or a torch tensor (taken through DLPack)."""
        if isinstance(out, np.ndarray):
            return out[self.indices].astype(np.float64), int(np.isnan(out).sum())
        import cupy

        if not isinstance(out, cupy.ndarray):
            out = cupy.from_dlpack(out)  # a torch tensor, without a copy
        return cupy.asnumpy(out[self.indices]).astype(np.float64), int(cupy.isnan(out).sum())

    def error(self, out: Any) -> tuple[float, int]:
        """(relative L2 error on the checked images, elements that are NaN anywhere)."""
        got, unwritten = self.checked(out)
        return self.rel_error(got), unwritten

    def rel_error(self, got: np.ndarray) -> float:
        """The relative L2 error of the checked images `got` (NaN counted as 0)."""
        if got.shape != self.expected.shape:
            return math.inf
        scale = np.linalg.norm(self.expected) or 1.0
        return float(np.linalg.norm(np.nan_to_num(got, nan=0.0) - self.expected) / scale)

    def bound_fraction(self, got: np.ndarray, bound: FormatBound) -> float:
        """The largest error of the checked images `got` over its element's `bound` (at most 1: within it)."""
        if got.shape != self.expected.shape:
            return math.inf
        if bound not in self._bounds:
            self._bounds[bound] = bound.per_element(self.spec, self.epilogue, *self.checked_operands)
        return bound_fraction(got, self.expected, self._bounds[bound])


@dataclass(frozen=True)
class Verdict:
    """A candidate's output against float64: its relative L2 error, its largest error over its element's
    bound where a format bound judged it, and why it is wrong (None: correct)."""

    rel_error: float
    bound_fraction: float | None
    wrong: str | None


def judge(problem: Problem, out: Any, tolerance: float | None = None, bound: FormatBound | None = None) -> Verdict:
    """`out` within `bound` element by element where one is given (a 16-bit run), else within `tolerance`
    in relative L2; an output with NaN in it is wrong either way."""
    got, unwritten = problem.checked(out)
    rel_error = problem.rel_error(got)
    fraction = None if bound is None else problem.bound_fraction(got, bound)
    wrong = None
    if unwritten:
        wrong = f"{unwritten} output elements NaN (never written?)"
    elif fraction is not None and not fraction <= 1.0:
        wrong = f"an element {fraction:.3g}x its {bound.precision} bound away from float64 (relative error {rel_error:.3g})"
    elif bound is None and not rel_error <= tolerance:
        wrong = f"relative error {rel_error:.3g} > {tolerance:g}"
    return Verdict(rel_error, fraction, wrong)


def _host_clock_ms(fn: Callable[[], Any], warmup: int, repeat: int, calls: int) -> list[float]:
    """Per-call ms of samples timed by the host clock around a device sync: for calls
    that wait for their own device work before returning (onnxruntime's run)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    return samples


def warm_up(fn: Callable[[], Any], calls: int, min_ms: float = 0.0) -> None:
    """fn() `calls` times, then again until `min_ms` of wall clock have passed since the first
    (MAX_WARMUP_CALLS at most)."""
    started = time.perf_counter()
    for done in range(MAX_WARMUP_CALLS):
        if done >= calls and (time.perf_counter() - started) * 1e3 >= min_ms:
            return
        fn()


def host_ms(fn: Callable[[], Any], warmup: int, repeat: int, warmup_ms: float = 0.0) -> float:
    """Median host-clock ms of fn() after `warmup` calls (lasting `warmup_ms` at least), with no
    device sync of its own: fn must return once its work is done (a whole model host to host, say)."""
    warm_up(fn, warmup, warmup_ms)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def median_ms(fn: Callable[[], Any], warmup: int, repeat: int, *, stream: Any = None, host_clock: bool = False) -> tuple[float, int]:
    """(median ms per call, calls per sample). One untimed call runs first (compiles,
    cuDNN's algorithm search), then one timed call sizes the samples to about
    MIN_SAMPLE_MS, then `warmup` more untimed ones and `repeat` samples. CUDA events
    on `stream` time the samples, or the host clock for calls that synchronise."""
    def samples(warm: int, count: int, calls: int) -> list[float]:
        if host_clock:
            return _host_clock_ms(fn, warm, count, calls)
        return cuda.time_ms(fn, warm, count, stream, calls)

    fn()
    [once] = samples(0, 1, 1)
    calls = calls_per_sample(once)
    return statistics.median(samples(warmup, repeat, calls)), calls


def calls_per_sample(once_ms: float) -> int:
    """Back-to-back calls that make a sample of about MIN_SAMPLE_MS, one call taking `once_ms`."""
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_MS / max(once_ms, 1e-6))))


def graph_median_ms(fn: Callable[[], Any], capture: Capture, warmup: int, repeat: int) -> tuple[float, int]:
    """(median ms per call, calls per graph), as `median_ms` but each sample replays one CUDA
    graph of back-to-back calls (`capture(fn, calls)` makes it; see graphed.py), the way a
    runner launches its steps by default: the host's launch cost is left out."""
    fn()
    [once] = cuda.time_ms(capture(fn, 1), 1, 1)
    calls = calls_per_sample(once)
    replay = capture(fn, calls)
    return statistics.median(cuda.time_ms(replay, warmup, repeat)) / calls, calls


@dataclass(frozen=True)
class Timing:
    ms: float
    calls: int  # per sample
    timer: str  # "cuda-graph" (events around a graph of the calls) or "cuda-events" (eager calls)
    note: str | None = None  # why a call asked to be timed in a graph was timed eagerly


def time_call(fn: Callable[[], Any], warmup: int, repeat: int, capture: Capture | None = None) -> Timing:
    """fn's median ms per call: replayed from a CUDA graph where `capture` is given and the
    calls can be captured, else launched eagerly (and the note says why)."""
    note = None
    if capture is not None:
        try:
            return Timing(*graph_median_ms(fn, capture, warmup, repeat), "cuda-graph")
        except Exception as err:  # a call that cannot be captured (one that synchronises) is timed eagerly
            cuda.synchronize()
            note = f"timed eagerly: its calls cannot be captured in a CUDA graph ({first_line(err, named=True)})"
    return Timing(*median_ms(fn, warmup, repeat), "cuda-events", note)


@dataclass
class Trial:
    """How one configuration fared. status: "ok" (correct, timed), "unsupported" (it
    cannot run this node), "spills" (screened out), "incorrect" or "failed"."""

    variant: str  # the configuration's name (or a user kernel's label)
    status: str
    reason: str | None = None
    kernel_name: str | None = None
    bytes: int | None = None  # the kernel's own count of bytes it moves
    rel_error: float | None = None
    bound_fraction: float | None = None  # the largest error over its element's format bound (a 16-bit run)
    local_bytes: int | None = None  # local memory per thread, when screened
    ms: float | None = None
    calls: int | None = None
    timer: str | None = None  # how `ms` was measured (Timing.timer)


def local_memory_bytes(kernel: Any) -> int | None:
    """The most local memory per thread any CUDA function of the kernel uses (spills,
    or arrays the compiler could not keep in registers); None for a kernel with none."""
    if not kernel.functions:
        return None
    return max(int(f.attributes["local_size_bytes"]) for f in kernel.functions)


def run_trial(problem: Problem, variant: Config | Family, *, tolerance: float | None, warmup: int, repeat: int,
              screen_spills: bool = False, capture: Capture | None = None, bound: FormatBound | None = None) -> Trial:
    """Build, (screen,) check and time a configuration (a family's: its heuristic's pick) on
    `problem`; never raises for a failure of the configuration itself. Its output is held to `bound`
    where one is given, else to `tolerance` (see judge). With `capture`, the calls are timed replayed
    from a CUDA graph (see time_call)."""
    spec, epilogue = problem.spec, problem.epilogue
    config, reason = families.checked(spec, variant, problem.weights, epilogue)
    if reason:
        return Trial(families.family_of(variant).name if config is None else config.name(), "unsupported", reason)
    variant = config.name()
    try:
        kernel = families.build_checked(spec, config, problem.weights, epilogue)
    except Exception as err:  # a compile or build failure rules out this configuration only
        return failed_trial(Trial(variant, "failed"), "build failed", err)
    trial = Trial(variant, "ok", kernel_name=kernel.name, bytes=kernel.bytes_moved(spec.batch))
    if screen_spills:
        try:
            trial.local_bytes = local_memory_bytes(kernel)
        except Exception as err:
            return failed_trial(trial, "cannot read the kernel's attributes", err)
        if trial.local_bytes:
            return dataclasses.replace(trial, status="spills", reason=f"spills: {trial.local_bytes} bytes of local memory per thread")
    try:
        import cupy

        out = cupy.full(kernel.output_shape(spec.batch), cupy.nan, dtype=cupy.float32)
        kernel(problem.inputs, None, out=out)
        verdict = judge(problem, out, tolerance, bound)
        trial.rel_error, trial.bound_fraction = verdict.rel_error, verdict.bound_fraction
        if verdict.wrong:
            return dataclasses.replace(trial, status="incorrect", reason=verdict.wrong)
        timing = time_call(lambda: kernel(problem.inputs, None, out=out), warmup, repeat, capture)
        trial.ms, trial.calls, trial.timer, trial.reason = timing.ms, timing.calls, timing.timer, timing.note
    except Exception as err:  # a launch failure: resources, or an error the kernel raised
        return failed_trial(trial, "run failed", err)
    return trial


def failed_trial(trial: Trial, what: str, err: BaseException) -> Trial:
    if cuda.is_out_of_memory(err):
        cuda.release_cached_memory()
    return dataclasses.replace(trial, status="failed", reason=f"{what}: {first_line(err, named=True)}")
