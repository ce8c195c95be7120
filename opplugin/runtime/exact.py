"""The exact path for NaN and Inf: which chunks of a run saw them after a fused
plugin step, and running those chunks again without the fusion.

A fused Conv > activation > MaxPool kernel propagates NaN and +inf through its
pool windows (see ops/conv/epilogue.py), but onnxruntime's MaxPool keeps or
drops a NaN depending on where it sits in the window, a rule no fixed kernel
can copy (nor can a MaxPool or GlobalMaxPool plugin step of its own: those are
watched too). So every watched output gets one flag per chunk, set on the device by a
single reduction on the chunk's stream (no host wait), and read once, after the
run has finished anyway. A chunk with a flag set runs again on the exact path:
the same plan with each fused step split into its plugin's node alone and
onnxruntime's own nodes for the rest, and each max pool step given to onnxruntime
whole, on onnxruntime's CPU provider (the
reference `check` uses; its CUDA provider's pooling has NaN rules of its own).
Its results replace the chunk's. Finite inputs never take it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import onnxruntime as ort

from ..gpu import cuda
from ..gpu.device import Device
from ..errors import PluginError
from ..plan.partition import OrtStep, Plan, PluginStep, Step, outside_inputs, sub_model
from ..registry import Kernel
from .chunking import BatchLayout
from .executor import ChunkInputs, ChunkScheduler, PlanExecutor
from .nonfinite import raise_flag, set_flag
from .timeline import Timeline


class NonFiniteFlags:
    """flags[chunk, slot]: did watched output `slot` of this chunk hold a NaN or an Inf?

    On a device, each lane sends its chunk's row home (`send_home`) into page-locked memory at
    the end of the chunk, on its stream, so that reading them after the run (`raised`) waits
    for nothing more. A runner keeps one set per chunk count and clears it for each run (`clear`)."""

    def __init__(self, chunks: int, slots: int, on_device: bool):
        self.on_device = on_device
        self.slots = slots
        if on_device:
            import cupy

            self._flags = cupy.zeros((chunks, slots), dtype=cupy.bool_)
            self._home = cuda.pinned_empty((chunks, slots), np.bool_)
            self._home[...] = False
            # the runtime's own calls on raw addresses: a run at batch 1 feels each CuPy view it makes
            self._runtime = cupy.cuda.runtime
            self._device_at = self._flags.data.ptr
            self._home_at = self._home.ctypes.data
        else:
            self._flags = np.zeros((chunks, slots), dtype=bool)

    def clear(self) -> None:
        """Every flag down for a new run. On a device, zeroed on the current stream, ahead of the origin
        of the run's Timeline, which every lane's stream waits for before its first chunk, so a flag is
        only ever set after it; the host's copies are zeroed now (the last run's lanes have finished)."""
        if self.on_device:
            import cupy

            self._runtime.memsetAsync(self._device_at, 0, self._flags.nbytes, cupy.cuda.get_current_stream().ptr)
            self._home.fill(False)
        else:
            self._flags[...] = False

    def send_home(self, chunk: int) -> None:
        """Copy this chunk's flags to the host, on the current stream (the chunk's lane's), after its work."""
        if self.on_device:
            import cupy

            offset = chunk * self.slots
            self._runtime.memcpyAsync(self._home_at + offset, self._device_at + offset, self.slots,
                                      self._runtime.memcpyDeviceToHost, cupy.cuda.get_current_stream().ptr)

    def address(self, chunk: int, slot: int) -> int:
        """The device byte of this flag, for a kernel that raises it as it stores (Kernel.flags_nonfinite); 0 on the host."""
        return self._flags.data.ptr + chunk * self.slots + slot if self.on_device else 0

    def record(self, chunk: int, slot: int, value: Any) -> None:
        """Flag this output; on a device, enqueued on the current stream."""
        if isinstance(value, np.ndarray) or not self.on_device:
            self._flags[chunk, slot] = not bool(np.isfinite(np.asarray(value)).all())
        elif value.dtype == np.float32 and value.flags.c_contiguous:  # the usual case: one launch, no view
            set_flag(self._flags.data.ptr + chunk * self.slots + slot, value)
        else:
            raise_flag(self._flags[chunk, slot], value)

    def copy_in(self, chunk: int, runs: Sequence[tuple[int, int, int]], source: Any) -> None:
        """flags[chunk, slot:slot + count] = source[at:at + count] for each (slot, at, count) of `runs`
        (nonfinite.slot_runs), from a device bool array written by a CUDA graph, on the current stream."""
        import cupy

        stream, row, base = cupy.cuda.get_current_stream().ptr, self._device_at + chunk * self.slots, source.data.ptr
        for slot, at, count in runs:
            self._runtime.memcpyAsync(row + slot, base + at, count, self._runtime.memcpyDeviceToDevice, stream)

    def raised(self) -> list[int]:
        """The chunks with any flag set. On a device, call once every chunk's stream has finished
        (after each chunk sent its row home)."""
        flags = self._home if self.on_device else self._flags
        if not flags.any():  # the usual answer, in a third of the time
            return []
        return [int(i) for i in np.flatnonzero(flags.any(axis=1))]


