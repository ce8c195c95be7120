"""Executing a plan on a device: batches of any size, in chunks, with timings.

On a CUDA device, plugin steps read and write CuPy arrays, so tensors stay on
the GPU between them. An onnxruntime step uses the CUDA execution provider
through IOBinding on device pointers when the installed onnxruntime has it;
otherwise it runs on the CPU provider, and the copies this needs are timed and
reported as steps of their own. Without a device, plugin steps run their numpy
reference kernels.

A batch is cut into chunks (see chunking.py) sized from the free device memory
and for overlap; several CUDA streams ("lanes", see lanes.py) work on different
chunks at once, so copies hide behind compute (executor.py). Kernels and
onnxruntime sessions take any chunk size, so one runner serves any batch. When
the device runs out of memory, the run starts again with chunks half as large.
A chunk in which a fused step saw NaN or Inf runs again on the exact path
(exact.py).

What the runner ran and measured comes back as plain records (records.py).
"""
from __future__ import annotations

import copy
import functools
import time
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from ..gpu import cuda
from ..gpu.kernel_cache import CompileJob
from ..ort import known_ops, sessions
from ..gpu.device import Device, select_device
from ..errors import InputError, ModelError, OutOfDeviceMemory, PluginError, first_line, positive_int
from ..graph.model import Model
from ..plan.keep import checked_keep
from ..plan.partition import OrtStep, Plan, PluginStep, make_plan
from ..plan.precision import checked_keep_fp32, checked_precision, step_precisions
from ..registry import KERNEL_MEMBERS, Kernel, Plugin
from . import chunking
from .buffers import InPlace, assign_buffers
from .exact import ExactPath
from .executor import ChunkInputs, ChunkScheduler, PlanExecutor, Progress, Results, SharedRows
from .plan_record import record_plan
from .lanes import Chains, CudaLane, HostLane, Lane
from .prebuild import build_all, runtime_jobs
from .records import PlanRecord, Profile, RunResult, RunTiming
from .deferred_timings import DeferredTimings

# Streams working on chunks at once: one uploading, one computing, one downloading.
DEFAULT_STREAMS = 3


def _with_user_kernels(registry: dict[str, Plugin] | None, kernels: dict[str, Any] | None) -> dict[str, Plugin] | None:
    """The registry with the user's kernel sources (Runner's `kernels`) in place of their op types' plugins."""
    if not kernels:
        return registry
    from ..user_kernels import user_registry

    return user_registry(kernels, registry)


def _written_by(step: PluginStep | OrtStep) -> set[str]:
    nodes = [n.node for n in step.kernel_nodes] if isinstance(step, PluginStep) else step.nodes
    return {o for node in nodes for o in node.output if o}


def _declare(model: Model, ops: Sequence[Plugin] | None) -> None:
    """Give the model the custom ops' declarations (Runner's `ops`): its shape inference and plans read them."""
    if ops:
        from ..custom.functions import with_function_references
        from ..custom.loading import distinct

        model.declare(with_function_references(distinct(ops), model.original))


