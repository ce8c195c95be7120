"""The command line: opplugin run | check | plan | tune | bench | new."""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

from .. import __version__
from ..errors import InputError, OpPluginError

DEFAULT_MODEL = "lenet86"

# --- checks of the parsed flags, made before any work ------------------------------------
# Each table names flags by their argparse dest; a subcommand without the flag skips it,
# so run, check, plan, tune and bench validate alike, and a new option joins by its dest.

# dest: (flag, whether 0 is allowed)
COUNT_FLAGS = {
    "batch": ("--batch", False),
    "chunk": ("--chunk", False),
    "streams": ("--streams", False),
    "repeat": ("--repeat", False),
    "warmup": ("--warmup", True),
    "check_chunk": ("--check-chunk", False),
}
TOLERANCE_FLAGS = {"atol": "--atol", "rtol": "--rtol"}


def check_args(args: argparse.Namespace) -> None:
    """InputError for the first flag whose value cannot work, naming its own value."""
    from ..errors import positive_int
    from .file_guard import check_files

    for dest, (flag, allow_zero) in COUNT_FLAGS.items():
        if getattr(args, dest, None) is not None:
            positive_int(getattr(args, dest), flag, allow_zero=allow_zero)
    for dest, flag in TOLERANCE_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"{flag} must be a finite number of at least 0, got {value:g}")
    check_data_flags(args)
    check_files(args)  # outputs writable, and none of them a file the command reads


def check_data_flags(args: argparse.Namespace) -> None:
    """The data flags that exclude each other, or need another."""
    from ..inputs.user_data import parse_input_shapes, parse_pair

    given = [flag for dest, flag in (("load_inputs", "--load-inputs"), ("images", "--images")) if getattr(args, dest, None)]
    if getattr(args, "data", "auto") != "auto":
        given.append(f"--data {args.data}")
    if len(given) > 1:
        raise InputError(f"{' and '.join(given)} both say where the inputs come from; give one")
    image_flags = [flag for dest, flag in (("resize", "--resize"), ("mean", "--mean"), ("std", "--std")) if getattr(args, dest, None)]
    if image_flags and not getattr(args, "images", None):
        raise InputError(f"{', '.join(image_flags)} apply to --images FOLDER")
    if getattr(args, "keep", None) and not getattr(args, "save_outputs", None):
        raise InputError("--keep names tensors for --save-outputs FILE.npz; give that file too")
    parse_input_shapes(getattr(args, "input_shape", None))
    parse_pair(getattr(args, "resize", None), "--resize")


def refuse_cuda_graphs_without_gpu(args: argparse.Namespace, device) -> None:
    """--cuda-graphs typed on a machine whose plugin steps run on the CPU: there is nothing to capture."""
    if getattr(args, "cuda_graphs", None) is True and not device.is_cuda:
        raise InputError("--cuda-graphs needs a CUDA device; here plugin steps run the numpy reference on the CPU")


# `run` and `check` time this many runs after this many untimed ones: on a GPU for medians,
# on the CPU one pass (the reference backend is there for correctness)
RUN_TIMING = {"gpu": {"warmup": 2, "repeat": 5}, "cpu": {"warmup": 0, "repeat": 1}}


def _batch_help() -> str:
    from ..graph.model import DYNAMIC_BATCH_CPU, DYNAMIC_BATCH_GPU, SHIPPED_BATCH

    return (f"the model's own fixed batch; {SHIPPED_BATCH} for the shipped models; "
            f"else {DYNAMIC_BATCH_GPU} on a GPU, {DYNAMIC_BATCH_CPU} on the CPU")


def _add_model(parser: argparse.ArgumentParser) -> None:
    from ..graph.model import SHIPPED_MODELS

    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                        help=f"ONNX file, or a shipped model: {', '.join(SHIPPED_MODELS)} (default %(default)s)")


