"""The argument groups the commands share, after Polygraphy's: each group is a frozen
dataclass that adds its flags to a command's parser (`add`) and reads them back from
the parsed flags with every value checked (`from_args`), so a flag is declared, read and
checked in one place. A command's options are these groups and its own flags (run.py,
check.py, plan.py, tune.py; bench.py takes timing and kernels, and has flags of its own),
and nothing past the command line sees argparse's Namespace.

A group that a command takes only in part (plan has none of the flags that say how a run runs,
tune no --input-shape) is told so by a parameter of `add`, which offers only the flags the command
takes (any other is argparse's "unrecognized arguments") and gives those it leaves out their
defaults, so that `from_args` reads every command alike.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from ..errors import InputError, positive_int
from ..graph.model import BUNDLED_MODELS, DYNAMIC_BATCH_CPU, DYNAMIC_BATCH_GPU, SHIPPED_BATCH
from ..inputs.user_data import ImageOptions, parse_input_shapes, parse_pair
from ..plan.precision import HELP as PRECISION_HELP, MIXED, MIXED_LOW, checked_precision
from ..runtime.runner import DEFAULT_STREAMS
from ..user_kernels.flags import parse_kernels
from ..verify.check import DEFAULT_ATOL, DEFAULT_CHECK_BYTES, DEFAULT_RTOL, REDUCED_TOLERANCE_UNITS, default_tolerance
from ..verify.mixed_precision import Budget

DEFAULT_MODEL = "lenet86"
# the batch a command runs without --batch (graph.model.choose_batch), for the flag's help
DEFAULT_BATCH = (f"the model's own fixed batch; {SHIPPED_BATCH} for the shipped models; "
                 f"else {DYNAMIC_BATCH_GPU} on a GPU, {DYNAMIC_BATCH_CPU} on the CPU")
KERNEL_HELP = "run your own kernel source for an op type, e.g. --kernel Conv=my_conv.cu (opplugin new conv my_conv.cu writes a starter)"

Outputs = tuple[tuple[str, str], ...]  # (flag, path) of each file a command writes


@dataclass(frozen=True)
class ModelOptions:
    """The model, the batch it runs and its free dimensions: MODEL, --batch, --input-shape."""

    model: str = DEFAULT_MODEL  # an ONNX file or a shipped model's name
    batch: int | None = None  # None: the model's own fixed batch, else graph.model.choose_batch's default
    input_shapes: dict[str, list[int | None]] = field(default_factory=dict)  # --input-shape, by input name
    ops: tuple[str, ...] = ()  # --ops: Python files of custom-op declarations

    @staticmethod
    def add(parser: argparse.ArgumentParser, batch_help: str, *, input_shape: bool = True) -> None:
        parser.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                            help=f"ONNX file, or a shipped model: {', '.join(BUNDLED_MODELS)} (default %(default)s)")
        parser.add_argument("--batch", type=int, help=batch_help)
        parser.add_argument("--ops", action="append", metavar="FILE.py", default=None,
                            help="load custom-op declarations (opplugin.custom.CustomOp) from a Python file; repeatable")
        if not input_shape:
            parser.set_defaults(input_shape=None)
            return
        parser.add_argument("--input-shape", action="append", metavar="NAME:DIMS",
                            help="fix an input's free dimensions, e.g. input:Nx3x224x224 (N leaves the batch free; a number fixes it)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelOptions:
        if args.batch is not None:
            positive_int(args.batch, "--batch")
        return cls(args.model, args.batch, parse_input_shapes(args.input_shape), tuple(args.ops or ()))


@dataclass(frozen=True)
class RunnerOptions:
    """Where plugin steps run and how the runner runs them: --device, --variant, --precision with --budget for
    mixed (on run and plan: check's --precision and --budget are its own, an emulation), and on run and check
    (which run the plan) --chunk, --streams, --cuda-graphs and --devices."""

    device: str = "auto"  # auto: the GPU when there is one
    variant: str | None = None  # --variant as typed: a Conv variant, or OP=VARIANT pairs joined by spaces
    chunk: int | None = None  # None: from free device memory
    streams: int | None = None  # None: the runner's default
    cuda_graphs: bool | None = None  # None: neither flag typed (graphs where there is a GPU); True: --cuda-graphs
    devices: str | None = None  # --devices as typed: made into device slots as the command starts (it asks CUDA)
    precision: str = "fp32"  # --precision: the steps with a kernel in it run in it (plan/precision.py)
    budget: Budget | None = None  # --budget, with --precision mixed alone: what keeps nodes in FP32 (cli/budget.py)

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, devices: bool = False, runs: bool = True, precision: bool = True) -> None:
        """`runs`: the command runs the plan (run, check), so how it runs it is its to say; plan takes
        only what changes the plan (--device, --variant, --precision). `precision`: the command takes
        --precision as the runner's (check's is its own)."""
        parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the GPU when there is one")
        parser.add_argument("--variant", action="append", metavar="[OP=]VARIANT",
                            help="a Conv kernel variant (baseline, const, const_mo, ...), or OP=VARIANT for another op "
                                 "(example.ops::Swish=cupy picks a custom op's implementation); repeatable; wins over --precision "
                                 "for its op; default: what `opplugin tune` chose on this GPU, else each op's own rule of thumb")
        if precision:
            parser.add_argument("--precision", dest="run_precision", default="fp32", metavar="fp32|tf32|fp16|bf16|mixed",
                                help=PRECISION_HELP)
            parser.add_argument("--budget", dest="run_budget", metavar="rel_l2=E|top1=A",
                                help="with --precision mixed: the outputs' relative L2 error against float64 at most E, or their "
                                     "top-1 agreement with it at least A, on the first images of the inputs (emulated, as "
                                     "check --precision mixed finds it); the steps computing the nodes it keeps stay FP32")
        else:
            parser.set_defaults(run_precision="fp32", run_budget=None)
        if not runs:
            parser.set_defaults(chunk=None, streams=None, cuda_graphs=None, devices=None)
            return
        parser.add_argument("--chunk", type=int, help="images per chunk on the device (default: from free device memory)")
        parser.add_argument("--streams", type=int, help=f"chunks in flight at once on a GPU (default {DEFAULT_STREAMS})")
        parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                            help="replay each run of plugin steps as one CUDA graph after the first pass: less host time per step, "
                                 "each step still timed (default on a GPU; --no-cuda-graphs runs every step eagerly)")
        if not devices:
            parser.set_defaults(devices=None)
            return
        parser.add_argument("--devices", metavar="all|0,1,...",
                            help="split the batch in order over these CUDA devices, a runner on each, all at once "
                                 "(all: every GPU; an id may repeat); the report gains a row per device")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunnerOptions:
        for value, flag in ((args.chunk, "--chunk"), (args.streams, "--streams")):
            if value is not None:
                positive_int(value, flag)
        if args.devices is not None and args.device == "cpu":
            raise InputError("--devices splits the batch over CUDA devices; leave out --device cpu")
        given = args.variant or []
        parse_variants(given)
        precision = checked_precision(args.run_precision, "--precision")
        return cls(args.device, " ".join(given) or None, args.chunk, args.streams, args.cuda_graphs, args.devices,
                   precision, _budget(precision, args.run_budget))

    @property
    def variants(self) -> dict[str, str] | None:
        """--variant as the runner takes it: {op key: variant}."""
        return parse_variants(self.variant.split()) if self.variant else None


def _budget(precision: str, text: str | None) -> Budget | None:
    """--budget, read: it comes with --precision mixed, and mixed with it; an InputError in one line otherwise."""
    if precision == MIXED and text is None:
        raise InputError("--precision mixed needs --budget rel_l2=E or top1=A: what the outputs must meet against float64")
    if text is not None and precision != MIXED:
        raise InputError(f"--budget {text}: applies to --precision mixed, not {precision}")
    return Budget.parse(text) if text is not None else None


def parse_variants(values: list[str]) -> dict[str, str]:
    """{op key: variant} from --variant values: VARIANT alone is Conv's; InputError for an empty part or an op named twice."""
    variants: dict[str, str] = {}
    for value in values:
        op, _, variant = value.partition("=") if "=" in value else ("Conv", "", value)  # a variant's own name may hold "="
        if not variant or not op.strip():
            raise InputError(f"--variant {value!r}: give VARIANT (a Conv variant) or OP=VARIANT")
        if op in variants:
            raise InputError(f"--variant names {op} twice ({variants[op]}, {variant}); give one")
        variants[op] = variant
    return variants


