"""`opplugin plan`: how the model splits into plugin and onnxruntime steps, and what the
--kernel files do with their nodes."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..custom.offline import compile_cuda_sources
from ..plan.keep import checked_keep
from ..plan.partition import make_plan
from ..report.plan import build_plan_report, format_plan
from ..runtime.plan_record import record_plan_alone
from .file_guard import CommandFiles
from .kernel_tools.cli_support import compile_user_kernels, plan_lines, user_registry_for
from .loading import load
from .options import DataOptions, KernelOptions, ModelOptions, ReportOptions, RunnerOptions
from .output import write_json


@dataclass(frozen=True)
class PlanOptions:
    model: ModelOptions
    runner: RunnerOptions
    kernels: KernelOptions
    reports: ReportOptions
    data: DataOptions = DataOptions()  # the user's inputs (their sizes) and --keep

    def files(self) -> CommandFiles:
        return CommandFiles(self.reports.outputs(), (self.model.model,), self.kernels.paths, self.model.ops,
                            self.data.load_inputs, self.data.images)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ModelOptions.add(parser, "images per run (default: the model's own fixed batch, else 1)")
    RunnerOptions.add(parser, runs=False)  # a plan is the same whatever the chunk, streams and CUDA graphs; --precision changes it
    DataOptions.add(parser, runs=False)  # the user's inputs fix the model's free sizes; --keep gives fusions up
    KernelOptions.add(parser)
    ReportOptions.add(parser, "also write the plan as JSON (- for standard output)", wide=True)


def read(args: argparse.Namespace) -> PlanOptions:
    return PlanOptions(ModelOptions.from_args(args), RunnerOptions.from_args(args), KernelOptions.from_args(args),
                       ReportOptions.from_args(args), DataOptions.from_args(args, runs=False))


def execute(options: PlanOptions) -> int:
    loaded = load(options.model, options.runner.device, data=options.data, free_batch_default=1)
    keep = checked_keep(loaded.model, options.data.keep, "--keep")
    registry = user_registry_for(options.kernels.by_op)
    plan = make_plan(loaded.model, loaded.batch, loaded.device, registry, keep=keep)
    uses = compile_user_kernels(plan, registry)  # compiles the --kernel files: their errors come before any output
    custom = [] if loaded.device.is_cuda else compile_cuda_sources(plan)  # and a custom op's CUDA files, without a GPU
    record = record_plan_alone(plan, options.runner.variants, options.runner.precision)
    print(format_plan(record, options.reports.wide))
    if uses:
        print("\n".join(plan_lines(plan, registry, uses)))
    if custom:
        print("\nCustom ops' CUDA kernels:\n" + "\n".join(f"  {line}" for line in custom))
    if options.reports.json:
        write_json(options.reports.json, build_plan_report(record, [use.as_json() for use in uses]))
    return 0