def _add_common(parser: argparse.ArgumentParser, batch_help: str) -> None:
    from ..runtime.runner import DEFAULT_STREAMS

    _add_model(parser)
    parser.add_argument("--batch", type=int, help=f"images per run (default: {batch_help})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the GPU when there is one")
    parser.add_argument("--variant", help="Conv kernel variant (baseline, const, const_mo, ...); default: the fastest on this GPU")
    parser.add_argument("--data", default="auto", help="auto | fashion-mnist | random (auto: the bundled test set for shipped models)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --data random, any integer (default %(default)s)")
    parser.add_argument("--chunk", type=int, help="images per chunk on the device (default: from free device memory)")
    parser.add_argument("--streams", type=int, help=f"chunks in flight at once on a GPU (default {DEFAULT_STREAMS})")
    # None when neither flag is typed (graphs on where there is a GPU); True only when --cuda-graphs is
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                        help="replay each run of plugin steps as one CUDA graph after the first pass: less host time per step, "
                             "each step still timed (default on a GPU; --no-cuda-graphs runs every step eagerly)")
    parser.add_argument("--wide", action="store_true", help="print long names and op chains in full (default: lines of about 160 characters)")
    parser.add_argument("--input-shape", action="append", metavar="NAME:DIMS",
                        help="fix an input's free dimensions, e.g. input:Nx3x224x224 (N leaves the batch free; a number fixes it)")


def _add_data(parser: argparse.ArgumentParser) -> None:
    """A user's own inputs and outputs, for run and check."""
    parser.add_argument("--load-inputs", metavar="FILE", help="inputs from a .npz file (an array per input name) or a .npy file (one-input models)")
    parser.add_argument("--images", metavar="FOLDER", help="inputs from the PNG and JPEG files of a folder, in name order (needs Pillow)")
    parser.add_argument("--resize", metavar="H,W", help="with --images: resize each image to H x W (default: the model's input size)")
    parser.add_argument("--mean", metavar="M[,M,M]", help="with --images: subtracted per channel after scaling pixels to [0, 1] (default 0)")
    parser.add_argument("--std", metavar="S[,S,S]", help="with --images: divided per channel after the mean (default 1)")
    parser.add_argument("--save-outputs", metavar="FILE.npz", help="write the graph's outputs (and --keep tensors) to a .npz file")
    parser.add_argument("--keep", action="append", metavar="TENSOR", help="with --save-outputs: also save this tensor (one that leaves a step)")
    parser.add_argument("--devices", metavar="all|0,1,...",
                        help="split the batch in order over these CUDA devices, a runner on each, all at once "
                             "(all: every GPU; an id may repeat); the report gains a row per device")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opplugin", description="Run ONNX models with Conv swapped for custom CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"opplugin {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    batch_help = _batch_help()
    parsers = {
        "run": _run_parser(commands, batch_help),
        "check": _check_parser(commands, batch_help),
        "plan": _plan_parser(commands),
        "bench": _bench_parser(commands),
        "tune": _tune_parser(commands, batch_help),
    }
    _add_user_kernel_options(commands, **parsers)
    return parser


def _run_parser(commands, batch_help: str) -> argparse.ArgumentParser:
    run = commands.add_parser("run", help="run the swapped model and print the per-op timing report")
    _add_common(run, batch_help)
    _add_data(run)
    gpu, cpu = RUN_TIMING["gpu"], RUN_TIMING["cpu"]
    run.add_argument("--repeat", type=int,
                     help=f"timed runs; the report gives medians (default {gpu['repeat']} on a GPU, {cpu['repeat']} on the CPU)")
    run.add_argument("--warmup", type=int, help=f"untimed runs first (default {gpu['warmup']} on a GPU, {cpu['warmup']} on the CPU)")
    run.add_argument("--no-compare", action="store_true", help="skip the comparison with onnxruntime")
    run.add_argument("--json", metavar="FILE", help="also write the report as JSON (- for standard output)")
    run.add_argument("--csv", metavar="FILE", help="also write the step table as CSV (- for standard output)")
    run.add_argument("--trace", metavar="FILE",
                     help="also write the last timed run's timeline as a Chrome/Perfetto trace (open in ui.perfetto.dev)")
    return run


