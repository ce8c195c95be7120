"""`opplugin profile`: the GPU's counters for the steps that take the time, by their ONNX node names.

The steps are those named with --step, else the --top slowest plugin steps of a timed run. A child
process (profile_child.py) runs each of them once inside an NVTX range, under Nsight Compute with
its full section set; the report comes back as each step's kernels with their speed-of-light
throughputs, occupancy and what limits it, warp stalls, cache hit rates, bank conflicts, spills and
the source lines where the samples fall (user kernels are compiled with -lineinfo), beside the
step's FLOPs and bytes against the device's roofline.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from .. import __version__
from ..core.files import write_atomic
from ..errors import DeviceError, InputError, positive_int
from ..gpu.device import select_device
from ..lab import ncu
from ..lab.profile_page import profile_page
from ..lab.profiled import StepProfile, profile_json, profile_lines
from ..user_kernels.compiler import LINEINFO_ENV
from .file_guard import CommandFiles
from .options import DEFAULT_BATCH, DataOptions, KernelOptions, ModelOptions, ReportOptions, RunnerOptions
from .output import write_json
from .workload import Workload, prepare

DEFAULT_TOP = 3
CHILD_TIMEOUT_S = 900


@dataclass(frozen=True)
class ProfileOptions:
    workload: Workload
    steps: tuple[str, ...] = ()  # --step: node or step names; none: the --top slowest
    top: int = DEFAULT_TOP
    reports: ReportOptions = ReportOptions()
    ncu_report: str | None = None  # --ncu-report: where the raw .ncu-rep is kept

    def files(self) -> CommandFiles:
        outputs = self.reports.outputs() + ((("--ncu-report", self.ncu_report),) if self.ncu_report else ())
        return self.workload.files(outputs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ModelOptions.add(parser, f"images per run (default: {DEFAULT_BATCH})")
    RunnerOptions.add(parser, runs=False)
    DataOptions.add(parser, runs=False)
    KernelOptions.add(parser)
    parser.add_argument("--step", action="append", metavar="NAME",
                        help="profile this step (its name, or any ONNX node it runs); repeatable (default: the slowest)")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help="without --step: how many of the slowest plugin steps (default %(default)s)")
    ReportOptions.add(parser, "also write every counter as JSON (- for standard output)",
                      html_help="also write the profiled steps as one self-contained HTML page: their roofline, every kernel's counters, the hot lines")
    parser.add_argument("--ncu-report", metavar="FILE.ncu-rep", help="keep Nsight Compute's own report, to open in its UI")


def read(args: argparse.Namespace) -> ProfileOptions:
    workload = Workload(ModelOptions.from_args(args), RunnerOptions.from_args(args), DataOptions.from_args(args, runs=False),
                        KernelOptions.from_args(args))
    top = positive_int(args.top, "--top")
    if args.step and args.top != DEFAULT_TOP:
        raise InputError("--step names the steps, --top picks the slowest; give one")
    return ProfileOptions(workload, tuple(args.step or ()), top, ReportOptions.from_args(args), args.ncu_report)


def execute(options: ProfileOptions) -> int:
    if not select_device(options.workload.runner.device).is_cuda:
        raise DeviceError("profiling reads a GPU's counters, and there is no CUDA device here (plan and run work on the CPU)")
    program = ncu.find_ncu()
    if program is None:
        raise DeviceError("ncu (Nsight Compute) is not installed here; it comes with the CUDA toolkit")
    prepared = prepare(options.workload, poison=False)
    runner = prepared.runner
    timed = runner.profile(prepared.inputs.feeds, warmup=1, repeat=3)
    record = runner.plan_record(runner.chunk)  # the child calls each kernel on one chunk: its FLOPs and bytes
    medians = {name: timed.median(name) for name in timed.step_ms}
    one_chunk = runner.chunk == runner.plan.batch  # a step's median over the batch is one kernel call's only then
    chosen = chosen_steps(record, options.steps, options.top, medians)
    print(f"Profiling {len(chosen)} step(s) of {runner.plan.model.name} at batch {runner.chunk} under Nsight Compute "
          f"(each kernel is replayed for its counters; this takes a while): {', '.join(record.steps[i].name for i in chosen)}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="opplugin-profile-") as folder:
        report = str(Path(folder) / "steps.ncu-rep")
        _profile(program, options, chosen, folder, report)
        counters = [ncu.kernel_counters(r) for r in ncu.raw_records(ncu.export(program, report, "raw", "--print-units", "base"))]
        blocks = ncu.hot_lines(ncu.export(program, report, "source", "--print-source", ncu.SOURCE_VIEW))
        lines = ncu.lines_by_kernel(counters, blocks)
        if options.ncu_report:
            write_atomic(options.ncu_report, Path(report).read_bytes())
    roof = _roofline()
    profiles = [StepProfile.join(record.steps[i], i, counters, lines, medians.get(record.steps[i].name) if one_chunk else None)
                for i in chosen]
    print("\n".join(profile_lines(profiles, roof)))
    if options.reports.json:
        write_json(options.reports.json, profile_json(runner.plan.model.name, runner.device.name, runner.chunk, profiles, roof))
    if options.reports.html:
        when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        write_atomic(options.reports.html, profile_page(runner.plan.model.name, runner.device.name, runner.chunk, __version__,
                                                        when, profiles, roof))
    return 0


def chosen_steps(record, names: tuple[str, ...], top: int, medians: dict[str, float]) -> list[int]:
    """Indices in the plan of the steps named (by step or node name), else of the `top` slowest plugin steps."""
    if not names:
        plugin = [i for i, s in enumerate(record.steps) if s.kind == "plugin" and s.name in medians]
        return sorted(sorted(plugin, key=lambda i: -medians[record.steps[i].name])[:top])
    chosen = []
    for name in names:
        index = next((i for i, s in enumerate(record.steps) if name == s.name or name in s.nodes), None)
        if index is None:
            known = ", ".join(s.name for s in record.steps[:8])
            raise InputError(f"--step {name}: no step or node of that name (steps: {known}{', ...' if len(record.steps) > 8 else ''})")
        if record.steps[index].kind != "plugin":
            raise InputError(f"--step {name}: {record.steps[index].name} runs in onnxruntime; profile takes plugin steps")
        chosen.append(index)
    return sorted(set(chosen))


def _profile(program: str, options: ProfileOptions, chosen: list[int], folder: str, report: str) -> None:
    """The child under ncu; DeviceError (one line) where ncu or the child says it could not."""
    spec = Path(folder) / "spec.pickle"
    # the child builds its runner as this process did, but eager: graphs would hide the steps from NVTX
    workload = replace(options.workload, runner=replace(options.workload.runner, cuda_graphs=False))
    spec.write_bytes(pickle.dumps((workload, chosen)))
    root = str(Path(__file__).resolve().parents[2])
    env = os.environ | {LINEINFO_ENV: "1", "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    child = [sys.executable, "-m", "opplugin.cli.profile_child", str(spec)]
    try:
        done = subprocess.run(ncu.profile_command(program, report, child), capture_output=True, text=True, env=env,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DeviceError(f"Nsight Compute did not finish within {CHILD_TIMEOUT_S} s; name fewer steps with --step") from None
    output = done.stdout + done.stderr
    why = ncu.refusal(output)
    child_error = next((line for line in done.stderr.splitlines() if line.startswith("opplugin:")), None)
    if child_error:
        raise DeviceError(f"the profiled run stopped: {child_error.removeprefix('opplugin:').strip()}")
    if why or not Path(report).is_file():
        raise DeviceError(f"Nsight Compute profiled nothing: {why or output.strip().splitlines()[-1:] or 'no report written'}")


def _roofline():
    """The device's measured ceilings (lab/roofline.py), or None where the measure fails."""
    from ..lab import roofline

    try:
        return roofline.measure()
    except Exception as err:  # a measure that cannot run (memory taken) leaves the roof out, said in the report
        print(f"opplugin: the roofline could not be measured ({type(err).__name__}); steps are shown without it", file=sys.stderr)
        return None
