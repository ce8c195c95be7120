"""Executing a plan on a device: where tensors live, copies, per-step timing.

On a CUDA device, plugin steps read and write CuPy arrays, so tensors stay on
the GPU between them. An onnxruntime step uses the CUDA execution provider
through IOBinding on device pointers when the installed onnxruntime has it;
otherwise it runs on the CPU provider, and the copies this needs are timed and
reported as steps of their own. Without a device, plugin steps run their numpy
reference kernels.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from . import cuda
from .errors import DeviceError, InputError
from .model import Model
from .plan import OrtStep, Plan, PluginStep, make_plan
from .registry import Device, Kernel, Plugin

CPU = Device("cpu")


def select_device(requested: str | None = "auto") -> Device:
    """"auto" takes the GPU when CuPy sees one; "cuda" without one is an error."""
    requested = requested or "auto"
    if requested == "cpu":
        return CPU
    if requested not in ("auto", "cuda"):
        raise DeviceError(f"unknown device {requested!r}; choose auto, cpu or cuda")
    if cuda.is_available():
        return cuda.device()
    if requested == "cuda":
        raise DeviceError("--device cuda was asked for, but no CUDA device is usable (is CuPy installed and a GPU visible?)")
    return CPU


@dataclass
class StepTime:
    """One executed step or copy in one run."""

    name: str
    kind: str  # "plugin", "onnxruntime" or "copy"
    ms: float


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    kept: dict[str, np.ndarray]
    times: list[StepTime]
    total_ms: float


@dataclass
class Profile:
    """Medians over the timed runs of one input set."""

    result: RunResult  # the last run's outputs
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    total_ms: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(self.step_ms[name])


class _Clock:
    """Times a region: CUDA events on the GPU, the host clock otherwise.
    Readings are taken after the run's final synchronisation."""

    def __init__(self, device: Device):
        self.device = device
        self.pending: list[tuple[str, str, Any, Any]] = []

    def measure(self, name: str, kind: str, fn: Callable[[], Any], host_timed: bool = False) -> Any:
        if self.device.is_cuda and not host_timed:
            start, end = cuda.event(), cuda.event()
            start.record()
            out = fn()
            end.record()
            self.pending.append((name, kind, start, end))
            return out
        if self.device.is_cuda:
            cuda.synchronize()
        begin = time.perf_counter()
        out = fn()
        if self.device.is_cuda:
            cuda.synchronize()
        self.pending.append((name, kind, begin, time.perf_counter()))
        return out

    def readings(self) -> list[StepTime]:
        if self.device.is_cuda:
            cuda.synchronize()
        times = []
        for name, kind, start, end in self.pending:
            ms = (end - start) * 1e3 if isinstance(start, float) else cuda.elapsed_ms(start, end)
            times.append(StepTime(name, kind, ms))
        return times


class _Tensors:
    """Where each tensor is: on the host, on the device, or both. A copy is made
    when a step needs a tensor where it is not, and timed as a step of its own."""

    def __init__(self, device: Device, clock: _Clock):
        self.device, self.clock = device, clock
        self.host: dict[str, np.ndarray] = {}
        self.gpu: dict[str, Any] = {}

    def put(self, name: str, value: Any) -> None:
        self.host.pop(name, None)
        self.gpu.pop(name, None)
        if self.device.is_cuda and not isinstance(value, np.ndarray):
            self.gpu[name] = value
        else:
            self.host[name] = value

    def on_host(self, name: str) -> np.ndarray:
        if name not in self.host:
            self.host[name] = self.clock.measure(f"copy D2H {name}", "copy", lambda: cuda.to_host(self.gpu[name]))
        return self.host[name]

    def on_device(self, name: str) -> Any:
        if not self.device.is_cuda:
            return self.on_host(name)
        if name not in self.gpu:
            self.gpu[name] = self.clock.measure(f"copy H2D {name}", "copy", lambda: cuda.to_device(self.host[name]))
        return self.gpu[name]


