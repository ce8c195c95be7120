"""What run and check share: their options for the model, the runner, the data and the
user's kernels (a Workload), and the set-up before their own work: --sanitize and --watch
(kernel_loops), then the model loaded, the inputs, under --precision mixed the nodes its
--budget keeps in FP32 (found on those inputs), and its runner or a runner per --devices
slot (prepare)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from typing import Sequence

from ..custom.offline import compile_cuda_sources
from ..errors import InputError
from ..plan.keep import checked_keep
from ..plan.partition import make_plan
from ..plan.precision import MIXED, nodes_in_fp32_anyway
from ..registry import node_key
from ..inputs.feeds import Inputs, make_inputs
from ..runtime import Runner
from ..runtime.multi_device import DeviceRunners, cuda_slots
from .budget import BudgetSearch, search_budget
from .file_guard import CommandFiles
from .kernel_tools.cli_support import compile_without_gpu, declared_files, sanitize_kernels, say_cpu_note, user_registry_for, watch_kernels
from .loading import Loaded, load
from .options import DEFAULT_BATCH, DataOptions, KernelOptions, ModelOptions, Outputs, RunnerOptions, ToleranceOptions


@dataclass(frozen=True)
class Workload:
    """The options run and check both take: the model, the runner's settings, the data and
    the user's kernels."""

    model: ModelOptions
    runner: RunnerOptions
    data: DataOptions
    kernels: KernelOptions

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, precision: bool = True) -> None:
        """`precision`: --precision is the runner's (run); check has a --precision of its own."""
        ModelOptions.add(parser, f"images per run (default: {DEFAULT_BATCH})")
        RunnerOptions.add(parser, devices=True, precision=precision)
        DataOptions.add(parser)
        KernelOptions.add(parser, loops=True)

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, single_device: Sequence[str] = ()) -> Workload:
        """`single_device`: the command's own flags given that follow one device, as --sanitize
        and --watch do (run's --trace): with --devices, an InputError names them."""
        workload = cls(ModelOptions.from_args(args), RunnerOptions.from_args(args), DataOptions.from_args(args),
                       KernelOptions.from_args(args))
        kernels = workload.kernels
        alone = [*single_device, *(flag for flag, given in (("--sanitize", kernels.sanitize), ("--watch", kernels.watch)) if given)]
        if workload.runner.devices is not None and alone:
            raise InputError(f"{' and '.join(alone)} follow{'s' if len(alone) == 1 else ''} a single device; leave out --devices")
        if (kernels.sanitize or kernels.watch) and not kernels.files and not workload.model.ops:
            raise InputError("--sanitize and --watch need --kernel OP=FILE.cu or --ops FILE.py")
        return workload

    def files(self, reports: Outputs) -> CommandFiles:
        """The files the command reads, and those it writes: `reports`, then --save-outputs."""
        return CommandFiles(reports + self.data.outputs(), (self.model.model,), self.kernels.paths, self.model.ops,
                            self.data.load_inputs, self.data.images)


@dataclass(frozen=True)
class Prepared:
    """What run and check work on: the loaded model, its runner (with --devices, the first
    device's), the runners of --devices (None without it), the inputs, and under --precision
    mixed what its budget keeps in FP32."""

    loaded: Loaded
    runner: Runner
    devices: DeviceRunners | None
    inputs: Inputs
    budget: BudgetSearch | None = None


def kernel_loops(workload: Workload, tolerance: ToleranceOptions, *, poison: bool) -> int | None:
    """--sanitize runs first; --watch takes the place of the command's single pass: its exit
    status (None: go on with the command)."""
    kernels = workload.kernels
    if kernels.sanitize:
        sanitize_kernels(workload.model.model, kernels.by_op, workload.model.ops)
    if not kernels.watch:
        return None
    return watch(workload, tolerance, poison=poison)


def watch(workload: Workload, tolerance: ToleranceOptions, *, poison: bool, cycles: int | None = None, say=None) -> int:
    """--watch on the workload's model, batch and inputs (`cycles` saves of the kernel files; None: until Ctrl-C)."""
    loaded = _load(workload)
    inputs = _inputs(workload.data, loaded, pinned=loaded.device.is_cuda)
    files = {**declared_files(loaded.model), **workload.kernels.by_op}
    if not files:
        raise InputError(f"--watch: no --kernel file, and no declaration of --ops with a CUDA C file, has a node in {loaded.model.name}")
    budget = _search_budget(workload, loaded, inputs)  # once: a saved kernel file changes no node's FP16 error
    return watch_kernels(tolerance, loaded.model, loaded.device, loaded.batch,
                         lambda: make_runner(workload, loaded, poison=poison, budget=budget), files, inputs, cycles=cycles, say=say)