def _check_parser(commands, batch_help: str) -> argparse.ArgumentParser:
    from ..verify.check import DEFAULT_ATOL, DEFAULT_CHECK_BYTES, DEFAULT_RTOL

    check = commands.add_parser("check", help="compare the swapped model with onnxruntime, step by step")
    _add_common(check, batch_help)
    _add_data(check)
    check.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="absolute tolerance (default %(default)g)")
    check.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="relative tolerance (default %(default)g)")
    check.add_argument("--check-chunk", type=int, metavar="N",
                       help=f"images compared with onnxruntime at a time (default: as many as fit in {DEFAULT_CHECK_BYTES >> 30} GiB of host memory)")
    check.add_argument("--json", metavar="FILE", help="also write the comparison as JSON (- for standard output)")
    return check


def _plan_parser(commands) -> argparse.ArgumentParser:
    plan = commands.add_parser("plan", help="show how the model is split into plugin and onnxruntime steps")
    _add_common(plan, "the model's own fixed batch, else 1")
    plan.add_argument("--json", metavar="FILE", help="also write the plan as JSON (- for standard output)")
    return plan


def _bench_parser(commands) -> argparse.ArgumentParser:
    from ..lab import bench as conv_bench, e2e, gemm_bench
    from ..lab.cnn_layers import SUITE_BATCHES
    from ..lab.trial import BENCH_REPEAT, BENCH_WARMUP

    def listed(values) -> str:
        return " ".join(map(str, values))

    bench = commands.add_parser("bench", help="time every Conv variant of the models and the peers (cuDNN, onnxruntime CUDA) on this GPU")
    bench.add_argument("--models", nargs="+", metavar="MODEL",
                       help=f"shipped model names or ONNX files (default {listed(conv_bench.Options.models)})")
    bench.add_argument(
        "--suite", choices=("models", "cnn", "gemm"), default="models",
        help="models: the Conv steps of --models; cnn: Conv layers of VGG, ResNet and MobileNetV2; "
        "gemm: the seeds' fully connected layers against cuBLAS (default %(default)s)",
    )
    bench.add_argument("--batches", nargs="+", metavar="N",
                       help=f"batch sizes, space or comma separated (default {listed(conv_bench.DEFAULT_BATCHES)}; "
                       f"{listed(SUITE_BATCHES)} with --suite cnn; {listed(gemm_bench.BATCHES)} with --suite gemm; "
                       f"{listed(e2e.DEFAULT_BATCHES)} with --e2e)")
    bench.add_argument("--warmup", type=int, help=f"untimed calls before timing (default {BENCH_WARMUP})")
    bench.add_argument("--repeat", type=int, help=f"timed samples; the tables give medians (default {BENCH_REPEAT})")
    bench.add_argument("--all-configs", action="store_true", help="also time every configuration each family offers")
    bench.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                       help="time each Conv candidate replayed from a CUDA graph of back-to-back calls, as run launches its steps "
                            "(default; --no-cuda-graphs times eager calls, the host's launch cost included)")
    bench.add_argument("--families", nargs="+", metavar="FAMILY", help="time only these variant families (default all; the peers always run)")
    bench.add_argument("--json", metavar="FILE", help="also write every measurement as JSON")
    bench.add_argument("--e2e", nargs="+", metavar="MODEL", help="time these ONNX models end to end beside their peers (PyTorch eager, in a CUDA graph and torch.compile; onnxruntime CUDA, with and without its CUDA graph) instead")
    bench.add_argument("--peers", nargs="+", choices=e2e.PEERS, metavar="PEER",
                       help=f"with --e2e: time only these peers ({', '.join(e2e.PEERS)}; default all); opplugin's rows always run")
    _add_scaling(bench)
    return bench


