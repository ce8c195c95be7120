"""`opplugin bench`: its flags, read into BenchOptions, and the front end of the lab's benchmarks:
each one's inputs from the options, its text, its --json file, its --report page (lab/bench_page.py)
and its exit status.

- the Conv suites (--suite models or cnn): lab/bench.py
- --suite gemm: lab/gemm_bench.py
- --suite attention: lab/attention_bench.py
- --e2e MODEL ...: lab/e2e.py
- --scaling [MODEL]: lab/scaling.py
- --custom MODEL --ops FILE.py: lab/custom_tune.py (each custom node's kernels beside its reference)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..core.files import write_atomic
from ..errors import DeviceError, InputError, batch_sizes
from ..gpu import cuda
from ..graph.model import SHIPPED_MODELS, load_model
from ..lab import attention_bench, bench as conv_bench, bench_page, bench_text, e2e as e2e_bench, e2e_table, gemm_bench, scaling as scaling_bench, scaling_text
from ..lab.cnn_layers import SUITE_BATCHES
from ..lab.trial import BENCH_REPEAT, BENCH_WARMUP
from ..plan.precision import UNIFORM_PRECISIONS, checked_precision
from ..report.jsonout import json_safe
from .file_guard import CommandFiles
from .options import KernelOptions, ReportOptions, TimingOptions
from .output import write_json

# the batch sizes of each benchmark without --batches
DEFAULT_BATCHES = {"models": conv_bench.DEFAULT_BATCHES, "cnn": SUITE_BATCHES, "gemm": gemm_bench.BATCHES, "attention": attention_bench.BATCHES,
                   "e2e": e2e_bench.DEFAULT_BATCHES, "scaling": scaling_bench.DEFAULT_BATCHES, "custom": (1, 1000)}


def _listed(values) -> str:
    return " ".join(map(str, values))


@dataclass(frozen=True)
class BenchOptions:
    """bench's options: which benchmark, on what, at which batches, and its files."""

    benchmark: str  # models | cnn (the Conv suites) | gemm | e2e | scaling
    batches: tuple[int, ...]  # --batches, or the benchmark's own
    timing: TimingOptions
    models: tuple[str, ...] | None = None  # --models; None: the lab's default pair
    all_configs: bool = False
    cuda_graphs: bool | None = None  # None: neither flag typed (the Conv suites time graphs)
    families: tuple[str, ...] | None = None  # None: every family
    e2e: tuple[str, ...] = ()  # the models of --e2e
    peers: tuple[str, ...] = e2e_bench.PEERS  # with --e2e
    precision: str = "fp32"  # with --e2e: what opplugin and every peer run in; the Conv suites take fp32, fp16, bf16
    scaling: str | None = None  # the model of --scaling
    devices: tuple[str, ...] | None = None  # with --scaling: the device lists; None: 0, then 0,1, ... up to every GPU
    kernels: tuple[str, ...] = ()  # --kernel Conv=FILE: the files the Conv suites bench beside the families
    custom: str | None = None  # --custom MODEL: its custom nodes' kernels beside their reference
    ops: tuple[str, ...] = ()  # --ops: the declaration files --custom reads
    json: str | None = None
    plot: str | None = None  # with --scaling
    html: str | None = None  # --report FILE.html

    def files(self) -> CommandFiles:
        # without --models every shipped model counts as read, whichever benchmark runs
        models = ((self.scaling,) if self.scaling is not None else ()) + (self.models or SHIPPED_MODELS) + self.e2e
        models += (self.custom,) if self.custom is not None else ()
        named = (("--json", self.json), ("--plot", self.plot), ("--report", self.html))
        outputs = tuple((flag, path) for flag, path in named if path is not None)
        return CommandFiles(outputs, tuple(models), self.kernels, self.ops)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help=f"shipped model names or ONNX files (default {_listed(conv_bench.Options.models)})")
    parser.add_argument(
        "--suite", choices=("models", "cnn", "gemm", "attention"), default="models",
        help="models: the Conv steps of --models; cnn: Conv layers of VGG, ResNet and MobileNetV2; "
        "gemm: the seeds' fully connected layers against cuBLAS; attention: the fused attention on ViT and Swin "
        "shapes against PyTorch's scaled_dot_product_attention (default %(default)s)",
    )
    parser.add_argument("--batches", nargs="+", metavar="N",
                        help=f"batch sizes, space or comma separated (default {_listed(conv_bench.DEFAULT_BATCHES)}; "
                        f"{_listed(SUITE_BATCHES)} with --suite cnn; {_listed(gemm_bench.BATCHES)} with --suite gemm; "
                        f"{_listed(e2e_bench.DEFAULT_BATCHES)} with --e2e)")
    TimingOptions.add(parser, warmup_help=f"untimed calls before timing (default {BENCH_WARMUP})",
                      repeat_help=f"timed samples; the tables give medians (default {BENCH_REPEAT})")
    parser.add_argument("--all-configs", action="store_true", help="also time every configuration each family offers")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                        help="time each Conv candidate replayed from a CUDA graph of back-to-back calls, as run launches its steps "
                             "(default; --no-cuda-graphs times eager calls, the host's launch cost included)")
    parser.add_argument("--families", nargs="+", metavar="FAMILY", help="time only these variant families (default all; the peers always run)")
    ReportOptions.add(parser, "also write every measurement as JSON",
                      html_help="also write every measurement as one self-contained HTML page to open in a browser: a table of "
                                "every row and a chart of the candidates' times (the Conv suites: a roofline too)")
    parser.add_argument("--e2e", nargs="+", metavar="MODEL", help="time these ONNX models end to end beside their peers (PyTorch eager, in a CUDA graph and torch.compile; onnxruntime CUDA, with and without its CUDA graph) instead")
    parser.add_argument("--peers", nargs="+", choices=e2e_bench.PEERS, metavar="PEER",
                        help=f"with --e2e: time only these peers ({', '.join(e2e_bench.PEERS)}; default all); opplugin's rows always run")
    parser.add_argument("--precision", metavar="fp32|tf32|fp16|bf16",
                        help="with --e2e: run opplugin and every peer in this precision (default fp32, TF32 off): tf32 switches "
                             "TF32 on; fp16 and bf16 convert PyTorch's module (channels_last too) and onnxruntime's model (fp16 "
                             "only, by onnxconverter-common), and check every output against the model in float64. With the "
                             "Conv suites, fp16 or bf16: each Conv by the family --precision runs it in (wg_fp16, wg_bf16; dw_fp16, "
                             "dw_bf16 for a depthwise one) beside cuDNN on FP16 or BF16 tensors in channels_last, each output "
                             "checked per element against float64")
    parser.add_argument("--scaling", nargs="?", const=scaling_bench.DEFAULT_MODEL, metavar="MODEL",
                        help=f"instead: images/s of one batch split over 1 to N devices, host to host from pinned memory, and the "
                             f"scaling efficiency (default model {scaling_bench.DEFAULT_MODEL}, --batches {scaling_bench.DEFAULT_BATCHES[0]})")
    parser.add_argument("--devices", nargs="+", metavar="all|0,1,...",
                        help="with --scaling: the device lists to time, each as in run --devices, one of them a single device "
                             "(default 0, 0,1, ... up to every GPU; 0,0 puts two runners on one GPU)")
    parser.add_argument("--plot", metavar="FILE.png", help="with --scaling: also draw images/s and efficiency against the devices (needs matplotlib)")
    parser.add_argument("--custom", metavar="MODEL", help="instead: each custom node's kernels checked against its "
                        "op's float64 reference, then timed beside it (needs --ops)")
    parser.add_argument("--ops", action="append", metavar="FILE.py", default=None, help="with --custom: the custom-op declarations")
    KernelOptions.add(parser)


