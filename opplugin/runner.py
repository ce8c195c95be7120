"""Executing a plan on a device: batches of any size, in chunks, with timings.

On a CUDA device, plugin steps read and write CuPy arrays, so tensors stay on
the GPU between them. An onnxruntime step uses the CUDA execution provider
through IOBinding on device pointers when the installed onnxruntime has it;
otherwise it runs on the CPU provider, and the copies this needs are timed and
reported as steps of their own. Without a device, plugin steps run their numpy
reference kernels.

A batch is cut into chunks (see chunking.py) sized from the free device memory
and for overlap; several CUDA streams ("lanes", see lanes.py) work on different
chunks at once, so copies hide behind compute. Kernels and onnxruntime
sessions take any chunk size, so one runner serves any batch. When the device
runs out of memory, the run starts again with chunks half as large.

NaN and Inf: a fused Conv > activation > MaxPool step propagates them through
its pool windows, which onnxruntime's MaxPool does not do consistently. So each
fused step's output is checked on the device as the chunk runs, and a chunk in
which any was not finite runs again on the exact path: the same plan with the
fused steps split into the plain Conv step and onnxruntime's own activation
and MaxPool nodes, on its CPU provider (the reference). Its results replace
the chunk's; RunResult.exact_reruns counts such chunks. Finite inputs never
take it.
"""
from __future__ import annotations

import copy
import statistics
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from . import chunking, cuda
from .errors import DeviceError, InputError, OutOfDeviceMemory, PluginError
from .lanes import Chains, CudaLane, HostLane
from .model import Model
from .nonfinite import NonFiniteFlags
from .pipeline import ChunkInputs, PlanExecutor, Progress, Results, run_chunks
from .plan import OrtStep, Plan, PluginStep, make_plan, split_fused
from .registry import Device, Kernel, Plugin
from .timeline import Span, Timeline, copy_figures

CPU = Device("cpu")
# Streams working on chunks at once: one uploading, one computing, one downloading.
DEFAULT_STREAMS = 3


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
    """One step or copy in one run, summed over the run's chunks."""

    name: str
    kind: str  # "plugin", "onnxruntime" or "copy"
    ms: float


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    kept: dict[str, np.ndarray]
    times: list[StepTime]
    total_ms: float  # host to host: from the caller's arrays to the returned ones
    batch: int = 0
    chunks: int = 1
    chunk_size: int = 0
    streams: int = 1
    input_pinned: bool = False
    copy_ms: float = 0.0  # summed duration of every copy
    copy_hidden_ms: float = 0.0  # copy time that overlapped compute
    copy_exposed_ms: float = 0.0  # copy time with nothing computing
    # chunks that held NaN or Inf after a fused step and ran again on the exact path
    # (fused steps split into Conv + onnxruntime's own nodes); its time is in total_ms only
    exact_reruns: int = 0
    exact_ms: float = 0.0
    spans: list[Span] = field(default_factory=list, repr=False)