# op types whose onnxruntime kernels keep or drop a NaN by its place in the window (or the row): no fixed rule matches them
NAN_BY_POSITION = frozenset({"MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"})


def watched_steps(plan: Plan, kernels: dict[str, Kernel]) -> set[str]:
    """The plugin steps whose outputs are watched: those the exact path runs differently
    (see reruns_differently)."""
    return {step.name for step in plan.plugin_steps if reruns_differently(step, kernels[step.name], plan.device)}


def reruns_differently(step: PluginStep, kernel: Kernel, device: Device) -> bool:
    """Whether the exact path runs this step otherwise than `kernel`: a max pool step
    (NAN_BY_POSITION) goes to onnxruntime, and a kernel that is not NaN/Inf-exact
    (Kernel.nonfinite_exact) is split from its fused followers, or where it fused none gives
    way to the variant its plugin names for NaN and Inf (`nonfinite_exact_variant`: 3xTF32).
    A plain kernel with nothing to give way to would run the same again: not worth watching."""
    if step.node.op_type in NAN_BY_POSITION:
        return True
    if kernel.nonfinite_exact:
        return False
    return bool(step.fused or step.prologue) or step.plugin.nonfinite_exact_variant(step.node, device) is not None


def watched_outputs(plan: Plan, kernels: dict[str, Kernel]) -> dict[int, list[int]]:
    """Step index -> the flag columns of its outputs, for every watched step (see watched_steps)."""
    names = watched_steps(plan, kernels)
    watched: dict[int, list[int]] = {}
    for index, step in enumerate(plan.steps):
        if step.name in names:
            first = sum(len(slots) for slots in watched.values())
            watched[index] = list(range(first, first + len(step.outputs)))
    return watched


def split_fused(plan: Plan) -> Plan:
    """The same plan with every fused plugin step split back into its own node (a
    plugin step without epilogue, same name) followed by an onnxruntime step that
    runs the nodes it had fused, and every max pool step (NAN_BY_POSITION) given to
    onnxruntime whole. Other steps are shared (a watched one gets another kernel, see
    ExactPath._exact_kernel)."""
    steps: list[Step] = []
    for step in plan.steps:
        # a group step (registry.GroupPlugin) stays whole: its kernel follows onnxruntime's NaN and Inf or is watched as one
        if not isinstance(step, PluginStep) or step.group is not None or not (step.fused or step.prologue or step.node.op_type in NAN_BY_POSITION):
            steps.append(step)
            continue
        if step.views:  # the layout nodes the kernel read through as views run first, on onnxruntime
            operands = list(dict.fromkeys(view.operand for view in step.views.values()))
            steps.append(_ort_step(plan, f"{step.name} views", [info.node for info in step.view_nodes], operands))
        if step.prologue:  # the nodes the kernel applied to its input run first, on onnxruntime
            steps.append(_ort_step(plan, f"{step.name} prologue", [info.node for info in step.prologue], [step.node.node.input[0]]))
            if not step.fused and step.node.op_type not in NAN_BY_POSITION:
                steps.append(PluginStep(step.name, step.node, step.plugin, list(step.node.node.input), list(step.outputs)))
                continue
        if step.node.op_type in NAN_BY_POSITION:
            nodes = [step.node.node, *(info.node for info in step.fused)]
            inputs = outside_inputs(nodes, plan.model)
            sub = sub_model(plan.model, f"{plan.model.name}_{step.name}_exact", nodes, inputs, list(step.outputs), plan.tensors)
            steps.append(OrtStep(f"{step.name} on onnxruntime", nodes, inputs, list(step.outputs), sub))
            continue
        own_outputs = [o for o in step.node.node.output if o]
        steps.append(PluginStep(step.name, step.node, step.plugin, list(step.node.node.input), own_outputs))
        nodes = [info.node for info in step.fused]
        inputs = outside_inputs(nodes, plan.model)
        sub = sub_model(plan.model, f"{plan.model.name}_{step.name}_epilogue", nodes, inputs, list(step.outputs), plan.tensors)
        steps.append(OrtStep(f"{step.name} epilogue", nodes, inputs, list(step.outputs), sub))
    return Plan(plan.model, plan.batch, plan.device, steps, plan.tensors, dict(plan.fallbacks))