def _add_scaling(bench: argparse.ArgumentParser) -> None:
    from ..lab import scaling

    bench.add_argument("--scaling", nargs="?", const=scaling.DEFAULT_MODEL, metavar="MODEL",
                       help=f"instead: images/s of one batch split over 1 to N devices, host to host from pinned memory, and the "
                            f"scaling efficiency (default model {scaling.DEFAULT_MODEL}, --batches {scaling.DEFAULT_BATCHES[0]})")
    bench.add_argument("--devices", nargs="+", metavar="all|0,1,...",
                       help="with --scaling: the device lists to time, each as in run --devices, one of them a single device "
                            "(default 0, 0,1, ... up to every GPU; 0,0 puts two runners on one GPU)")
    bench.add_argument("--plot", metavar="FILE.png", help="with --scaling: also draw images/s and efficiency against the devices (needs matplotlib)")


def _tune_parser(commands, batch_help: str) -> argparse.ArgumentParser:
    tune = commands.add_parser("tune", help="time every Conv configuration on this GPU and cache the fastest that passes")
    _add_model(tune)
    tune.add_argument("--batch", type=int, help=f"images per kernel call while timing (default: {batch_help})")
    tune.add_argument("--device", choices=("auto", "cuda"), default="auto", help="tuning needs a CUDA device either way")
    tune.add_argument("--json", metavar="FILE", help="also write every configuration's result as JSON")
    return tune


def _add_user_kernel_options(commands, **parsers) -> None:
    """--kernel on every command that runs kernels, --sanitize and --watch on run and check, and `opplugin new`."""
    from .kernel_tools.cli_support import add_kernel_flag, add_loop_flags, add_new_command

    for name, parser in parsers.items():
        add_kernel_flag(parser)
        if name in ("run", "check"):
            add_loop_flags(parser)
    add_new_command(commands)


def _user_registry(args, device, *, poison: bool = False):
    """The registry with the --kernel files in place of the built-in plugins (None without --kernel);
    `poison` fills their outputs with NaN before each call (check)."""
    from .kernel_tools.cli_support import user_sources
    from ..user_kernels import user_registry
    from ..user_kernels.flags import parse_kernels

    kernels = parse_kernels(getattr(args, "kernel", None))
    if not kernels:
        return None
    return user_registry(user_sources(kernels), poison=poison)


def _kernel_loops(args, *, poison: bool) -> int | None:
    """--sanitize runs first; --watch takes the place of the command's single pass (None: go on with it)."""
    if not (getattr(args, "sanitize", False) or getattr(args, "watch", False)):
        return None
    from .kernel_tools.cli_support import sanitize_kernels, watch_kernels
    from ..user_kernels.flags import parse_kernels

    kernels = parse_kernels(args.kernel)
    if not kernels:
        raise InputError("--sanitize and --watch need --kernel OP=FILE.cu")
    if args.sanitize:
        sanitize_kernels(args, kernels)
    if not args.watch:
        return None
    loaded = _load(args)
    inputs = _inputs(args, loaded, pinned=loaded.device.is_cuda) if loaded.feeds is not None else None
    return watch_kernels(args, loaded.model, loaded.device, loaded.batch,
                         lambda: _make_runner(args, loaded, poison=poison), kernels, inputs=inputs)


@dataclass(frozen=True)
class Loaded:
    """A command's model, its device, the batch it runs (see model.choose_batch), and the
    user's own feeds (--load-inputs, --images) when given."""

    model: Any
    device: Any
    batch: int
    feeds: dict[str, Any] | None = None
    source: str | None = None


def _load(args, free_batch_default: int | None = None) -> Loaded:
    """The model (with --input-shape and the user's data fixing its free sizes), its device
    and the batch the command runs; a stderr line says where that batch came from when the
    user gave none and the model is not a shipped one."""
    from ..gpu.device import select_device
    from ..graph.model import SHIPPED_MODELS, choose_batch, load_model
    from ..inputs.user_data import fix_input_shapes, parse_input_shapes, require_runnable_inputs

    model = load_model(args.model)
    fix_input_shapes(model, parse_input_shapes(getattr(args, "input_shape", None)))
    feeds, source = _user_feeds(args, model)
    require_runnable_inputs(model)
    device = select_device(args.device)
    refuse_cuda_graphs_without_gpu(args, device)
    if feeds is not None:
        batch = _batch_of(args, model, feeds)
        return Loaded(model, device, batch, _pinned(feeds, device), source)
    batch = choose_batch(model, args.batch, device, default=free_batch_default)
    if args.batch is None and model.fixed_batch is not None:
        print(f"Batch {batch}: {model.name}'s fixed batch", file=sys.stderr)
    elif args.batch is None and model.name not in SHIPPED_MODELS:
        print(f"Batch {batch}: the default for a model with a free batch (--batch N to choose)", file=sys.stderr)
    return Loaded(model, device, batch)