@dataclass(frozen=True)
class DataOptions:
    """What a run is fed and what it keeps: --data and --seed (the bundled test set or random
    data), or the user's own inputs (--load-inputs, or --images with --resize, --mean and
    --std); --save-outputs with --keep. plan takes what changes a plan alone: the user's inputs
    (they fix the model's free sizes), --resize, and --keep (the fusions it gives up)."""

    source: str = "auto"  # --data: auto | fashion-mnist | random
    seed: int = 0
    load_inputs: str | None = None
    images: str | None = None  # a folder
    resize: str | None = None  # H,W as typed (checked here); the images' loader reads it, --mean and --std
    mean: str | None = None
    std: str | None = None
    save_outputs: str | None = None
    keep: tuple[str, ...] = ()

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, runs: bool = True) -> None:
        """`runs`: the command runs the model on the data (run, check); else (plan) the data only fixes
        the model's sizes, and --keep says which tensors the plan must leave visible."""
        if runs:
            parser.add_argument("--data", default="auto", help="auto | fashion-mnist | random (auto: the bundled test set for shipped models)")
            parser.add_argument("--seed", type=int, default=0, help="seed for --data random, any integer (default %(default)s)")
        else:
            parser.set_defaults(data="auto", seed=0, mean=None, std=None, save_outputs=None)
        which = "inputs" if runs else "the inputs' sizes"
        parser.add_argument("--load-inputs", metavar="FILE", help=f"{which} from a .npz file (an array per input name) or a .npy file (one-input models)")
        parser.add_argument("--images", metavar="FOLDER", help=f"{which} from the PNG and JPEG files of a folder, in name order (needs Pillow)")
        parser.add_argument("--resize", metavar="H,W", help="with --images: resize each image to H x W (default: the model's input size)")
        if not runs:
            parser.add_argument("--keep", action="append", metavar="TENSOR",
                                help="plan so that a run can keep this tensor: a fusion or load-time rewrite that would hide it is given up, "
                                     "and said so; repeatable")
            return
        parser.add_argument("--mean", metavar="M[,M,M]", help="with --images: subtracted per channel after scaling pixels to [0, 1] (default 0)")
        parser.add_argument("--std", metavar="S[,S,S]", help="with --images: divided per channel after the mean (default 1)")
        parser.add_argument("--save-outputs", metavar="FILE.npz", help="write the graph's outputs (and --keep tensors) to a .npz file")
        parser.add_argument("--keep", action="append", metavar="TENSOR",
                            help="with --save-outputs: also save this tensor, any the model computes (a fusion or load-time rewrite that "
                                 "would hide it is given up); repeatable")

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, runs: bool = True) -> DataOptions:
        """`runs` as for add: --keep needs --save-outputs only where the command saves what it keeps."""
        given = [flag for value, flag in ((args.load_inputs, "--load-inputs"), (args.images, "--images")) if value]
        if args.data != "auto":
            given.append(f"--data {args.data}")
        if len(given) > 1:
            raise InputError(f"{' and '.join(given)} both say where the inputs come from; give one")
        image_flags = [flag for value, flag in ((args.resize, "--resize"), (args.mean, "--mean"), (args.std, "--std")) if value]
        if image_flags and not args.images:
            raise InputError(f"{', '.join(image_flags)} apply to --images FOLDER")
        if runs and args.keep and not args.save_outputs:
            raise InputError("--keep names tensors for --save-outputs FILE.npz; give that file too")
        parse_pair(args.resize, "--resize")  # --mean and --std are checked against the images' channels, once they are read
        return cls(args.data, args.seed, args.load_inputs, args.images, args.resize, args.mean, args.std,
                   args.save_outputs, tuple(args.keep or ()))

    def image_options(self) -> ImageOptions:
        return ImageOptions(self.images, self.resize, self.mean, self.std)

    def outputs(self) -> Outputs:
        return (("--save-outputs", self.save_outputs),) if self.save_outputs else ()