def _ort_step(plan: Plan, name: str, nodes: list, outputs: list[str]) -> OrtStep:
    inputs = outside_inputs(nodes, plan.model)
    sub = sub_model(plan.model, f"{plan.model.name}_{name.replace(' ', '_')}", nodes, inputs, outputs, plan.tensors)
    return OrtStep(name, nodes, inputs, outputs, sub)


class ExactPath:
    """Flags for a run of `plan`, and the rerun of flagged chunks. The split plan's
    kernels and sessions are built when a chunk first needs them; kernels of steps
    that fused nothing are the fast plan's own."""

    def __init__(
        self,
        plan: Plan,
        layout: BatchLayout,
        device: Device,
        kernels: dict[str, Kernel],
        constants: dict[str, Any],
        requested_variants: dict[str, str],
        cpu_session: Callable[[OrtStep], ort.InferenceSession],
        linked_steps: frozenset[str] = frozenset(),
    ):
        """`linked_steps`: the steps whose kernels read or write a tensor channel-last in 16 bits (plan/channel_last.py)."""
        self.plan, self.layout, self.device = plan, layout, device
        self.kernels, self.constants = kernels, constants
        self.requested_variants, self.cpu_session = requested_variants, cpu_session
        self.linked_steps = linked_steps
        self.watched = watched_outputs(plan, kernels)
        self._columns = sum(len(slots) for slots in self.watched.values())
        self._executor: PlanExecutor | None = None
        self._flags: dict[int, NonFiniteFlags] = {}  # by chunk count, reused run after run

    @property
    def built(self) -> bool:
        return self._executor is not None

    def flags(self, chunks: int) -> NonFiniteFlags | None:
        """Flags for a run of `chunks` chunks, all down; None when no step is watched."""
        if not self._columns:
            return None
        flags = self._flags.get(chunks)
        if flags is None:
            flags = self._flags[chunks] = NonFiniteFlags(chunks, self._columns, self.device.is_cuda)
        else:
            flags.clear()
        return flags

    def rerun(self, scheduler: ChunkScheduler, inputs: ChunkInputs, chunks: list[slice], flagged: list[int]) -> None:
        """Runs the flagged chunks again; their rows of the outputs and kept tensors
        are overwritten. Its timings are not step times of the plan."""
        executor = self.split_executor()
        again = dataclasses.replace(inputs, flags=None)
        timeline = Timeline(self.device.is_cuda)
        scheduler.run(
            [chunks[i] for i in flagged],
            lambda lane, position, rows: executor.run_chunk(lane, timeline, flagged[position], rows, again),
        )

    def split_executor(self) -> PlanExecutor:
        """The executor of the split plan (see split_fused), built at the first call."""
        if self._executor is None:
            split = split_fused(self.plan)
            kernels = {step.name: self._exact_kernel(step) for step in split.plugin_steps}
            sessions = {step.name: self.cpu_session(step) for step in split.steps if isinstance(step, OrtStep)}
            if self.device.is_cuda:
                cuda.synchronize()  # a kernel build may upload constants on the default stream
            self._executor = PlanExecutor(split, self.layout, kernels, sessions, self.constants, ort_on_gpu=False)
        return self._executor

    def _exact_kernel(self, step: PluginStep) -> Kernel:
        """The fast plan's kernel when its step fused nothing and would run the same on the
        exact path (see reruns_differently); else the same variant built without the followers
        (the plugin's own choice if it cannot be), and where that kernel does not keep NaN and
        Inf either (3xTF32), the variant its plugin names for them (`nonfinite_exact_variant`).
        A linked step's kernel reads or writes tensors channel-last in 16 bits, and every tensor of
        the exact path is FP32 as the model has it: neither that kernel nor its variant is used;
        the step is built from the op's --variant, else its plugin's own choice."""
        kernel = self.kernels[step.name]
        linked = step.name in self.linked_steps
        was_fused = any(s.name == step.name and (s.fused or s.prologue) and s.group is None for s in self.plan.plugin_steps)
        if not linked and not was_fused and not reruns_differently(step, kernel, self.device):
            return kernel
        requested = self.requested_variants.get(step.node.op_key)
        variant = requested if linked else kernel.variant or requested
        try:
            built = step.build(self.device, variant)
        except PluginError:
            if variant == requested:
                raise
            built = step.build(self.device, requested)
        if built.nonfinite_exact:
            return built
        exact_variant = step.plugin.nonfinite_exact_variant(step.node, self.device)
        return built if exact_variant is None else step.build(self.device, exact_variant)
