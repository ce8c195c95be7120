"""`opplugin plan`: how the model splits into plugin and onnxruntime steps, and what the
--kernel files do with their nodes. Under --precision mixed, the budget is searched on the
images a run would measure it on (cli/budget.py), so the plan shows the precisions a run gets."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..custom.offline import compile_cuda_sources
from ..graph.model import choose_batch
from ..inputs.feeds import make_inputs
from ..plan.keep import checked_keep
from ..plan.partition import Plan, make_plan
from ..plan.precision import MIXED, nodes_in_fp32_anyway
from ..report.plan import build_plan_report, format_plan
from ..runtime.plan_record import record_plan_alone
from .budget import PRECISION_IMAGES, BudgetSearch, search_budget
from .file_guard import CommandFiles
from .kernel_tools.cli_support import compile_user_kernels, plan_lines, user_registry_for
from .loading import Loaded, load
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
    budget = _search_budget(options, loaded, plan)  # after every quick error: the search takes a while
    record = record_plan_alone(plan, options.runner.variants, options.runner.precision, budget.keep_fp32 if budget else None)
    budget_json = budget.as_json() if budget else None
    print(format_plan(record, options.reports.wide, budget_json))
    if uses:
        print("\n".join(plan_lines(plan, registry, uses)))
    if custom:
        print("\nCustom ops' CUDA kernels:\n" + "\n".join(f"  {line}" for line in custom))
    if options.reports.json:
        write_json(options.reports.json, build_plan_report(record, [use.as_json() for use in uses], budget_json))
    return 0


def _search_budget(options: PlanOptions, loaded: Loaded, plan: Plan) -> BudgetSearch | None:
    """Under --precision mixed, the nodes its --budget keeps in FP32, found on the images a run of the same flags
    measures: the user's inputs, else the first of the run's default data (bundled or random, seed 0) at the
    run's batch; None otherwise."""
    if options.runner.precision != MIXED:
        return None
    feeds = loaded.feeds
    if feeds is None:
        run_batch = choose_batch(loaded.model, options.model.batch, loaded.device)  # plan's own batch defaults to 1
        feeds = make_inputs(loaded.model, min(run_batch, PRECISION_IMAGES)).feeds
    return search_budget(loaded.model, feeds, options.runner.budget, nodes_in_fp32_anyway(plan, options.runner.variants))