def read(args: argparse.Namespace) -> BenchOptions:
    timing = TimingOptions.from_args(args)
    if args.cuda_graphs is not None and (args.e2e or args.scaling is not None or args.suite in ("gemm", "attention")):
        raise InputError("--cuda-graphs / --no-cuda-graphs applies to the Conv suites (--suite models or cnn): "
                         "--e2e times opplugin both ways, --scaling, --suite gemm and --suite attention time eager calls")
    if args.scaling is None and (args.devices or args.plot):
        raise InputError(f"{'--devices' if args.devices else '--plot'} applies to bench --scaling")
    if args.scaling is not None and args.e2e:
        raise InputError("--scaling and --e2e are two benchmarks; give one")
    if bool(args.custom) != bool(args.ops):
        raise InputError("bench --custom MODEL needs --ops FILE.py, and --ops applies to bench --custom")
    if args.custom and (args.e2e or args.scaling is not None):
        raise InputError("--custom, --e2e and --scaling are three benchmarks; give one")
    benchmark = "custom" if args.custom else "scaling" if args.scaling is not None else "e2e" if args.e2e else args.suite
    if args.precision is not None and benchmark not in ("e2e", *conv_bench.SUITES):
        raise InputError("--precision applies to bench --e2e and the Conv suites (--suite models or cnn)")
    kernels = KernelOptions.from_args(args, one_per_op=False)  # the Conv suites may compare several
    others = [op for op, _ in kernels.files if op != "Conv"]
    if benchmark in ("models", "cnn") and others:
        raise InputError(f"bench times Conv steps; --kernel {others[0]}=... has nothing to run here")
    options = BenchOptions(benchmark, tuple(batch_sizes(args.batches, DEFAULT_BATCHES[benchmark])), timing,
                           models=tuple(args.models) if args.models else None, all_configs=args.all_configs,
                           cuda_graphs=args.cuda_graphs, families=tuple(args.families) if args.families else None,
                           e2e=tuple(args.e2e or ()), peers=tuple(args.peers or e2e_bench.PEERS),
                           precision=checked_precision(args.precision or "fp32", "--precision", UNIFORM_PRECISIONS), scaling=args.scaling,
                           devices=tuple(args.devices) if args.devices else None, kernels=kernels.paths, json=args.json, plot=args.plot, html=args.html,
                           custom=args.custom, ops=tuple(args.ops or ()))
    if benchmark in conv_bench.SUITES:
        conv_options(options).validate()  # what the Conv suites refuse (--precision tf32, say) is refused as it is read
    return options