def _user_feeds(args, model) -> tuple[dict[str, Any] | None, str | None]:
    """The feeds of --load-inputs or --images, and where they came from (None, None without them)."""
    from ..inputs.user_data import ImageOptions, load_feeds, load_images

    if getattr(args, "load_inputs", None):
        return load_feeds(args.load_inputs, model), f"--load-inputs {args.load_inputs}"
    if getattr(args, "images", None):
        feeds = load_images(ImageOptions(args.images, args.resize, args.mean, args.std), model)
        return feeds, f"--images {args.images}, {next(iter(feeds.values())).shape[0]} images"
    return None, None


def _batch_of(args, model, feeds: dict[str, Any]) -> int:
    """The batch the user's data holds; --batch, when given, must say the same."""
    batch = int(feeds[model.batch_input.name].shape[0])
    if args.batch is not None and args.batch != batch:
        raise InputError(f"--batch {args.batch}: the inputs given hold a batch of {batch}; leave --batch out or give {batch}")
    return batch


def _pinned(feeds: dict[str, Any], device) -> dict[str, Any]:
    """On a GPU the feeds go to pinned memory, so the run copies them by DMA without staging."""
    if not device.is_cuda:
        return feeds
    from ..inputs.feeds import pinned_copy

    return {name: pinned_copy(array) for name, array in feeds.items()}


def _inputs(args, loaded: Loaded, pinned: bool):
    """The run's feeds: the user's own, else the bundled test set or random data (--data)."""
    from ..inputs.feeds import Inputs, make_inputs

    if loaded.feeds is not None:
        return Inputs(loaded.feeds, None, loaded.source, pinned)
    return make_inputs(loaded.model, loaded.batch, args.data, args.seed, pinned=pinned)


def _make_runner(args, loaded: Loaded, *, poison: bool = False):
    """A runner of a loaded model, with the flags' variant, chunk, streams and kernels; without a
    GPU the --kernel sources are compiled all the same (NVRTC alone), so their errors show here too."""
    from ..runtime import Runner
    from .kernel_tools.cli_support import compile_without_gpu, say_cpu_note

    variants = {"Conv": args.variant} if args.variant else None
    registry = _user_registry(args, loaded.device, poison=poison)
    runner = Runner(loaded.model, loaded.batch, loaded.device, variants, registry, chunk=args.chunk, streams=args.streams,
                    cuda_graphs=args.cuda_graphs is not False)
    if registry is not None and not runner.device.is_cuda:
        compile_without_gpu(runner.plan, registry)
        say_cpu_note(registry, runner.device)
    return runner


def _device_slots(args):
    """--devices as the device slots of a split run; None without it (the single-runner path)."""
    text = getattr(args, "devices", None)
    if text is None:
        return None
    if args.device == "cpu":
        raise InputError("--devices splits the batch over CUDA devices; leave out --device cpu")
    alone = [flag for dest, flag in (("trace", "--trace"), ("sanitize", "--sanitize"), ("watch", "--watch")) if getattr(args, dest, None)]
    if alone:
        raise InputError(f"{' and '.join(alone)} follow{'s' if len(alone) == 1 else ''} a single device; leave out --devices")
    from ..runtime.multi_device import cuda_slots

    return cuda_slots(text)


def _make_devices(args, loaded: Loaded, slots, *, poison: bool = False):
    """A runner per --devices slot, each of the flags' kind, built on its own device for its share of the batch."""
    from dataclasses import replace

    from ..runtime.multi_device import DeviceRunners

    return DeviceRunners(loaded.model, slots, lambda slot, share: _make_runner(args, replace(loaded, device=slot.device(), batch=share),
                                                                 poison=poison), loaded.batch)