@dataclass
class Profile:
    """Every timed run of one input set; medians for the report."""

    result: RunResult  # the last run's outputs
    step_ms: dict[str, list[float]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    total_ms: list[float] = field(default_factory=list)
    copy_ms: list[float] = field(default_factory=list)
    copy_hidden_ms: list[float] = field(default_factory=list)
    copy_exposed_ms: list[float] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return self.result.batch

    def median(self, name: str) -> float:
        return statistics.median(self.step_ms[name])

    def add(self, result: RunResult) -> None:
        self.result = result
        self.total_ms.append(result.total_ms)
        self.copy_ms.append(result.copy_ms)
        self.copy_hidden_ms.append(result.copy_hidden_ms)
        self.copy_exposed_ms.append(result.copy_exposed_ms)
        for reading in result.times:
            self.step_ms.setdefault(reading.name, []).append(reading.ms)
            self.kinds[reading.name] = reading.kind


def _sum_by_step(spans: list[Span]) -> list[StepTime]:
    """Per step name, the time summed over chunks, in the order the first chunk ran them."""
    times: dict[str, StepTime] = {}
    for span in spans:
        entry = times.setdefault(span.name, StepTime(span.name, span.kind, 0.0))
        entry.ms += span.ms
    return list(times.values())


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class Runner:
    """Runs one model on one device, plugins swapped in, at any batch size.

    `batch` is the largest batch you expect; kernels are chosen and timed at the
    chunk size it leads to. `chunk` fixes the images per chunk (default: from the
    free device memory and the pipeline's needs); `streams` the chunks in flight
    at once on a GPU (default 3).
    """

    def __init__(
        self,
        model: Model,
        batch: int,
        device: Device | str | None = "auto",
        variants: dict[str, str] | None = None,
        registry: dict[str, Plugin] | None = None,
        *,
        chunk: int | None = None,
        streams: int | None = None,
    ):
        self.batch = _positive_int(batch, "batch")
        if chunk is not None:
            chunk = _positive_int(chunk, "chunk")
        self.device = device if isinstance(device, Device) else select_device(device)
        self.streams = _positive_int(streams, "streams") if streams is not None else (DEFAULT_STREAMS if self.device.is_cuda else 1)
        self.layout = chunking.probe_layout(model)
        self.peak_image_bytes = chunking.peak_image_bytes(model, self.layout)
        plan_batch = min(self.batch, chunk or self._chunk_for(self.batch)) if self.layout.chunkable else self.batch
        self.plan: Plan = make_plan(model, plan_batch, self.device, registry)
        self._check_plan_chunkable(model)
        if not self.layout.chunkable and plan_batch != self.batch:
            plan_batch = self.batch
            self.plan = make_plan(model, plan_batch, self.device, registry)
        self.chunk = plan_batch
        self.chunk_retries = 0  # times an out-of-memory halved the chunk

        variants = self.variants = dict(variants or {})
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
        if self.device.is_cuda:
            # the uploads above ran on the default stream, which the lanes' streams do not wait for
            cuda.synchronize()
            if self.layout.chunkable and chunk is None:
                self.chunk = min(self.chunk, self._chunk_for_workspaces())

        self.executor = PlanExecutor(self.plan, self.layout, self.kernels, self.sessions, self.constants, self.ort_on_gpu)
        if self.device.is_cuda:
            self._chains = Chains()
            device_id = cuda.device_id()
            self.lanes: list[Any] = [CudaLane(device_id, self._chains) for _ in range(self.streams)]
        else:
            self._chains = None
            self.lanes = [HostLane() for _ in range(self.streams)]
        self._lane_pool: ThreadPoolExecutor | None = None
        self._exact: PlanExecutor | None = None  # built when a chunk first needs it

    # --- set-up -------------------------------------------------------------------------

    def _chunk_for(self, batch: int) -> int:
        """Images per chunk: what the memory budget allows, and on a GPU no more than overlap wants."""
        if not self.device.is_cuda:
            return min(batch, chunking.memory_chunk(chunking.HOST_CHUNK_BYTES, self.peak_image_bytes))
        budget = int(cuda.free_device_bytes() * chunking.DEVICE_MEMORY_SHARE / self.streams)
        by_memory = chunking.memory_chunk(budget, self.peak_image_bytes)
        return max(1, min(batch, by_memory, chunking.pipeline_chunk(batch, self.layout.input_image_bytes())))

    def _chunk_for_workspaces(self) -> int:
        """The chunk, shrunk if the kernels' workspaces (im2col and the like) would not fit beside it."""

        def workspace(images: int) -> int:
            return sum(getattr(k, "workspace_bytes", lambda b: 0)(images) for k in self.kernels.values())

        if not workspace(self.chunk):
            return self.chunk
        budget = int(cuda.free_device_bytes() * chunking.DEVICE_MEMORY_SHARE / self.streams)
        return chunking.memory_chunk(budget, self.peak_image_bytes, workspace)

    def _check_plan_chunkable(self, model: Model) -> None:
        boundary = [n for step in self.plan.steps for n in [*step.inputs, *step.outputs]] + list(model.outputs)
        whole = set(model.initializers) | {i.name for i in model.inputs if i.name not in self.layout.batched_inputs}
        chunking.check_steps(self.layout, boundary, whole)

    def _providers(self) -> list:
        if self.device.is_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
            # TF32 off: the steps onnxruntime runs must stay FP32-exact like ours
            return [("CUDAExecutionProvider", {"device_id": cuda.device_id(), "use_tf32": 0}), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    @property
    def ort_on_gpu(self) -> bool:
        return self.providers[0] != "CPUExecutionProvider"

    def _session(self, step: OrtStep, providers: list[str] | None = None) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        return ort.InferenceSession(self._any_batch(step.model).SerializeToString(), options, providers=providers or self.providers)

    def _any_batch(self, sub_model: onnx.ModelProto) -> onnx.ModelProto:
        """The sub-model with a symbolic first axis on its batched inputs and outputs,
        so that one session serves every chunk size."""
        if not self.layout.chunkable:
            return sub_model
        proto = copy.deepcopy(sub_model)
        for value in [*proto.graph.input, *proto.graph.output]:
            dims = value.type.tensor_type.shape.dim
            if self.layout.is_batched(value.name) and dims:
                dims[0].Clear()
                dims[0].dim_param = "N"
        return proto

    def implementation(self, step_name: str) -> str:
        if step_name in self.kernels:
            return self.kernels[step_name].name
        return "onnxruntime CUDA" if self.ort_on_gpu else "onnxruntime CPU"

    def shape_at(self, name: str, batch: int) -> tuple[int, ...]:
        """The shape of a tensor when the model runs at `batch`."""
        if self.layout.chunkable and self.layout.is_batched(name):
            return self.layout.shape_at(name, batch)
        return self.plan.shape_of(name)

    def memory(self) -> dict[str, int]:
        """Device and pinned memory figures (zeros on the CPU), and this runner's staging buffers."""
        figures = cuda.memory_figures() if self.device.is_cuda else {}
        figures["staging_bytes"] = sum(lane.staging_bytes() for lane in self.lanes)
        return figures

    # --- checking inputs ----------------------------------------------------------------

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> int:
        """The batch of these feeds; InputError naming the first thing that does not match."""
        model = self.plan.model
        if not isinstance(feeds, dict):
            raise InputError(f"feeds must be a dict of input name to numpy array, got {type(feeds).__name__}")
        expected = {i.name for i in model.inputs}
        if set(feeds) != expected:
            raise InputError(f"inputs {sorted(feeds)} do not match the model's inputs {sorted(expected)}")
        batches = set()
        for name, value in feeds.items():
            want = self.plan.shape_of(name)
            if not isinstance(value, np.ndarray):
                raise InputError(f"input {name!r} must be a numpy array, got {type(value).__name__}")
            if value.dtype != np.float32:
                raise InputError(f"input {name!r} is {value.dtype}; the model takes float32")
            if value.ndim != len(want):
                raise InputError(f"input {name!r} has rank {value.ndim}; the model takes rank {len(want)} {list(want)}")
            if self.layout.chunkable and name in self.layout.batched_inputs:
                if tuple(value.shape[1:]) != tuple(want[1:]):
                    raise InputError(f"input {name!r} has shape {list(value.shape)}; the model takes [N, {', '.join(map(str, want[1:]))}]")
                if value.shape[0] < 1:
                    raise InputError(f"input {name!r} has batch {value.shape[0]}; the batch must be at least 1")
                batches.add(value.shape[0])
            elif tuple(value.shape) != tuple(want):
                why = f" ({self.layout.unchunkable})" if not self.layout.chunkable else ""
                raise InputError(f"input {name!r} has shape {list(value.shape)}; this runner takes {list(want)} (batch {self.batch}){why}")
        if len(batches) > 1:
            raise InputError(f"the batched inputs have different batch sizes {sorted(batches)}")
        return batches.pop() if batches else self.batch

    # --- running ------------------------------------------------------------------------

    def run(self, feeds: dict[str, np.ndarray], keep: tuple[str, ...] = (), progress: Progress | None = None) -> RunResult:
        """One pass over the batch (any size). Returns host copies of the graph outputs and of `keep`.
        `progress(label, images_done, images)` is called as chunks finish."""
        batch = self.check_feeds(feeds)
        crossing = set(feeds) | {name for step in self.plan.steps for name in step.outputs}
        hidden = [name for name in keep if name not in crossing]
        if hidden:
            raise InputError(f"cannot keep {hidden}: only inputs and tensors that leave a step can be kept "
                             f"({', '.join(sorted(crossing))})")
        feeds = {name: np.ascontiguousarray(value) for name, value in feeds.items()}
        while True:
            chunks = chunking.split_rows(batch, self.chunk) if self.layout.chunkable else [slice(0, batch)]
            try:
                return self._run_chunks(feeds, batch, chunks, tuple(keep), progress)
            except Exception as err:
                if not cuda.is_out_of_memory(err):
                    raise
                self._after_out_of_memory()
                if not self.layout.chunkable or self.chunk == 1:
                    raise self._out_of_memory_error(batch, err) from None
                self.chunk = max(1, self.chunk // 2)
                self.chunk_retries += 1

    def _after_out_of_memory(self) -> None:
        if self.device.is_cuda:
            cuda.synchronize()
            cuda.release_cached_memory()

    def _out_of_memory_error(self, batch: int, err: BaseException) -> OutOfDeviceMemory:
        where = "device" if self.device.is_cuda else "host"
        cause = (str(err).strip().splitlines() or [type(err).__name__])[0]
        if not self.layout.chunkable:
            return OutOfDeviceMemory(f"out of {where} memory at batch {batch}, and this model cannot run in chunks "
                                     f"because {self.layout.unchunkable}: {cause}")
        return OutOfDeviceMemory(f"out of {where} memory even with chunks of 1 image "
                                 f"(about {self.peak_image_bytes} bytes per image live): {cause}")

    def _run_chunks(self, feeds: dict[str, np.ndarray], batch: int, chunks: list[slice], keep: tuple[str, ...],
                    progress: Progress | None) -> RunResult:
        on_gpu = self.device.is_cuda
        pinned = {name: on_gpu and cuda.is_pinned(value) for name, value in feeds.items()}
        single = len(chunks) == 1
        inputs = ChunkInputs(feeds, pinned, keep, Results(batch, self.layout.chunkable, single),
                             Results(batch, self.layout.chunkable, single))
        if self._chains:
            self._chains.reset()
        if self.executor.watched_outputs:
            inputs.flags = NonFiniteFlags(len(chunks), self.executor.watched_outputs, on_gpu)
        started = time.perf_counter()
        timeline = Timeline(on_gpu)
        run_chunks(
            self.lanes, chunks,
            lambda lane, index, rows: self.executor.run_chunk(lane, timeline, index, rows, inputs),
            self._pool, progress,
        )
        flagged = inputs.flags.raised() if inputs.flags else []
        exact_started = time.perf_counter()
        if flagged:
            self._rerun_exactly(inputs, chunks, flagged)
        exact_ms = (time.perf_counter() - exact_started) * 1e3 if flagged else 0.0
        total = (time.perf_counter() - started) * 1e3
        spans = timeline.spans()
        copied, hidden, exposed = copy_figures(spans)
        batched = [name for name in feeds if name in self.layout.batched_inputs] or list(feeds)
        return RunResult(
            outputs={name: inputs.outputs.arrays[name] for name in self.plan.model.outputs},
            kept={name: inputs.kept.arrays[name] for name in keep},
            times=_sum_by_step(spans),
            total_ms=total,
            batch=batch,
            chunks=len(chunks),
            chunk_size=max(c.stop - c.start for c in chunks),
            streams=min(len(self.lanes), len(chunks)),
            input_pinned=all(pinned[name] for name in batched),
            copy_ms=copied,
            copy_hidden_ms=hidden,
            copy_exposed_ms=exposed,
            exact_reruns=len(flagged),
            exact_ms=exact_ms,
            spans=spans,
        )

    # --- the exact path for chunks with NaN or Inf --------------------------------------

    def _rerun_exactly(self, inputs: ChunkInputs, chunks: list[slice], flagged: list[int]) -> None:
        """Runs the flagged chunks again on the exact path; their rows of the outputs
        and kept tensors are overwritten. Its timings are not step times of the plan."""
        executor = self._exact_executor()
        again = ChunkInputs(inputs.feeds, inputs.pinned, inputs.keep, inputs.outputs, inputs.kept)
        timeline = Timeline(self.device.is_cuda)
        run_chunks(
            self.lanes, [chunks[i] for i in flagged],
            lambda lane, position, rows: executor.run_chunk(lane, timeline, flagged[position], rows, again),
            self._pool,
        )

    def _exact_executor(self) -> PlanExecutor:
        """The plan with its fused steps split into the plain plugin step and onnxruntime's
        own nodes for the rest (see plan.split_fused); kernels and sessions it shares with
        the fast plan are reused."""
        if self._exact is None:
            plan = split_fused(self.plan)
            kernels = {step.name: self._unfused_kernel(step) for step in plan.plugin_steps}
            # onnxruntime's CPU provider, the reference `check` uses: its CUDA provider
            # (cuDNN pooling) treats NaN in a pool window by other rules again
            sessions = {step.name: self._session(step, ["CPUExecutionProvider"])
                        for step in plan.steps if isinstance(step, OrtStep)}
            if self.device.is_cuda:
                cuda.synchronize()  # a kernel build may upload constants on the default stream
            self._exact = PlanExecutor(plan, self.layout, kernels, sessions, self.constants, ort_on_gpu=False)
        return self._exact

    def _unfused_kernel(self, step: PluginStep) -> Kernel:
        """The kernel of a split step: the fast plan's own when it fused nothing, else the
        same variant built without its epilogue (the plugin's choice if it cannot be)."""
        kernel = self.kernels[step.name]
        if not any(s.name == step.name and s.fused for s in self.plan.plugin_steps):
            return kernel
        requested = self.variants.get(step.node.op_type)
        variant = getattr(kernel, "variant", None) or requested
        try:
            return step.build(self.device, variant)
        except PluginError:
            if variant == requested:
                raise
            return step.build(self.device, requested)

    def _pool(self) -> ThreadPoolExecutor:
        if self._lane_pool is None:
            self._lane_pool = ThreadPoolExecutor(max_workers=len(self.lanes), thread_name_prefix="opplugin-lane")
            weakref.finalize(self, self._lane_pool.shutdown, wait=False)
        return self._lane_pool

    def chunks_for(self, batch: int) -> int:
        """How many chunks a run of `batch` images takes now."""
        return -(-batch // self.chunk) if self.layout.chunkable else 1

    def profile(
        self,
        feeds: dict[str, np.ndarray],
        warmup: int = 2,
        repeat: int = 5,
        keep: tuple[str, ...] = (),
        progress: Progress | None = None,
    ) -> Profile:
        """Runs warm-up passes, then `repeat` timed passes; keeps every reading.
        `progress(label, images_done, images)` counts images over all passes;
        the label says "warm-up" or "timed run"."""
        if isinstance(repeat, bool) or isinstance(warmup, bool) or repeat < 1 or warmup < 0:
            raise InputError(f"repeat must be at least 1 and warm-up at least 0 (got {repeat}, {warmup})")
        batch = self.check_feeds(feeds)
        passes = warmup + repeat
        profile = None
        for number in range(passes):
            label = "warm-up" if number < warmup else "timed run"

            def report(_label: str, done: int, total: int, offset: int = number * batch, label: str = label) -> None:
                if progress:
                    progress(label, offset + done, passes * batch)

            result = self.run(feeds, keep if number >= warmup else (), report)
            if number < warmup:
                continue
            if profile is None:
                profile = Profile(result)
            profile.add(result)
        return profile
