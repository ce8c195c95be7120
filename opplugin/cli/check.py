"""`opplugin check`: the swapped model compared with onnxruntime step by step; where they
differ, each step alone, judged against float64."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.files import write_atomic
from ..report.html_sections import check_page
from ..report.timing import add_devices, format_devices
from ..runtime.multi_device import DevicesTally
from ..verify.check import build_check_report, check, check_chunks, format_check
from ..errors import InputError
from ..verify import mixed_precision, precision_cost
from ..verify.first_bad import ISOLATION_IMAGES, arbitrate, format_verdicts, isolate_steps, verdicts_as_json
from ..verify.mixed_precision import Budget
from ..verify.precision_cost import PRECISIONS
from .budget import PRECISION_IMAGES, first_images
from .file_guard import CommandFiles
from .options import DEFAULT_ATOL, DEFAULT_RTOL, ReportOptions, ToleranceOptions
from .output import save_outputs, write_json
from .progress import PassBars, ProgressBar
from .workload import Workload, kernel_loops, load_with_inputs, prepare


@dataclass(frozen=True)
class CheckOptions:
    workload: Workload
    tolerance: ToleranceOptions
    reports: ReportOptions
    precision: str = "fp32"  # tf32, fp16 or bf16: what that precision costs, node by node (precision_cost.py); mixed
    budget: Budget | None = None  # with mixed: what the outputs must meet (mixed_precision.py)

    def files(self) -> CommandFiles:
        return self.workload.files(self.reports.outputs())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    Workload.add(parser, precision=False)  # check's --precision is its own: what a precision costs, emulated
    ToleranceOptions.add(parser)
    ReportOptions.add(parser, "also write the comparison as JSON (- for standard output)", wide=True,
                      html_help="also write the plan and the comparison as one HTML page to open in a browser")
    parser.add_argument("--precision", choices=("fp32", *PRECISIONS, "mixed"), default="fp32",
                        help="fp32 (default): opplugin against onnxruntime; tf32, fp16, bf16: what that precision costs the model, "
                             "each node's error and the outputs' against float64, emulated (fp16, bf16: every float tensor rounded "
                             "to it; tf32: the operands of each product), FP32 arithmetic inside each node; mixed: which nodes "
                             "must stay in FP32 for FP16 to meet --budget")
    parser.add_argument("--budget", metavar="rel_l2=E|top1=A",
                        help="with --precision mixed: the outputs' relative L2 error against float64 at most E, or their top-1 "
                             "agreement with it at least A")


def read(args: argparse.Namespace) -> CheckOptions:
    if (args.precision == "mixed") != (args.budget is not None):
        raise InputError("--precision mixed needs --budget rel_l2=E or top1=A, and --budget needs --precision mixed")
    budget = Budget.parse(args.budget) if args.budget is not None else None
    options = CheckOptions(Workload.from_args(args), ToleranceOptions.from_args(args), ReportOptions.from_args(args), args.precision, budget)
    if options.precision != "fp32":
        _refuse_what_precision_ignores(options)
    return options


def _refuse_what_precision_ignores(options: CheckOptions) -> None:
    """--precision runs no plan and compares with float64 alone: the flags of the comparison with onnxruntime
    would do nothing, so they are refused in one line."""
    workload, tolerance = options.workload, options.tolerance
    ignored = [flag for flag, given in (
        ("--report", options.reports.html), ("--save-outputs", workload.data.save_outputs), ("--keep", workload.data.keep),
        ("--devices", workload.runner.devices), ("--variant", workload.runner.variant), ("--chunk", workload.runner.chunk),
        ("--streams", workload.runner.streams), ("--kernel", workload.kernels.files), ("--sanitize", workload.kernels.sanitize),
        ("--watch", workload.kernels.watch), ("--atol", tolerance.atol != DEFAULT_ATOL), ("--rtol", tolerance.rtol != DEFAULT_RTOL),
        ("--check-chunk", tolerance.check_chunk)) if given]
    if ignored:
        raise InputError(f"{', '.join(ignored)}: for the comparison with onnxruntime; --precision measures against float64 "
                         f"alone (text, and --json)")


def execute(options: CheckOptions) -> int:
    """0 when the model passes, 1 when it does not."""
    if options.precision != "fp32":
        return _precision_cost(options)
    looped = kernel_loops(options.workload, options.tolerance, poison=True)
    if looped is not None:
        return looped
    prepared = prepare(options.workload, poison=True)
    runner, devices, inputs = prepared.runner, prepared.devices, prepared.inputs
    model, batch = prepared.loaded.model, prepared.loaded.batch
    atol, rtol, keep = options.tolerance.atol, options.tolerance.rtol, options.workload.data.keep
    where = runner.device.name if runner.device.is_cuda else "CPU (numpy reference backend; no CUDA device)"
    if devices:
        where += f", split over {', '.join(devices.labels)}"
    tally = DevicesTally(devices) if devices else None
    run = tally.run if tally else runner.run
    custom = f" (its {len(model.custom_nodes())} custom nodes against their declarations' float64 reference)" if model.custom_nodes() else ""
    print(f"Checking {model.name}, batch {batch}, on {where}, against onnxruntime CPU{custom}; inputs: {inputs.source}")
    plan = runner.plan_record(batch)
    passes = check_chunks(plan, batch, chunk=options.tolerance.check_chunk)
    if len(passes) > 1:
        print(f"Compared in {len(passes)} passes of up to {passes[0].stop:,} images, to bound host memory")
    print()
    # several passes take a while: a bar on a terminal; in a log, a line per quarter once
    # there are enough passes for the quarters to fall in different ones
    bar = ProgressBar(sys.stderr, plain_lines=len(passes) >= 4)
    try:
        saved = SavedPieces(run, model.outputs, keep) if options.workload.data.save_outputs else None
        result = check(saved.run if saved else run, plan, inputs.feeds, inputs.labels, atol, rtol, chunk=passes[0].stop, progress=bar)
    finally:
        bar.close()
    if saved is not None:
        save_outputs(options.workload.data, saved.arrays())
    verdicts, steps_alone = None, None
    if not result.passed:  # each step alone, judged by float64 where it differs from onnxruntime
        verdicts = isolate_steps(runner, inputs.feeds, result, atol, rtol)
        result = arbitrate(result, verdicts)
        steps_alone = verdicts_as_json(verdicts, min(ISOLATION_IMAGES, batch))
    print(format_check(result, atol, rtol, options.reports.wide))
    split = _devices_section(tally)
    if split:
        print()
        print("\n".join(format_devices(split)))
    if verdicts is not None:
        print()
        print(format_verdicts(verdicts, min(ISOLATION_IMAGES, batch), result))
    report = build_check_report(result, plan, atol, rtol, inputs.source, steps_alone) | split
    if options.reports.json:
        write_json(options.reports.json, report)
    if options.reports.html:
        write_atomic(options.reports.html, check_page(report, plan))
    return 0 if result.passed else 1


def _precision_cost(options: CheckOptions) -> int:
    """check --precision tf32|fp16|bf16: the emulated cost, printed (and as JSON); 0 once measured. --precision
    mixed: the nodes kept in FP32 for the budget; 1 where no assignment meets it."""
    # every tensor is kept in float64 and in the format: without --batch, a few images, not a run's thousands
    loaded, inputs = load_with_inputs(options.workload, default_batch=PRECISION_IMAGES)
    images = loaded.batch if options.workload.model.batch is not None else min(loaded.batch, PRECISION_IMAGES)
    feeds = first_images(inputs.feeds, images)  # the user's own feeds too
    bar = PassBars(sys.stderr, unit="nodes")
    try:
        if options.budget is not None:
            found = mixed_precision.plan_mixed(loaded.model.original, feeds, options.budget, loaded.model.name, bar)
            text, status = mixed_precision.format_text(found), 0 if found.met else 1
        else:
            found = precision_cost.measure(loaded.model.original, feeds, options.precision, loaded.model.name, bar)
            text, status = precision_cost.format_text(found), 0
    finally:
        bar.close()
    print(text, end="")
    if options.reports.json:
        write_json(options.reports.json, found.as_json() | {"inputs": inputs.source})
    return status


def _devices_section(tally) -> dict:
    """check --devices: each device's images and time over the passes, and the images/s of them all
    (report.add_devices' keys); {} without --devices."""
    if tally is None:
        return {}
    section = add_devices({}, tally.rows(), tally.total_ms)
    return {key: section[key] for key in ("devices", "images_per_s", "host_to_host_ms", "batch")}


class SavedPieces:
    """A runner's run, for check, that also keeps the graph outputs and `keep` of each piece
    it is given, for --save-outputs (the pieces are consecutive rows of the batch)."""

    def __init__(self, run, outputs: list[str], keep: tuple[str, ...]):
        self._run, self.keep = run, keep
        self.names = tuple(dict.fromkeys((*outputs, *keep)))
        self.pieces: list[dict[str, Any]] = []

    def run(self, feeds, keep=(), **options):
        result = self._run(feeds, keep=tuple(dict.fromkeys((*keep, *self.keep))), **options)
        found = result.outputs | result.kept
        self.pieces.append({name: found[name] for name in self.names})
        return result

    def arrays(self) -> dict[str, Any]:
        if len(self.pieces) == 1:
            return self.pieces[0]
        return {name: np.concatenate([piece[name] for piece in self.pieces]) for name in self.names}