def execute(options: BenchOptions) -> int:
    """The benchmark's exit status: 0 when everything it measured was correct, 1 otherwise."""
    if options.benchmark == "scaling":
        return _scaling(options)
    if options.benchmark == "custom":
        return _custom(options)
    if options.benchmark == "e2e":
        return _e2e(options)
    if options.benchmark == "gemm":
        return _gemm(options)
    if options.benchmark == "attention":
        return _attention(options)
    return _conv(options)


def _page(options: BenchOptions, payload: dict) -> None:
    """--report: the benchmark's payload as one HTML page (nothing without the flag)."""
    if options.html:
        write_atomic(options.html, bench_page.bench_page(options.benchmark, payload))


def conv_options(options: BenchOptions) -> conv_bench.Options:
    """The Conv suites' options from bench's."""
    warmup, repeat = options.timing.or_defaults(BENCH_WARMUP, BENCH_REPEAT)
    return conv_bench.Options(batches=list(options.batches), warmup=warmup, repeat=repeat, all_configs=options.all_configs,
                              models=list(options.models or conv_bench.Options.models), suite=options.benchmark,
                              families=list(options.families) if options.families else None, kernels=list(options.kernels),
                              cuda_graphs=options.cuda_graphs is not False, precision=options.precision)


def _conv(options: BenchOptions) -> int:
    """bench --suite models | cnn: 1 when some candidate gave wrong results (it was not timed)."""
    lab_options = conv_options(options)
    lab_options.validate()

    def write(payload: dict) -> None:
        write_json(options.json, payload)

    payload = json_safe(conv_bench.run_bench(lab_options, checkpoint=write if options.json else None))
    print(bench_text.format_text(payload), end="")
    if options.json:
        write(payload)
    _page(options, payload)
    wrong = conv_bench.wrong_rows(payload)
    if wrong:
        names = ", ".join(f"{r['name']} on {r['step']} @{r['batch']}" for r in wrong[:5])
        print(f"opplugin: {len(wrong)} candidate(s) gave wrong results and were not timed: {names}", file=sys.stderr)
    return 1 if wrong else 0


def _gemm(options: BenchOptions) -> int:
    """bench --suite gemm: 1 when some candidate was not correct."""
    warmup, repeat = options.timing.or_defaults(BENCH_WARMUP, BENCH_REPEAT)
    payload = gemm_bench.run_gemm_bench(list(options.batches), warmup, repeat, options.all_configs)
    print(gemm_bench.format_text(payload), end="")
    if options.json:
        write_json(options.json, payload)
    _page(options, payload)
    return 1 if any(r.get("rel_error", 0) > gemm_bench.TOLERANCE for r in payload["rows"]) else 0


