"""`opplugin tune`: every Conv configuration timed on this GPU, the fastest that passes cached."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..core.number_formats import FP32
from ..lab.tune import TUNED_PRECISIONS, build_tune_report, checked_tune_precision, format_report, tune
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
    precision: str = FP32  # the precision whose Conv configurations are timed and cached

    def files(self) -> CommandFiles:
        return CommandFiles(self.reports.outputs(), (self.model.model,), self.kernels.paths, self.model.ops)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ModelOptions.add(parser, f"images per kernel call while timing (default: {DEFAULT_BATCH})", input_shape=False)
    parser.add_argument("--device", choices=("auto", "cuda"), default="auto", help="tuning needs a CUDA device either way")
    parser.add_argument("--precision", default=FP32, metavar="|".join(TUNED_PRECISIONS),
                        help="fp32 (default): every FP32-exact configuration of each Conv; fp16, bf16: every configuration of "
                             "the family a run in that precision gives each Conv (wg_fp16, wg_bf16; dw_fp16, dw_bf16 for a depthwise "
                             "one), each element checked within the format's bound; the choices are cached for runs in that precision")
    KernelOptions.add(parser)
    ReportOptions.add(parser, "also write every configuration's result as JSON")


def read(args: argparse.Namespace) -> TuneOptions:
    return TuneOptions(ModelOptions.from_args(args), args.device, KernelOptions.from_args(args), ReportOptions.from_args(args),
                       checked_tune_precision(args.precision))


def execute(options: TuneOptions) -> int:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    loaded = load(options.model, options.device)
    report = tune(loaded.model, loaded.batch, options.device, progress=say, kernels=options.kernels.by_op,
                  precision=options.precision)
    print(format_report(report))
    if options.reports.json:
        write_json(options.reports.json, build_tune_report(report))
    return 0