class Runner:
    """Runs one model on one device, plugins swapped in, at any batch size.

    `batch` is the largest batch you expect; kernels are chosen and timed at the
    chunk size it leads to. `device` is "auto" (the GPU when CuPy sees one),
    "cpu", "cuda" or a Device. `variants` names a variant per op type
    ({"Conv": "const_tile"}); `registry` replaces the registered plugins; `kernels`
    runs your own CUDA source per op type in place of its plugin ({"Conv": "my_conv.cu"},
    or a user_kernels.KernelSource; see `opplugin new conv FILE`). `ops` are custom ops'
    declarations (custom.CustomOp): their nodes run on their kernels, or their reference
    (one that declares a function of the model needs the model loaded with
    `load_model(path, keep_functions=custom.functions.function_ids(ops))`, else its calls are inlined).
    `chunk` fixes the images per chunk (default: from the free device memory and
    the pipeline's needs); `streams` the chunks in flight at once on a GPU
    (default 3). `cuda_graphs` (on by default; it needs a CUDA device and is ignored
    on the CPU) replays each run of plugin steps as one CUDA graph from the second pass
    on (graphs.py): far less host time per step at small batches. Each step keeps its own
    time, from events recorded inside the graph. A run that cannot be captured runs
    eagerly, and `graph_failures()` (and each RunResult) says why. `keep` names tensors a run
    may hand back (`run(feeds, keep=...)`) that a fused step would hide: the plan gives those
    fusions up (plan.fusions_given_up says which). `precision` ("fp32", the default and exact; "tf32", "fp16",
    "bf16") runs each step whose plugin has a kernel in that precision in it, chosen step by step
    (plan/precision.py), the rest in FP32; a variant in `variants` wins for its op type. "mixed" is FP16 but
    for the ONNX nodes of `keep_fp32` (node name in the file -> why it stays FP32, as
    `verify.mixed_precision.plan_mixed(...).keep_fp32()` gives them for a budget): each step that computes one
    stays FP32. Inputs and outputs keep the model's dtype; `plan_record()` says each step's precision, and why
    a step stays FP32.

    `run(feeds)` returns a RunResult, `profile(feeds)` a Profile of timed runs,
    and `plan_record(batch)` the plan as a PlanRecord: what report/timing.py and
    verify/check.py read.
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
        kernels: dict[str, Any] | None = None,
        cuda_graphs: bool = True,
        ops: Sequence[Plugin] | None = None,
        keep: Sequence[str] = (),
        precision: str = "fp32",
        keep_fp32: Mapping[str, str] | None = None,
    ):
        self.batch = positive_int(batch, "batch")
        self.precision = checked_precision(precision)
        self.keep_fp32 = checked_keep_fp32(self.precision, keep_fp32)  # before anything is planned or built
        _declare(model, ops)
        registry = _with_user_kernels(registry, kernels)
        if chunk is not None:
            chunk = positive_int(chunk, "chunk")
        self.device = device if isinstance(device, Device) else select_device(device)
        self.streams = positive_int(streams, "streams") if streams is not None else (DEFAULT_STREAMS if self.device.is_cuda else 1)
        self.cuda_graphs = bool(cuda_graphs) and self.device.is_cuda
        self.variants = dict(variants or {})
        self.layout = chunking.probe_layout(model)
        self._nodes = len(model.nodes)  # for the pipeline's host cost per chunk
        self.peak_image_bytes = chunking.peak_image_bytes(model, self.layout)
        self.plan, self.layout = self._make_plan(model, registry, chunk, tuple(keep))
        # each step's variant: the op type's --variant, else its plugin's for the precision, else its own choice
        self.step_precisions = step_precisions(self.plan, self.precision, self.variants, self.keep_fp32)
        self._channel_last = {name for step in self.step_precisions.values() for name in step.channel_last}
        self.chunk = self.plan.batch
        self.chunk_retries = 0  # times an out-of-memory halved the chunk

        self.providers = self._providers()
        # before any kernel is compiled: a model onnxruntime itself cannot run stops here (_refused)
        self.sessions = self._ort_sessions()
        # every kernel the plugins declare is compiled first, in parallel (prebuild.py)
        self.kernels: dict[str, Kernel] = build_all(self.plan.plugin_steps, self._build, self._compile_jobs,
                                                    runtime_jobs(self.device))
        self.constants = self._upload_constants()
        if self.device.is_cuda and self.layout.chunkable and chunk is None:
            self.chunk = min(self.chunk, self._chunk_for_workspaces())

        self.exact = ExactPath(self.plan, self.layout, self.device, self.kernels, self.constants, self.variants,
                               lambda step: self._session(step, [sessions.CPU_PROVIDER]),
                               frozenset(name for name, step in self.step_precisions.items() if step.channel_last))
        # producers write into their slices of Concat outputs (buffers.py)
        self.buffers = assign_buffers(self.plan, self.kernels, frozenset(self._channel_last))
        self.kernels = self.buffers.kernels(self.plan, self.kernels)  # the exact path keeps the plain Concats
        self.executor = PlanExecutor(self.plan, self.layout, self.kernels, self.sessions, self.constants, self.ort_on_gpu,
                                     self.exact.watched, self.cuda_graphs,
                                     InPlace(self.plan, self.layout, self.buffers, self.device.is_cuda))
        self._chains = Chains() if self.device.is_cuda else None
        self.scheduler = ChunkScheduler(self._lanes())
        self._timings = DeferredTimings(self.device.is_cuda)

    # --- set-up -------------------------------------------------------------------------

    def _build(self, step: PluginStep) -> Kernel:
        # whether the kernels run from CUDA graphs changes what a variant costs the host (ops/conv/cost.py)
        kernel = step.build(self.device, self.step_precisions[step.name].variant, graphed=self.cuda_graphs)
        if not isinstance(kernel, Kernel):
            raise PluginError(
                f"the {step.node.op_type} plugin built {type(kernel).__name__} for step {step.name}, which is not a Kernel "
                f"(it needs {', '.join(KERNEL_MEMBERS)}; subclass opplugin.registry.Kernel for the defaults of all but "
                "name, flops, bytes_moved and __call__)"
            )
        return kernel

    def _compile_jobs(self, step: PluginStep) -> Sequence[CompileJob]:
        return step.compile_jobs(self.device, self.step_precisions[step.name].variant, graphed=self.cuda_graphs)

    def _chunk_for(self, batch: int) -> int:
        """Images per chunk: what the memory budget allows, and on a GPU no more than overlap wants."""
        if not self.device.is_cuda:
            return min(batch, chunking.memory_chunk(chunking.HOST_CHUNK_BYTES, self.peak_image_bytes))
        budget = int(cuda.free_device_bytes() * chunking.DEVICE_MEMORY_SHARE / self.streams)
        by_memory = chunking.memory_chunk(budget, self.peak_image_bytes)
        return max(1, min(batch, by_memory, chunking.pipeline_chunk(batch, self.layout.input_image_bytes(), self._nodes)))

    def _chunk_for_workspaces(self) -> int:
        """The chunk, shrunk if the kernels' workspaces (im2col and the like) would not fit beside it."""

        def workspace(images: int) -> int:
            return sum(kernel.workspace_bytes(images) for kernel in self.kernels.values())

        if not workspace(self.chunk):
            return self.chunk
        budget = int(cuda.free_device_bytes() * chunking.DEVICE_MEMORY_SHARE / self.streams)
        return chunking.memory_chunk(budget, self.peak_image_bytes, workspace)

    def _make_plan(self, model: Model, registry: dict[str, Plugin] | None, chunk: int | None,
                   keep: tuple[str, ...]) -> tuple[Plan, chunking.BatchLayout]:
        """The plan at the batch it runs at (the chunk's where the model runs in chunks, else the whole
        batch's), and the layout checked against its steps. Whether the model runs in chunks depends on
        the tensors the plan's steps exchange: where one does not scale with the batch, the plan made
        at the chunk gives way to one at the whole batch."""
        if not self.layout.chunkable:
            return make_plan(model, self.batch, self.device, registry, keep=keep), self.layout
        plan_batch = min(self.batch, chunk or self._chunk_for(self.batch))
        plan = make_plan(model, plan_batch, self.device, registry, chunking.tensors_at(model, self.layout, plan_batch), keep)
        boundary = [n for step in plan.steps for n in [*step.inputs, *step.outputs]] + list(model.outputs)
        whole = set(model.initializers) | {i.name for i in model.inputs if i.name not in self.layout.batched_inputs}
        layout = chunking.check_steps(self.layout, boundary, whole)
        if layout.chunkable or plan_batch == self.batch:
            return plan, layout
        return make_plan(model, self.batch, self.device, registry, keep=keep), layout

    def _upload_constants(self) -> dict[str, Any]:
        """The weights feeding plugin steps, on the device once rather than on every run."""
        constants = {
            name: (cuda.to_device(value) if self.device.is_cuda else value)
            for step in self.plan.plugin_steps
            for name, value in step.node.constants.items()
        }
        if self.device.is_cuda:
            # the uploads ran on the default stream, which the lanes' streams do not wait for
            cuda.synchronize()
        return constants

    def _lanes(self) -> list[Lane]:
        if self._chains is None:
            return [HostLane(index) for index in range(self.streams)]
        device_id = cuda.device_id()
        return [CudaLane(device_id, self._chains, index) for index in range(self.streams)]

    def _providers(self) -> list:
        if self.device.is_cuda and sessions.has_cuda():
            return [sessions.cuda_provider(cuda.device_id()), sessions.CPU_PROVIDER]
        return [sessions.CPU_PROVIDER]

    @property
    def ort_on_gpu(self) -> bool:
        return self.providers[0] != sessions.CPU_PROVIDER

    def _ort_sessions(self) -> dict[str, ort.InferenceSession]:
        try:
            return {step.name: self._session(step) for step in self.plan.steps if isinstance(step, OrtStep)}
        except Exception as err:
            refused = self._refused(err)
            if refused is None:
                raise
            raise refused from None

    def _refused(self, err: BaseException, feeds: dict[str, np.ndarray] | None = None) -> ModelError | None:
        """A ModelError where onnxruntime failed in a step because it cannot run the model as loaded
        either (on `feeds` where given): the model's limit, said in one line, not ours. None where
        onnxruntime runs the model as loaded, or cannot run it for its custom ops, which opplugin runs."""
        model = self.plan.model
        functions = frozenset((f.domain, f.name) for f in model.original.functions)
        custom = any(known_ops.first_unknown(n, functions) is not None for n in model.original.graph.node)
        if custom or not sessions.is_onnxruntime_error(err):
            return None
        why = sessions.refusal(model.original, feeds)
        return None if why is None else ModelError(f"{model.name}: onnxruntime cannot run this model either: {why}")

    def _session(self, step: OrtStep, providers: list | None = None) -> ort.InferenceSession:
        return sessions.session(self._any_batch(step.model), providers or self.providers)

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

    # --- what it runs, as records ---------------------------------------------------------

    def plan_record(self, batch: int | None = None) -> PlanRecord:
        """The plan as plain data at `batch` (default: the runner's): each step's ops,
        implementation, tensors and cost, and the shape of every tensor crossing a step."""
        batch = self.batch if batch is None else positive_int(batch, "batch")
        return record_plan(self.plan, batch, layout=self.layout, peak_image_bytes=self.peak_image_bytes, chunk=self.chunk,
                           ort_on_gpu=self.ort_on_gpu, kernels=self.kernels, precision=self.precision,
                           precisions=self.step_precisions)

    def memory(self) -> dict[str, int]:
        """Device and pinned memory figures (zeros on the CPU), and this runner's staging buffers."""
        figures = cuda.memory_figures() if self.device.is_cuda else {}
        figures["staging_bytes"] = sum(lane.staging_bytes() for lane in self.scheduler.lanes)
        return figures

    def _graph_steps(self, spans: list) -> dict[str, tuple[str, ...]]:
        """Span name -> plan steps, for the graphs these spans replayed."""
        if not self.cuda_graphs:
            return {}
        named = {name: steps for lane in self.scheduler.lanes for name, steps in lane.graphs.named_steps().items()}
        return {span.name: named[span.name] for span in spans if span.name in named}

    def graph_failures(self) -> dict[str, str]:
        """Runs of plugin steps that could not be captured as CUDA graphs: first step -> why."""
        return {self.plan.steps[first].name: why
                for lane in self.scheduler.lanes for (first, _rows, _kept), why in lane.graphs.failures().items()}

    def chunks_for(self, batch: int) -> int:
        """How many chunks a run of `batch` images takes now."""
        return len(self._chunks_of(batch))

    def _chunks_of(self, batch: int) -> list[slice]:
        """The row ranges a run of `batch` images takes now: one piece for a model that cannot be chunked."""
        return chunking.run_rows(batch, self.chunk, self.device.is_cuda) if self.layout.chunkable else [slice(0, batch)]

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

    def check_keep(self, keep: Sequence[str], what: str = "cannot keep", linked_too: bool = False) -> None:
        """InputError, starting with `what`, unless every name of `keep` is a tensor a run can hand
        back: a graph input, or a tensor that leaves a step (the others live inside one kernel: a
        Runner made with `keep` naming them plans no step that hides them), and not one the steps
        exchange channel-last in 16 bits unless `linked_too` (run's `as_stored`)."""
        if not keep:  # every run asks: the common case costs nothing
            return
        checked_keep(self.plan.model, keep, what)  # why a name is no tensor of the graph at all
        crossing = {value.name for value in self.plan.model.inputs} | {name for step in self.plan.steps for name in step.outputs}
        hidden = [name for name in keep if name not in crossing]
        linked = None if linked_too else next((name for name in keep if name in self._channel_last), None)
        if linked is not None:
            raise InputError(f"{what} {linked}: it goes between steps channel-last in {self.precision}, as no tensor the model "
                             f"has; a Runner made with keep=({linked!r},) keeps it as the model has it")
        if hidden:
            inside = next((f"inside step {step.name}" for step in self.plan.steps if hidden[0] in _written_by(step)),
                          "in no step: nothing the model outputs reads it")
            raise InputError(f"{what} {hidden[0]}: it lives {inside}; a Runner made with keep=({hidden[0]!r},) "
                             f"plans every step so that a run can hand it back")

    # --- running ------------------------------------------------------------------------

    def run(self, feeds: dict[str, np.ndarray], keep: tuple[str, ...] = (), progress: Progress | None = None,
            *, step_times: bool = False, into: SharedRows | None = None, as_stored: bool = False) -> RunResult:
        """One pass over the batch (any size). Returns host copies of the graph outputs and of `keep`.
        `progress(label, images_done, images)` is called as chunks finish. Untimed by default, as
        quick as it gets: CUDA graphs replay without the events that time each step (graphs.py),
        so their steps get no rows and each replay is one span of kind GRAPH, and the copies are
        not timed. `step_times` asks for every step's and copy's time (what `profile` reads). `into` puts the outputs in rows of arrays that other runs fill too
        (DeviceRunners); the result's outputs are then views of those rows. `as_stored` hands a kept tensor back as the
        steps exchange it, one linked channel-last in 16 bits too (uint16 [N, H, W, C]: what `profile` feeds a kernel
        again); without it such a tensor is refused."""
        started = time.perf_counter()
        batch = self.check_feeds(feeds)
        self.check_keep(keep, linked_too=as_stored)
        feeds = {name: np.ascontiguousarray(value) for name, value in feeds.items()}
        while True:
            chunks = self._chunks_of(batch)
            try:
                return self._run_chunks(feeds, batch, chunks, tuple(keep), progress, step_times, into, started)
            except Exception as err:
                if not cuda.is_out_of_memory(err):
                    refused = self._refused(err, feeds)
                    if refused is None:
                        raise
                    raise refused from None
                self._after_out_of_memory()
                if not self.layout.chunkable or self.chunk == 1:
                    raise self._out_of_memory_error(batch, err) from None
                self.chunk = max(1, self.chunk // 2)
                self.chunk_retries += 1

    def _after_out_of_memory(self) -> None:
        if self.device.is_cuda:
            cuda.synchronize()
            for lane in self.scheduler.lanes:
                lane.graphs.clear()  # their memory pools go with them
                lane.prebound.clear()
            cuda.release_cached_memory()

    def _out_of_memory_error(self, batch: int, err: BaseException) -> OutOfDeviceMemory:
        where = "device" if self.device.is_cuda else "host"
        cause = first_line(err)
        if not self.layout.chunkable:
            return OutOfDeviceMemory(f"out of {where} memory at batch {batch}, and this model cannot run in chunks "
                                     f"because {self.layout.unchunkable}: {cause}")
        return OutOfDeviceMemory(f"out of {where} memory even with chunks of 1 image "
                                 f"(about {self.peak_image_bytes} bytes per image live): {cause}")

    def _run_chunks(self, feeds: dict[str, np.ndarray], batch: int, chunks: list[slice], keep: tuple[str, ...],
                    progress: Progress | None, step_times: bool, into: SharedRows | None, started: float) -> RunResult:
        on_gpu = self.device.is_cuda
        pinned = {name: on_gpu and cuda.is_pinned(value) for name, value in feeds.items()}
        single = len(chunks) == 1
        outputs = into if into is not None else Results(batch, self.layout.chunkable, single)
        flags = self.exact.flags(len(chunks))  # reset on the caller's stream, ahead of the timeline's origin
        timeline, earlier = self._timings.start(self.scheduler.lanes)
        inputs = ChunkInputs(feeds, pinned, keep, outputs, Results(batch, self.layout.chunkable, single), flags, step_times, earlier)
        if self._chains:
            self._chains.reset(min(len(self.scheduler.lanes), len(chunks)))
        self.scheduler.run(
            chunks, lambda lane, index, rows: self.executor.run_chunk(lane, timeline, index, rows, inputs), progress
        )
        flagged = inputs.flags.raised() if inputs.flags else []
        exact_started = time.perf_counter()
        if flagged:
            self.exact.rerun(self.scheduler, inputs, chunks, flagged)
        exact_ms = (time.perf_counter() - exact_started) * 1e3 if flagged else 0.0
        batched = [name for name in feeds if name in self.layout.batched_inputs] or list(feeds)
        placed = outputs.arrays  # a SharedRows makes its views on each reading
        result = RunResult(
            outputs={name: placed[name] for name in self.plan.model.outputs},
            kept={name: inputs.kept.arrays[name] for name in keep},
            total_ms=0.0,
            batch=batch,
            chunks=len(chunks),
            chunk_size=max(c.stop - c.start for c in chunks),
            streams=min(len(self.scheduler.lanes), len(chunks)),
            input_pinned=all(pinned[name] for name in batched),
            exact_reruns=len(flagged),
            exact_ms=exact_ms,
            graph_failures=self.graph_failures() if self.cuda_graphs else {},
            timing=RunTiming(timeline.spans, self._graph_steps),
        )
        result.total_ms = (time.perf_counter() - started) * 1e3
        return result

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
        the label says "warm-up" or "timed run".

        With CUDA graphs, each pass is two runs: one whose graphs replay without step events,
        which gives the host-to-host time (and each replay's own), then one whose graphs time
        every step, which gives the step table. Eagerly, one run gives both."""
        repeat = positive_int(repeat, "repeat")
        warmup = positive_int(warmup, "warm-up", allow_zero=True)
        batch = self.check_feeds(feeds)
        passes = warmup + repeat
        runs = 2 if self.cuda_graphs else 1  # runs per pass
        profile = None
        for number in range(passes):
            label = "warm-up" if number < warmup else "timed run"

            def report(_label: str, done: int, total: int, offset: int = number * batch * runs, label: str = label) -> None:
                if progress:
                    progress(label, offset + done, passes * batch * runs)

            wall = None
            if runs == 2:
                wall = self.run(feeds, (), report)
                report = functools.partial(report, offset=(number * runs + 1) * batch)
            result = self.run(feeds, keep if number >= warmup else (), report, step_times=True)
            if number < warmup:
                continue
            if profile is None:
                profile = Profile(self.plan_record(batch), result)
            profile.add(result, wall)
        return profile