def _attention(options: BenchOptions) -> int:
    """bench --suite attention: 1 when some candidate was not correct."""
    warmup, repeat = options.timing.or_defaults(BENCH_WARMUP, BENCH_REPEAT)
    payload = attention_bench.run_attention_bench(list(options.batches), warmup, repeat)
    print(attention_bench.format_text(payload), end="")
    if options.json:
        write_json(options.json, payload)
    _page(options, payload)
    return 1 if any(r["rel_error"] > attention_bench.TOLERANCE for r in payload["rows"]) else 0


def _e2e(options: BenchOptions) -> int:
    """bench --e2e MODEL ...: 1 when some candidate that ran was not correct, or opplugin did not run."""
    if not cuda.is_available():
        raise DeviceError("bench --e2e needs a CUDA device, and CuPy sees none")
    warmup, repeat = options.timing.or_defaults(BENCH_WARMUP, BENCH_REPEAT)

    def write(payload: dict) -> None:
        write_json(options.json, payload)

    payload = json_safe(e2e_bench.run_e2e(list(options.e2e), list(options.batches), warmup, repeat,
                                    checkpoint=write if options.json else None, peers=options.peers,
                                    precision=options.precision))
    print(e2e_table.format_text(payload), end="")
    if options.json:
        write(payload)
    _page(options, payload)
    return 1 if e2e_bench.failed(payload) else 0


def _custom(options: BenchOptions) -> int:
    """bench --custom MODEL: each custom node's kernels against its reference, then timed; 1 when one was wrong."""
    from ..gpu.device import current_cuda_device
    from ..lab.custom_tune import custom_steps, custom_table_lines, tune_custom_step
    from ..plan.partition import make_plan
    from .loading import load_declared

    if not cuda.is_available():
        raise DeviceError("bench --custom times kernels on a GPU, and CuPy sees none")
    model = load_declared(options.custom, options.ops)
    device, (warmup, repeat) = current_cuda_device(), options.timing.or_defaults(BENCH_WARMUP, BENCH_REPEAT)
    payload, wrong = {"model": model.name, "device": device.name, "batches": []}, 0
    for batch in options.batches:
        steps = custom_steps(make_plan(model, batch, device))
        if not steps:
            raise InputError(f"{model.name} has no custom node that --ops declares")
        tunings = [tune_custom_step(step, device, lambda line: print(line, file=sys.stderr, flush=True), warmup, repeat)
                   for step in steps]
        print(f"{model.name} at batch {batch} on {device.name}\n\n" + "\n".join(custom_table_lines(tunings)))
        wrong += sum(trial.status in ("incorrect", "failed") for t in tunings for trial in t.trials)
        payload["batches"].append({"batch": batch, "steps": [{"step": t.step, "op": t.op, "reference_host_ms": t.reference_ms,
                                                              "fastest": t.chosen.variant if t.chosen else None,
                                                              "implementations": [vars(trial) for trial in t.trials]}
                                                             for t in tunings]})
    payload = json_safe(payload)
    if options.json:
        write_json(options.json, payload)
    _page(options, payload)
    return 1 if wrong else 0


def _scaling(options: BenchOptions) -> int:
    """bench --scaling [MODEL]: 1 when some device list's outputs disagree with onnxruntime."""
    if options.plot:
        scaling_text.require_plotting()
    lists = scaling_bench.device_lists(list(options.devices) if options.devices else None)
    model = load_model(options.scaling)
    warmup, repeat = options.timing.or_defaults(scaling_bench.WARMUP, scaling_bench.REPEAT)
    payload = scaling_bench.run_scaling(model, list(options.batches), lists, warmup, repeat,
                                        say=lambda line: print(line, file=sys.stderr, flush=True))
    print(scaling_text.format_text(payload), end="")
    if options.json:
        write_json(options.json, payload)
    _page(options, payload)
    if options.plot:
        scaling_text.save_plot(payload, options.plot)
    return 1 if scaling_bench.failed(payload) else 0