def _save_outputs(args, outputs: dict[str, Any]) -> None:
    """--save-outputs: the graph's outputs and the --keep tensors, one .npz file."""
    if args.save_outputs:
        from ..inputs.user_data import save_arrays

        save_arrays(args.save_outputs, outputs)
        print(f"Saved {', '.join(outputs)} to {args.save_outputs}", file=sys.stderr)


# Runs of at least this many chunks in all report progress even when stderr is not a terminal.
MANY_CHUNKS = 64


def _progress(runner, batch: int, passes: int):
    """A progress bar on stderr: redrawn in place on a terminal; in a log, a plain
    line per quarter for runs of many chunks, and nothing for short ones."""
    from .progress import ProgressBar

    return ProgressBar(sys.stderr, plain_lines=runner.chunks_for(batch) * passes >= MANY_CHUNKS)


def _write_json(path: str, payload: dict) -> None:
    from ..core.files import write_atomic
    from ..report.jsonout import dumps

    write_atomic(path, dumps(payload))


def cmd_run(args) -> int:
    from ..report import timing as reports
    from ..verify.check import agreement, top1
    from ..core.files import write_atomic

    slots = _device_slots(args)
    looped = _kernel_loops(args, poison=False)
    if looped is not None:
        return looped
    loaded = _load(args)
    devices = _make_devices(args, loaded, slots) if slots else None
    runner = devices.runners[0] if devices else _make_runner(args, loaded)
    model, batch, on_gpu = loaded.model, loaded.batch, runner.device.is_cuda
    # on a GPU the data lands in pinned memory, so the run copies it by DMA without staging
    inputs = _inputs(args, loaded, pinned=on_gpu)
    runner.check_keep(args.keep or (), "--keep")  # before the run starts
    if not on_gpu:
        print("No CUDA device: plugin steps run the numpy reference backend on the CPU.", file=sys.stderr)
    if inputs.random_weights:
        print(f"Conv weights {', '.join(inputs.random_weights)} are graph inputs: this run fills them with random data", file=sys.stderr)
    timing = RUN_TIMING["gpu" if on_gpu else "cpu"]
    warmup = timing["warmup"] if args.warmup is None else args.warmup
    repeat = timing["repeat"] if args.repeat is None else args.repeat
    bar = _progress(runner, batch, warmup + repeat)
    try:
        measured = (devices or runner).profile(inputs.feeds, warmup, repeat, keep=tuple(args.keep or ()), progress=bar)
    finally:
        bar.close()
    # with --devices: the first device's profile gives the step table, and the last pass holds every output
    profile, last = (measured.first, measured.last) if devices else (measured, measured.result)
    _save_outputs(args, last.outputs | last.kept)

    extra = {"data": inputs.source}
    ours = last.outputs[model.outputs[0]]
    predicted = top1(ours, batch)
    if predicted is not None and inputs.labels is not None:
        extra["accuracy"] = float((predicted == inputs.labels).mean())
    if not args.no_compare:
        extra["agreement"] = agreement(runner.describe(batch) if devices else profile.plan, inputs.feeds, ours)

    result = reports.build_report(profile, warmup, extra)
    if devices:
        import statistics

        result = reports.add_devices(result, measured.rows(), statistics.median(measured.total_ms))
    print(reports.format_text(result, args.wide))
    _warn_cpu_provider(profile)
    if args.json:
        _write_json(args.json, result)
    if args.csv:
        write_atomic(args.csv, reports.to_csv(result["steps"]))
    if args.trace:
        from ..report import trace

        write_atomic(args.trace, trace.dumps(trace.build_trace(profile)))
    compared = extra.get("agreement")
    return 1 if compared is not None and not compared["passed"] else 0  # exit status 1 is for a failed comparison alone


def _warn_cpu_provider(profile) -> None:
    """One line when plugin steps ran on the GPU but onnxruntime's on the CPU: what it cost, and the fix."""
    from ..gpu.cuda import runtime_major
    from .ort_builds import cpu_provider_warning

    line = cpu_provider_warning(profile, runtime_major() if profile.plan.device.is_cuda else None)
    if line:
        print(f"opplugin: {line}", file=sys.stderr)


