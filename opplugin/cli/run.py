"""`opplugin run`: the swapped model timed, its per-op report, and its agreement with onnxruntime."""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

from ..core.files import write_atomic
from ..errors import InputError
from ..gpu.cuda import runtime_major
from ..report import html_sections, timing as reports, trace
from ..report.charts import Roof
from ..verify.check import agreement, top1
from .file_guard import CommandFiles
from .options import ReportOptions, TimingOptions, ToleranceOptions
from .ort_builds import cpu_provider_warning
from .output import save_outputs, write_json
from .progress import ProgressBar
from .workload import Workload, kernel_loops, prepare

# `run` times this many runs after this many untimed ones: on a GPU for medians,
# on the CPU one pass (the reference backend is there for correctness)
RUN_TIMING = {"gpu": {"warmup": 2, "repeat": 5}, "cpu": {"warmup": 0, "repeat": 1}}
# Runs of at least this many chunks in all report progress even when stderr is not a terminal.
MANY_CHUNKS = 64


@dataclass(frozen=True)
class RunOptions:
    workload: Workload
    timing: TimingOptions
    reports: ReportOptions
    compare: bool = True  # False: --no-compare, no comparison with onnxruntime
    tolerance: ToleranceOptions = ToleranceOptions()  # the comparison's pass rule (--atol, --rtol), as check's
    feed_probe: bool = True  # with --devices: time 1, 2, ... N of them first and use the fastest count (False: --no-feed-probe)

    def files(self) -> CommandFiles:
        return self.workload.files(self.reports.outputs())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    Workload.add(parser)
    gpu, cpu = RUN_TIMING["gpu"], RUN_TIMING["cpu"]
    TimingOptions.add(parser, warmup_help=f"untimed runs first (default {gpu['warmup']} on a GPU, {cpu['warmup']} on the CPU)",
                      repeat_help=f"timed runs; the report gives medians (default {gpu['repeat']} on a GPU, {cpu['repeat']} on the CPU)")
    parser.add_argument("--no-compare", action="store_true", help="skip the comparison with onnxruntime")
    parser.add_argument("--no-feed-probe", action="store_true",
                        help="with --devices: use every device it names; by default a large batch first times a pass on "
                             "1, 2, ... N of them and runs on the count the host feeds fastest, the rest left idle")
    ToleranceOptions.add(parser, chunks=False)  # the comparison's pass rule, which decides exit status 1
    ReportOptions.add(parser, "also write the report as JSON (- for standard output)", wide=True, csv_and_trace=True,
                      html_help="also write the report as one HTML page to open in a browser: the plan, the last timed run's "
                                "timeline, a roofline of the plugin steps (on a GPU against its measured ceilings)")


def read(args: argparse.Namespace) -> RunOptions:
    reports = ReportOptions.from_args(args)
    workload = Workload.from_args(args, single_device=["--trace"] if reports.trace else [])
    tolerance = ToleranceOptions.from_args(args, workload.runner.precision)
    if args.no_compare and ToleranceOptions.given(args):
        raise InputError("--atol and --rtol set the comparison with onnxruntime; leave out --no-compare")
    if args.no_feed_probe and workload.runner.devices is None:
        raise InputError("--no-feed-probe applies to --devices; give --devices too, or leave it out")
    return RunOptions(workload, TimingOptions.from_args(args), reports, not args.no_compare, tolerance, not args.no_feed_probe)


def execute(options: RunOptions) -> int:
    """0, or 1 when the comparison with onnxruntime fails (exit status 1 is for that alone)."""
    looped = kernel_loops(options.workload, options.tolerance, poison=False)
    if looped is not None:
        return looped
    prepared = prepare(options.workload, poison=False)
    runner, devices, inputs = prepared.runner, prepared.devices, prepared.inputs
    model, batch, on_gpu = prepared.loaded.model, prepared.loaded.batch, runner.device.is_cuda
    if not on_gpu:
        print("No CUDA device: plugin steps run the numpy reference backend on the CPU.", file=sys.stderr)
    if inputs.random_weights:
        print(f"Conv weights {', '.join(inputs.random_weights)} are graph inputs: this run fills them with random data", file=sys.stderr)
    timing = RUN_TIMING["gpu" if on_gpu else "cpu"]
    warmup, repeat = options.timing.or_defaults(timing["warmup"], timing["repeat"])
    keep = options.workload.data.keep
    bar = _progress(runner, batch, warmup + repeat)
    try:
        if devices:
            measured = devices.profile(inputs.feeds, warmup, repeat, keep=keep, progress=bar, feed_probe=options.feed_probe)
        else:
            measured = runner.profile(inputs.feeds, warmup, repeat, keep=keep, progress=bar)
    finally:
        bar.close()
    # with --devices: the first device's profile gives the step table, and the last pass holds every output
    profile, last = (measured.first, measured.last) if devices else (measured, measured.result)
    save_outputs(options.workload.data, last.outputs | last.kept)

    # under --precision mixed: the budget, and the nodes it keeps in FP32 with why (cli/budget.py)
    extra = {"data": inputs.source, "budget": prepared.budget.as_json() if prepared.budget else None}
    ours = last.outputs[model.outputs[0]]
    predicted = top1(ours, batch)
    if predicted is not None and inputs.labels is not None:
        extra["accuracy"] = float((predicted == inputs.labels).mean())
    if options.compare:
        atol, rtol = options.tolerance.atol, options.tolerance.rtol
        extra["agreement"] = agreement(runner.plan_record(batch) if devices else profile.plan, inputs.feeds, ours, atol, rtol) | {
            "atol": atol, "rtol": rtol, "widened_for": options.tolerance.widened}

    result = reports.build_report(profile, warmup, extra)
    if devices:
        result = reports.add_devices(result, measured.rows(), statistics.median(measured.total_ms),
                                     measured.feeding.record(measured.labels))
    print(reports.format_text(result, options.reports.wide))
    _warn_cpu_provider(profile)
    files = options.reports
    if files.json:
        write_json(files.json, result)
    if files.csv:
        write_atomic(files.csv, reports.to_csv(result["steps"]))
    if files.trace:
        write_atomic(files.trace, trace.dumps(trace.build_trace(profile)))
    if files.html:
        write_atomic(files.html, html_sections.run_page(result, profile, _roof() if on_gpu else None))
    compared = extra.get("agreement")
    return 1 if compared is not None and not compared["passed"] else 0


def _roof() -> Roof:
    """This GPU's copy bandwidth and FP32 rate, measured now (about a second), for the report's roofline."""
    from ..lab import roofline

    measured = roofline.measure()
    return Roof(measured.bytes_per_s, measured.flops_per_s)


def _progress(runner, batch: int, passes: int) -> ProgressBar:
    """A progress bar on stderr: redrawn in place on a terminal; in a log, a plain
    line per quarter for runs of many chunks, and nothing for short ones."""
    return ProgressBar(sys.stderr, plain_lines=runner.chunks_for(batch) * passes >= MANY_CHUNKS)


def _warn_cpu_provider(profile) -> None:
    """One line when plugin steps ran on the GPU but onnxruntime's on the CPU: what it cost, and the fix."""
    line = cpu_provider_warning(profile, runtime_major() if profile.plan.device.is_cuda else None)
    if line:
        print(f"opplugin: {line}", file=sys.stderr)