def prepare(workload: Workload, *, poison: bool) -> Prepared:
    """The model loaded, the inputs, under --precision mixed the nodes its budget keeps in FP32 (on
    those inputs), and a runner (or one per --devices slot, each for its share of the batch);
    `poison` fills the user kernels' outputs with NaN before each call (check)."""
    slots = device_slots(workload.runner)
    loaded = _load(workload)
    checked_keep(loaded.model, workload.data.keep, "--keep")  # before any kernel compiles
    for what, names in loaded.model.simplification.kept_from.items():  # plan says it in its header
        print(f"Not done at load, for the kept {', '.join(names)}: {what}", file=sys.stderr)
    # on a GPU the data lands in pinned memory, so the run copies it by DMA without staging
    inputs = _inputs(workload.data, loaded, pinned=loaded.device.is_cuda)
    budget = _search_budget(workload, loaded, inputs)  # before any kernel is built: it decides their precision
    devices = _make_devices(workload, loaded, slots, poison=poison, budget=budget) if slots else None
    runner = devices.runners[0] if devices else make_runner(workload, loaded, poison=poison, budget=budget)
    runner.check_keep(workload.data.keep, "--keep")  # before the run starts
    return Prepared(loaded, runner, devices, inputs, budget)


def _search_budget(workload: Workload, loaded: Loaded, inputs: Inputs) -> BudgetSearch | None:
    """Under --precision mixed, the nodes its --budget keeps in FP32, found on the run's own inputs among those the
    run's plan can lower (a plan made for that alone: the runner makes its own); else None."""
    if workload.runner.precision != MIXED:
        return None
    keep = checked_keep(loaded.model, workload.data.keep, "--keep")
    plan = make_plan(loaded.model, loaded.batch, loaded.device, user_registry_for(workload.kernels.by_op), keep=keep)
    return search_budget(loaded.model, inputs.feeds, workload.runner.budget, nodes_in_fp32_anyway(plan, workload.runner.variants))


def load_with_inputs(workload: Workload, default_batch: int | None = None) -> tuple[Loaded, Inputs]:
    """The model loaded and the inputs, without a runner: for work that runs no plan (check --precision).
    `default_batch`: the images to make without --batch, where the model's default would be more."""
    loaded = _load(workload)
    if default_batch is not None and workload.model.batch is None and loaded.feeds is None:
        loaded = replace(loaded, batch=min(loaded.batch, default_batch))
    return loaded, _inputs(workload.data, loaded, pinned=False)


def _load(workload: Workload) -> Loaded:
    return load(workload.model, workload.runner.device, cuda_graphs=workload.runner.cuda_graphs, streams=workload.runner.streams,
                data=workload.data)


def device_slots(runner: RunnerOptions):
    """--devices as the device slots of a split run; None without it (the single-runner path)."""
    return None if runner.devices is None else cuda_slots(runner.devices)


def make_runner(workload: Workload, loaded: Loaded, *, poison: bool = False, budget: BudgetSearch | None = None) -> Runner:
    """A runner of a loaded model, with the flags' variant, precision (under mixed, `budget`'s nodes kept
    in FP32), chunk, streams and kernels; without a GPU the --kernel sources are compiled all the same
    (NVRTC alone), so their errors show here too."""
    settings = workload.runner
    registry = user_registry_for(workload.kernels.by_op, poison=poison)
    if poison:
        poison_custom_ops(loaded.model)
    unknown = sorted(set(settings.variants or {}) - {node_key(n) for n in loaded.model.nodes} - {"Conv"})
    if unknown:  # before any kernel is built
        raise InputError(f"--variant names {unknown[0]}, which no node of {loaded.model.name} is")
    runner = Runner(loaded.model, loaded.batch, loaded.device, settings.variants, registry, chunk=settings.chunk,
                    streams=settings.streams, cuda_graphs=settings.cuda_graphs is not False, keep=workload.data.keep,
                    precision=settings.precision, keep_fp32=budget.keep_fp32 if budget is not None else None)
    if registry is not None and not runner.device.is_cuda:
        compile_without_gpu(runner.plan, registry)
        say_cpu_note(registry, runner.device)
    if not runner.device.is_cuda:
        compile_cuda_sources(runner.plan)  # a custom op's CUDA file with an error stops the command here too
    return runner


def poison_custom_ops(model) -> None:
    """The model's custom ops, their kernels' outputs poisoned with NaN (check's setting)."""
    from ..custom import CustomOp

    model.declare([op.poisoned() for op in model.declarations.values() if isinstance(op, CustomOp) and not op.poison])


def _make_devices(workload: Workload, loaded: Loaded, slots, *, poison: bool, budget: BudgetSearch | None) -> DeviceRunners:
    """A runner per --devices slot, each of the flags' kind, built on its own device for its share of the batch."""
    return DeviceRunners(loaded.model, slots,
                         lambda slot, share: make_runner(workload, replace(loaded, device=slot.device(), batch=share), poison=poison,
                                                         budget=budget),
                         loaded.batch)


def _inputs(data: DataOptions, loaded: Loaded, pinned: bool) -> Inputs:
    """The run's feeds: the user's own, else the bundled test set or random data (--data)."""
    if loaded.feeds is not None:
        return Inputs(loaded.feeds, None, loaded.source, pinned)
    return make_inputs(loaded.model, loaded.batch, data.source, data.seed, pinned=pinned)