def cmd_check(args) -> int:
    from ..verify.check import build_check_report, check, check_chunks, format_check
    from .progress import ProgressBar
    from ..report.timing import format_devices
    from ..runtime.multi_device import DevicesTally

    slots = _device_slots(args)
    looped = _kernel_loops(args, poison=True)
    if looped is not None:
        return looped
    loaded = _load(args)
    devices = _make_devices(args, loaded, slots, poison=True) if slots else None
    runner = devices.runners[0] if devices else _make_runner(args, loaded, poison=True)
    model, batch = loaded.model, loaded.batch
    inputs = _inputs(args, loaded, pinned=runner.device.is_cuda)
    runner.check_keep(args.keep or (), "--keep")  # before the run starts
    where = runner.device.name if runner.device.is_cuda else "CPU (numpy reference backend; no CUDA device)"
    if devices:
        where += f", split over {', '.join(devices.labels)}"
    tally = DevicesTally(devices) if devices else None
    run = tally.run if tally else runner.run
    print(f"Checking {model.name}, batch {batch}, on {where}, against onnxruntime CPU; inputs: {inputs.source}")
    plan = runner.describe(batch)
    passes = check_chunks(plan, batch, chunk=args.check_chunk)
    if len(passes) > 1:
        print(f"Compared in {len(passes)} passes of up to {passes[0].stop:,} images, to bound host memory")
    print()
    # several passes take a while: a bar on a terminal; in a log, a line per quarter once
    # there are enough passes for the quarters to fall in different ones
    bar = ProgressBar(sys.stderr, plain_lines=len(passes) >= 4)
    try:
        saved = SavedPieces(run, model.outputs, tuple(args.keep or ())) if args.save_outputs else None
        result = check(saved.run if saved else run, plan, inputs.feeds, inputs.labels, args.atol, args.rtol, chunk=passes[0].stop, progress=bar)
    finally:
        bar.close()
    if saved is not None:
        _save_outputs(args, saved.arrays())
    verdicts, steps_alone = None, None
    if not result.passed:  # each step alone, judged by float64 where it differs from onnxruntime
        from ..verify.first_bad import ISOLATION_IMAGES, arbitrate, format_verdicts, isolate_steps, verdicts_as_json

        verdicts = isolate_steps(runner, inputs.feeds, result, args.atol, args.rtol)
        result = arbitrate(result, verdicts)
        steps_alone = verdicts_as_json(verdicts, min(ISOLATION_IMAGES, batch))
    print(format_check(result, args.atol, args.rtol, args.wide))
    split = _devices_section(tally)
    if split:
        print()
        print("\n".join(format_devices(split)))
    if verdicts is not None:
        print()
        print(format_verdicts(verdicts, min(ISOLATION_IMAGES, batch)))
    if args.json:
        _write_json(args.json, build_check_report(result, plan, args.atol, args.rtol, inputs.source, steps_alone) | split)
    return 0 if result.passed else 1


def _devices_section(tally) -> dict:
    """check --devices: each device's images and time over the passes, and the images/s of them all
    (report.add_devices' keys); {} without --devices."""
    if tally is None:
        return {}
    from ..report.timing import add_devices

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
        import numpy as np

        if len(self.pieces) == 1:
            return self.pieces[0]
        return {name: np.concatenate([piece[name] for piece in self.pieces]) for name in self.names}


def cmd_plan(args) -> int:
    from ..plan.partition import make_plan
    from ..report.plan import build_plan_report, format_plan
    from ..runtime.plan_record import record_plan_alone
    from .kernel_tools.cli_support import compile_user_kernels, plan_lines

    loaded = _load(args, free_batch_default=1)
    registry = _user_registry(args, loaded.device)
    plan = make_plan(loaded.model, loaded.batch, loaded.device, registry)
    uses = compile_user_kernels(plan, registry)  # compiles the --kernel files: their errors come before any output
    record = record_plan_alone(plan, {"Conv": args.variant} if args.variant else None)
    print(format_plan(record, args.wide))
    if uses:
        print("\n".join(plan_lines(plan, registry, uses)))
    if args.json:
        _write_json(args.json, build_plan_report(record, [use.as_json() for use in uses]))
    return 0