class Runner:
    """Runs one model at one batch size on one device, plugins swapped in."""

    def __init__(
        self,
        model: Model,
        batch: int,
        device: Device | str | None = "auto",
        variants: dict[str, str] | None = None,
        registry: dict[str, Plugin] | None = None,
    ):
        self.device = device if isinstance(device, Device) else select_device(device)
        self.plan: Plan = make_plan(model, batch, self.device, registry)
        self.batch = batch
        variants = variants or {}
        self.kernels: dict[str, Kernel] = {
            step.name: step.build(self.device, variants.get(step.node.op_type)) for step in self.plan.plugin_steps
        }
        self.providers = self._providers()
        self.sessions = {step.name: self._session(step) for step in self.plan.steps if isinstance(step, OrtStep)}
        # weights feeding plugin steps go to the device once, not on every run
        self.constants = {
            name: (cuda.to_device(value) if self.device.is_cuda else value)
            for step in self.plan.plugin_steps
            for name, value in step.node.constants.items()
        }

    # --- set-up -------------------------------------------------------------------------

    def _providers(self) -> list:
        if self.device.is_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
            # TF32 off: the steps onnxruntime runs must stay FP32-exact like ours
            return [("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0}), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    @property
    def ort_on_gpu(self) -> bool:
        return self.providers[0] != "CPUExecutionProvider"

    def _session(self, step: OrtStep) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(step.model.SerializeToString(), options, providers=self.providers)

    def implementation(self, step_name: str) -> str:
        if step_name in self.kernels:
            return self.kernels[step_name].name
        return "onnxruntime CUDA" if self.ort_on_gpu else "onnxruntime CPU"

    # --- running ------------------------------------------------------------------------

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> None:
        model = self.plan.model
        expected = {i.name for i in model.inputs}
        if set(feeds) != expected:
            raise InputError(f"inputs {sorted(feeds)} do not match the model's inputs {sorted(expected)}")
        for name, value in feeds.items():
            want = self.plan.shape_of(name)
            if not isinstance(value, np.ndarray):
                raise InputError(f"input {name!r} must be a numpy array, got {type(value).__name__}")
            if value.dtype != np.float32:
                raise InputError(f"input {name!r} is {value.dtype}; the model takes float32")
            if value.ndim != len(want):
                raise InputError(f"input {name!r} has rank {value.ndim}; the model takes rank {len(want)} {list(want)}")
            if tuple(value.shape) != tuple(want):
                raise InputError(f"input {name!r} has shape {list(value.shape)}; this runner takes {list(want)} (batch {self.batch})")

    def run(self, feeds: dict[str, np.ndarray], keep: tuple[str, ...] = ()) -> RunResult:
        """One pass over the plan. Returns host copies of the graph outputs and of `keep`."""
        self.check_feeds(feeds)
        clock = _Clock(self.device)
        tensors = _Tensors(self.device, clock)
        for name, value in feeds.items():
            tensors.put(name, np.ascontiguousarray(value))
        for name, value in self.constants.items():
            tensors.put(name, value)
        started = time.perf_counter()
        for step in self.plan.steps:
            if isinstance(step, PluginStep):
                self._run_plugin(step, tensors, clock)
            else:
                self._run_ort(step, tensors, clock)
        outputs = {name: tensors.on_host(name) for name in self.plan.model.outputs}
        kept = {name: tensors.on_host(name) for name in keep}
        times = clock.readings()
        total = (time.perf_counter() - started) * 1e3
        return RunResult(outputs, kept, times, total)

    def _run_plugin(self, step: PluginStep, tensors: _Tensors, clock: _Clock) -> None:
        kernel = self.kernels[step.name]
        args = [tensors.on_device(n) if n else None for n in step.inputs]
        outs = clock.measure(step.name, "plugin", lambda: kernel(args))
        for name, value in zip(step.outputs, outs):
            tensors.put(name, value)

    def _run_ort(self, step: OrtStep, tensors: _Tensors, clock: _Clock) -> None:
        session = self.sessions[step.name]
        if self.ort_on_gpu:
            self._run_ort_bound(step, session, tensors, clock)
            return
        feeds = {n: tensors.on_host(n) for n in step.inputs}
        outs = clock.measure(step.name, "onnxruntime", lambda: session.run(step.outputs, feeds), host_timed=True)
        for name, value in zip(step.outputs, outs):
            tensors.put(name, value)

    def _run_ort_bound(self, step: OrtStep, session: ort.InferenceSession, tensors: _Tensors, clock: _Clock) -> None:
        """CUDA provider with IOBinding: inputs and outputs stay in device memory."""
        binding = session.io_binding()
        for name in step.inputs:
            array = tensors.on_device(name)
            binding.bind_input(name, "cuda", 0, np.float32, list(array.shape), array.data.ptr)
        outputs = {}
        for name in step.outputs:
            info = self.plan.tensors[name]
            outputs[name] = cuda.empty(info.shape, info.dtype)
            binding.bind_output(name, "cuda", 0, info.dtype, list(info.shape), outputs[name].data.ptr)
        clock.measure(step.name, "onnxruntime", lambda: session.run_with_iobinding(binding), host_timed=True)
        for name, value in outputs.items():
            tensors.put(name, value)

    def profile(
        self,
        feeds: dict[str, np.ndarray],
        warmup: int = 2,
        repeat: int = 5,
        keep: tuple[str, ...] = (),
        progress: Callable[[str, int, int], None] | None = None,
    ) -> Profile:
        """Runs warm-up passes, then `repeat` timed passes; keeps every reading.
        `progress(label, done, total)` is called after each pass."""
        if repeat < 1 or warmup < 0:
            raise InputError(f"repeat must be at least 1 and warm-up at least 0 (got {repeat}, {warmup})")
        for done in range(warmup):
            self.run(feeds)
            if progress:
                progress("warm-up", done + 1, warmup)
        profile = None
        for done in range(repeat):
            result = self.run(feeds, keep)
            if progress:
                progress("timed run", done + 1, repeat)
            profile = profile or Profile(result)
            profile.result = result
            profile.total_ms.append(result.total_ms)
            for reading in result.times:
                profile.step_ms.setdefault(reading.name, []).append(reading.ms)
        return profile
