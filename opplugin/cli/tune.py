"""`opplugin tune`: every Conv configuration timed on this GPU, the fastest that passes cached."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..lab.tune import build_tune_report, format_report, tune
from .file_guard import CommandFiles
from .loading import load
from .options import DEFAULT_BATCH, KernelOptions, ModelOptions, ReportOptions
from .output import write_json


@dataclass(frozen=True)
class TuneOptions:
    model: ModelOptions
    device: str  # auto or cuda: tuning needs a CUDA device either way
    kernels: KernelOptions
    reports: ReportOptions

    def files(self) -> CommandFiles:
        return CommandFiles(self.reports.outputs(), (self.model.model,), self.kernels.paths, self.model.ops)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ModelOptions.add(parser, f"images per kernel call while timing (default: {DEFAULT_BATCH})", input_shape=False)
    parser.add_argument("--device", choices=("auto", "cuda"), default="auto", help="tuning needs a CUDA device either way")
    KernelOptions.add(parser)
    ReportOptions.add(parser, "also write every configuration's result as JSON")


def read(args: argparse.Namespace) -> TuneOptions:
    return TuneOptions(ModelOptions.from_args(args), args.device, KernelOptions.from_args(args), ReportOptions.from_args(args))


def execute(options: TuneOptions) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    loaded = load(options.model, options.device)
    report = tune(loaded.model, loaded.batch, options.device, progress=say, kernels=options.kernels.by_op)
    print(format_report(report))
    if options.reports.json:
        write_json(options.reports.json, build_tune_report(report))
    return 0