def cmd_tune(args) -> int:
    from ..lab.tune import build_tune_report, format_report, tune

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    from ..user_kernels.flags import parse_kernels

    loaded = _load(args)
    report = tune(loaded.model, loaded.batch, args.device, progress=say, kernels=parse_kernels(args.kernel))
    print(format_report(report))
    if args.json:
        _write_json(args.json, build_tune_report(report))
    return 0


def cmd_bench(args) -> int:
    if args.cuda_graphs is not None and (args.e2e or args.scaling is not None or args.suite == "gemm"):
        raise InputError("--cuda-graphs / --no-cuda-graphs applies to the Conv suites (--suite models or cnn): "
                         "--e2e times opplugin both ways, --scaling and --suite gemm time eager calls")
    if args.scaling is None and (args.devices or args.plot):
        raise InputError(f"{'--devices' if args.devices else '--plot'} applies to bench --scaling")
    if args.scaling is not None:
        if args.e2e:
            raise InputError("--scaling and --e2e are two benchmarks; give one")
        from ..lab import scaling

        return scaling.main_from_args(args)
    if args.e2e:
        from ..lab import e2e

        return e2e.main_from_args(args)
    if args.suite == "gemm":
        from ..lab.gemm_bench import main_from_args
    else:
        from ..lab.bench import main_from_args

    return main_from_args(args)


def cmd_new(args) -> int:
    from .kernel_tools.cli_support import cmd_new as new

    return new(args)


COMMANDS = {"run": cmd_run, "check": cmd_check, "plan": cmd_plan, "tune": cmd_tune, "bench": cmd_bench, "new": cmd_new}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        from .file_guard import stdout_outputs
        from ..core.files import human_text_to_stderr

        if not stdout_outputs(args):
            return _run_command(args)
        with human_text_to_stderr():  # the report is standard output's: the rest goes to stderr
            return _run_command(args)
    except BrokenPipeError:
        return _closed_pipe()
    except OpPluginError as err:
        # the first line says it all; what follows (a compiler's log) is detail
        print(err if err.located else f"opplugin: error: {err}", file=sys.stderr)
        if err.abandon_process:  # a hung kernel: exiting normally would wait for the GPU forever
            sys.stderr.flush()
            os._exit(2)
        return 2
    except Exception as err:
        from ..gpu.cuda import is_out_of_memory
        from ..errors import first_line

        if not is_out_of_memory(err):
            return _internal_error()
        # an allocation outside a run (the input arrays, pinned or not)
        print(f"opplugin: error: out of memory: {first_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("opplugin: interrupted", file=sys.stderr)
        return 130


def _run_command(args) -> int:
    from .ort_builds import both_builds_warning, require_onnxruntime

    require_onnxruntime()
    if (both := both_builds_warning()) is not None:
        print(f"opplugin: warning: {both}", file=sys.stderr)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: provider-discovery warnings are not the user's business
    status = COMMANDS[args.command](args)
    sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at the interpreter's exit
    return status


# The exit status of a command whose reader closed standard output (`opplugin check | head -1`):
# 128 + SIGPIPE, as a Unix tool killed by the signal reports it to the shell.
CLOSED_PIPE = 141


def _closed_pipe() -> int:
    """The reader of standard output has gone: stop quietly. Standard output then points at
    /dev/null, so that the interpreter's last flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass
    return CLOSED_PIPE


# Exit status of a failure opplugin did not foresee: not 1, which scripts read as a failed comparison.
INTERNAL_ERROR = 3


def _internal_error() -> int:
    """A bug, not the user's input: the traceback for the report, then a line that says so."""
    import traceback

    traceback.print_exc()
    print("opplugin: internal error (a bug in opplugin; the traceback above helps to report it)", file=sys.stderr)
    return INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