@dataclass(frozen=True)
class TimingOptions:
    """--warmup untimed passes, then --repeat timed ones; None where a flag is not given:
    the command's default."""

    warmup: int | None = None
    repeat: int | None = None

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, warmup_help: str, repeat_help: str) -> None:
        parser.add_argument("--warmup", type=int, help=warmup_help)
        parser.add_argument("--repeat", type=int, help=repeat_help)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TimingOptions:
        if args.repeat is not None:
            positive_int(args.repeat, "--repeat")
        if args.warmup is not None:
            positive_int(args.warmup, "--warmup", allow_zero=True)
        return cls(args.warmup, args.repeat)

    def or_defaults(self, warmup: int, repeat: int) -> tuple[int, int]:
        """(warmup, repeat): each flag's value, or the default given for it."""
        return (warmup if self.warmup is None else self.warmup, repeat if self.repeat is None else self.repeat)


@dataclass(frozen=True)
class ToleranceOptions:
    """The pass rule against onnxruntime, --atol and --rtol (check's, run's, and --watch's on both),
    and on check the images it compares at a time, --check-chunk."""

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    check_chunk: int | None = None  # None: as many images as fit in DEFAULT_CHECK_BYTES of host memory
    widened: str | None = None  # the reduced precision whose default rule atol or rtol is (run --precision), if either

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, chunks: bool = True) -> None:
        """`chunks`: --check-chunk too (check, which compares every step's tensors; run compares the output alone,
        and its default rule widens with --precision: verify/check.default_tolerance)."""
        widened = "" if chunks else f"; under --precision P, {REDUCED_TOLERANCE_UNITS} units of P's roundoff"
        parser.add_argument("--atol", type=float, help=f"absolute tolerance (default {DEFAULT_ATOL:g}{widened})")
        parser.add_argument("--rtol", type=float, help=f"relative tolerance (default {DEFAULT_RTOL:g}{widened})")
        if not chunks:
            parser.set_defaults(check_chunk=None)
            return
        parser.add_argument("--check-chunk", type=int, metavar="N",
                            help=f"images compared with onnxruntime at a time (default: as many as fit in {DEFAULT_CHECK_BYTES >> 30} GiB of host memory)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, precision: str = "fp32") -> ToleranceOptions:
        """The flags given, the rest `precision`'s default rule (a run's --precision; check's is FP32's)."""
        if args.check_chunk is not None:
            positive_int(args.check_chunk, "--check-chunk")
        for value, flag in ((args.atol, "--atol"), (args.rtol, "--rtol")):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InputError(f"{flag} must be a finite number of at least 0, got {value:g}")
        precision = MIXED_LOW if precision == MIXED else precision  # a mixed run is held to its FP16 steps' rule
        atol, rtol = default_tolerance(precision)
        widened = precision if precision != "fp32" and (args.atol is None or args.rtol is None) else None
        return cls(atol if args.atol is None else args.atol, rtol if args.rtol is None else args.rtol, args.check_chunk, widened)

    @staticmethod
    def given(args: argparse.Namespace) -> bool:
        """Whether --atol or --rtol was given."""
        return args.atol is not None or args.rtol is not None


@dataclass(frozen=True)
class ReportOptions:
    """How a command gives its report: the width of its text (--wide) and the files it
    writes (--json; on run --csv and --trace too; on run and check --report, the HTML page).
    `-` is standard output for --json, --csv and --report."""

    wide: bool = False
    json: str | None = None
    csv: str | None = None
    trace: str | None = None
    html: str | None = None  # --report FILE.html

    @staticmethod
    def add(parser: argparse.ArgumentParser, json_help: str, *, wide: bool = False, csv_and_trace: bool = False,
            html_help: str | None = None) -> None:
        if wide:
            parser.add_argument("--wide", action="store_true", help="print long names and op chains in full (default: lines of about 160 characters)")
        else:
            parser.set_defaults(wide=False)
        parser.add_argument("--json", metavar="FILE", help=json_help)
        if html_help:
            parser.add_argument("--report", metavar="FILE.html", dest="html", help=html_help)
        else:
            parser.set_defaults(html=None)
        if not csv_and_trace:
            parser.set_defaults(csv=None, trace=None)
            return
        parser.add_argument("--csv", metavar="FILE", help="also write the step table as CSV (- for standard output)")
        parser.add_argument("--trace", metavar="FILE",
                            help="also write the last timed run's timeline as a Chrome/Perfetto trace (open in ui.perfetto.dev)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReportOptions:
        return cls(args.wide, args.json, args.csv, args.trace, args.html)

    def outputs(self) -> Outputs:
        named = (("--json", self.json), ("--csv", self.csv), ("--trace", self.trace), ("--report", self.html))
        return tuple((flag, path) for flag, path in named if path is not None)


@dataclass(frozen=True)
class KernelOptions:
    """The user's kernel sources: --kernel OP=FILE.cu on every command that runs kernels;
    --sanitize and --watch on run and check."""

    files: tuple[tuple[str, str], ...] = ()  # (op type, path) of each --kernel, in the order given
    sanitize: bool = False
    watch: bool = False

    @staticmethod
    def add(parser: argparse.ArgumentParser, *, loops: bool = False) -> None:
        parser.add_argument("--kernel", action="append", metavar="OP=FILE.cu", default=None, help=KERNEL_HELP)
        if not loops:
            parser.set_defaults(sanitize=False, watch=False)
            return
        parser.add_argument("--sanitize", action="store_true",
                            help="run each user kernel (--kernel files; --ops declarations' CUDA C and Triton kernels) on a small batch under compute-sanitizer (memcheck, racecheck, initcheck) first")
        parser.add_argument("--watch", action="store_true",
                            help="recompile, re-check and re-time the --kernel files and the --ops declarations' CUDA C files on each save (Ctrl-C stops)")

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, one_per_op: bool = True) -> KernelOptions:
        """`one_per_op`: a second file for one op type is refused (bench compares several)."""
        values = args.kernel or []
        if one_per_op:
            files = tuple(parse_kernels(values).items())
        else:
            files = tuple(item for value in values for item in parse_kernels([value]).items())
        return cls(files, args.sanitize, args.watch)

    @property
    def by_op(self) -> dict[str, str]:
        """{"Conv": "my_conv.cu"}: the files by op type, as the runner and the tuner take them."""
        return dict(self.files)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for _, path in self.files)
