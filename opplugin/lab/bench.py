"""`opplugin bench`: every Conv variant of the shipped models and its peers, timed in
one process on this GPU, with this device's roofline beside each figure.

For each Conv step (and each fused Conv > activation > MaxPool chain) of the
chosen models, at each batch: every family registered in `families.FAMILIES`
(discovered at run time) with its heuristic configuration, and with
`all_configs` every configuration it offers; then the peers (cuDNN FP32 and
TF32 through PyTorch, onnxruntime's CUDA provider) when they are installed.
Every candidate goes through one trial (see trial.py): its output is checked
against the float64 oracle on images from both ends and the middle of the batch
(and for unwritten elements over the whole output, which starts as NaN) before
it is timed; one that fails is marked and never timed. The peers are checked
and timed the same way.

Under `precision` fp16 or bf16 (bench_precision.py) each Conv is timed alone (no
fused step), its candidates the family `run --precision` runs it in (its row says
why where that family has no kernel for the layer) and cuDNN in the same format,
each held to the format's element bound (format_bound.py); no floor is given, the
roofline being FP32's.

Ratios: x_floor = ms / floor (1.0 is the roofline), vs_baseline, vs_cudnn_fp32
and vs_cudnn (over cuDNN in the run's precision) are speed-ups (reference ms / ms).
"""
from __future__ import annotations

import dataclasses
import platform
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..core.number_formats import FP32
from ..core.texttable import spoken
from ..gpu import cuda
from ..gpu.device import CPU, current_cuda_device
from ..errors import DeviceError, InputError, PluginError, first_line, positive_int
from ..report.jsonout import header
from ..ops.conv import families
from ..ops.conv.epilogue import NONE, Epilogue
from ..ops.conv.families import Config
from ..ops.conv.families.base import ConvKernel, Family, Weights
from ..ops.conv.plugin import constant_weights, conv_spec, epilogue_of
from ..ops.conv.spec import ConvSpec
from . import graphed
from . import peers as peer_module
from . import roofline
from .bench_precision import SUITE_PRECISIONS, candidate_bound, cudnn_name, precision_families, precision_family, precision_pick
from .cnn_layers import LAYERS, layer_weights
from .format_bound import bound_words
from .streams import host_to_host
from .trial import BENCH_REPEAT, BENCH_WARMUP, EXACT_TOLERANCE, MIN_SAMPLE_MS, Capture, Problem, Trial, judge, median_ms, run_trial, time_call

# 2: the header every report shares (report/jsonout.py): device gains kind and memory_bytes;
#    model and batch are the lists of models and batch sizes measured
# 3: precision (fp32, fp16, bf16) and precision_summary; a step's cudnn_ms and a row's vs_cudnn (cuDNN in
#    the run's precision), a row's bound_fraction (its largest error over its element bound, 16-bit runs)
# 4: precision_summary's family is its families (wg_fp16 and dw_fp16: one a Conv)
SCHEMA = "opplugin-bench/4"
DEFAULT_BATCHES = (100, 1000, 10000)
SUITES = ("models", "cnn")
FP32_PEER_TOLERANCE = 1e-4  # cuDNN may pick Winograd or FFT algorithms, which round differently
INEXACT_TOLERANCE = 1e-2  # fp16 / tf32 arithmetic: its error is reported, and must still be small
# "all fused steps of the model together" targets (ms) at TARGET_BATCH, from the issue
FUSED_TOTAL_TARGETS_MS = {"lenet86": 2.0}
TARGET_BATCH = 10000

ROW_KEYS = (
    "step",
    "batch",
    "name",
    "kind",
    "family",
    "implementation",
    "exact",
    "exact_by",
    "heuristic",
    "status",
    "reason",
    "ms",
    "calls_per_sample",
    "timer",
    "gflops_per_s",
    "gb_per_s",
    "bytes",
    "floor_ms",
    "x_floor",
    "vs_baseline",
    "vs_cudnn_fp32",
    "vs_cudnn",
    "rel_error",
    "tolerance",
    "bound_fraction",
)
PAYLOAD_KEYS = (
    "schema", "opplugin_version", "device", "model", "batch", "precision", "complete", "versions", "settings", "roofline", "peers", "steps",
    "rows", "fused_totals", "suite_summary", "precision_summary", "streams",
)
STEP_KEYS = (
    "step", "model", "conv", "fused", "epilogue", "batch", "shape", "flops", "bytes", "floor_ms", "bound", "baseline_ms", "cudnn_fp32_ms",
    "cudnn_ms", "best", "best_ms", "default",
)


@dataclass
class Options:
    batches: Sequence[int] = DEFAULT_BATCHES
    warmup: int = BENCH_WARMUP
    repeat: int = BENCH_REPEAT
    all_configs: bool = False
    models: Sequence[str] = ("lenet86", "ece408_high")
    streams: bool = True  # the host-to-host streams comparison
    suite: str = "models"  # "models": the Conv steps of `models`; "cnn": the real-CNN layer set (cnn_layers.py)
    families: Sequence[str] | None = None  # time only these families (and the peers); None: all
    kernels: Sequence[str] = ()  # --kernel Conv=FILE files (any number), benched beside the families
    # time each candidate replayed from a CUDA graph, as a runner launches its steps by default
    # (the host's launch cost left out); False: eager calls, each paying it
    cuda_graphs: bool = True
    # fp16 or bf16: each Conv alone, by the family `run --precision` picks and by cuDNN in that format (bench_precision.py)
    precision: str = FP32

    def validate(self) -> None:
        if not self.batches:
            raise InputError("--batches needs at least one batch size")
        for batch in self.batches:
            positive_int(batch, "--batches")
        positive_int(self.repeat, "--repeat")
        positive_int(self.warmup, "--warmup", allow_zero=True)
        if not self.models:
            raise InputError("--models needs at least one model")
        unknown = [name for name in self.families or () if name not in families.FAMILIES]
        if unknown:
            raise InputError(f"--families: unknown family {', '.join(unknown)}; choose from {', '.join(families.FAMILIES)}")
        if self.suite not in SUITES:
            raise InputError(f"--suite must be one of {', '.join(SUITES)}, got {self.suite!r}")
        self._validate_precision()

    def _validate_precision(self) -> None:
        if self.precision == "tf32":
            raise InputError("--precision tf32: the Conv suites time TF32 in every run (cuDNN TF32 and the TF32 families "
                             "beside FP32); they take fp16 or bf16")
        if self.precision not in SUITE_PRECISIONS:
            raise InputError(f"--precision {self.precision!r}: the Conv suites take {', '.join(SUITE_PRECISIONS)}")
        if self.precision != FP32 and (self.families or self.kernels):
            flag = "--families" if self.families else "--kernel"
            raise InputError(f"{flag} does not apply with --precision {self.precision}: the Conv suites then time "
                             f"only the family --precision runs each Conv in, {spoken(precision_families(self.precision))}, "
                             f"beside cuDNN in {self.precision.upper()}")


@dataclass(frozen=True)
class ConvCase:
    """One Conv node of a model, its constant weights, and the epilogue a plan fuses into it."""

    model: str
    conv: str
    spec: ConvSpec  # at batch 1
    w: np.ndarray
    b: np.ndarray | None
    epilogue: Epilogue | None  # None: the plan fuses nothing into this Conv

    def label(self, fused: bool) -> str:
        return f"{self.model} {self.conv}{self.epilogue.suffix if fused and self.epilogue else ''}"


def conv_cases(models: Sequence[str]) -> list[ConvCase]:
    """The Conv nodes of the models, with the fusion `make_plan` gives them (CPU plan:
    fusion there depends on the graph alone)."""
    from ..graph.model import load_model
    from ..plan.partition import make_plan

    cases = []
    for name in models:
        model = load_model(name)
        plan = make_plan(model, 1, CPU)
        for step in plan.plugin_steps:
            if step.node.op_type != "Conv":
                continue
            weights = constant_weights(step.node)
            if weights is None:
                continue  # weights computed at run time: nothing to benchmark with fixed filters
            spec = conv_spec(step.node)
            epilogue = epilogue_of(step.fused) if step.fused else None
            cases.append(ConvCase(model.name, step.node.name, spec, weights[0], weights[1], epilogue))
    if not cases:
        raise InputError(f"no Conv node with constant weights in {', '.join(models)}")
    return cases


def suite_cases() -> list[ConvCase]:
    """The real-CNN layer set, each layer a case of its own (no fused epilogue)."""
    return [ConvCase("cnn", layer.name, layer.spec(), *layer_weights(layer), None) for layer in LAYERS]


def describe_spec(spec: ConvSpec) -> str:
    """"1->4 maps, 7x7, 86x86 in" (plus stride/pad/group when not plain)."""
    text = f"{spec.in_channels}->{spec.out_channels} maps, {'x'.join(map(str, spec.kernel))}, {'x'.join(map(str, spec.in_size))} in"
    if any(s != 1 for s in spec.strides):
        text += f", stride {'x'.join(map(str, spec.strides))}"
    if any(spec.pads):
        text += f", pads {list(spec.pads)}"
    if spec.group != 1:
        text += f", group {spec.group}"
    return text


def step_cost(spec: ConvSpec, epilogue: Epilogue, batch: int) -> tuple[int, int]:
    """The fewest FLOPs and bytes of the step: the conv outputs its result depends
    on, input and weights read once, the written (pooled) output once."""
    least = ConvKernel(spec, Config("minimum"), [], epilogue)
    return least.flops(batch), least.bytes_moved(batch)


# --- records --------------------------------------------------------------------------


def make_row(step: dict[str, Any], name: str, kind: str, **fields: Any) -> dict[str, Any]:
    """A row with every ROW_KEY, filled from the step and `fields`; throughput and the
    floor ratio follow from ms."""
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row.update(step=step["step"], batch=step["batch"], name=name, kind=kind, exact=True, heuristic=False, status="ok")
    row.update(fields)
    row["bytes"] = row["bytes"] if row["bytes"] is not None else step["bytes"]
    row["floor_ms"] = step["floor_ms"]
    ms = row["ms"]
    if ms:
        row["gflops_per_s"] = step["flops"] / ms / 1e6
        row["gb_per_s"] = row["bytes"] / ms / 1e6
        if step["floor_ms"]:
            row["x_floor"] = ms / step["floor_ms"]
    return row


def reference_rows(rows: list[dict[str, Any]], step: dict[str, Any], precision: str = FP32) -> None:
    """Fill the step's baseline, cuDNN FP32 and cuDNN-in-`precision` times and each row's speed-ups over them;
    its best: the fastest exact variant, or in a 16-bit run the fastest variant (all of the family the precision runs the Conv in)."""
    mine = [r for r in rows if r["step"] == step["step"] and r["batch"] == step["batch"]]

    def ms_of(predicate) -> float | None:
        found = [r["ms"] for r in mine if predicate(r) and r["status"] == "ok" and r["ms"]]
        return min(found) if found else None

    step["baseline_ms"] = ms_of(lambda r: r["kind"] == "variant" and r["family"] == "baseline" and r["heuristic"])
    step["cudnn_fp32_ms"] = ms_of(lambda r: r["kind"] == "peer" and r["name"] == "cudnn_fp32")
    step["cudnn_ms"] = ms_of(lambda r: r["kind"] == "peer" and r["name"] == cudnn_name(precision))
    candidates = [r for r in mine if r["kind"] == "variant" and (r["exact"] or precision != FP32) and r["status"] == "ok" and r["ms"]]
    step["best"] = min(candidates, key=lambda r: r["ms"])["name"] if candidates else None
    for row in mine:
        if row["status"] == "ok" and row["ms"]:
            row["vs_baseline"] = step["baseline_ms"] / row["ms"] if step["baseline_ms"] else None
            row["vs_cudnn_fp32"] = step["cudnn_fp32_ms"] / row["ms"] if step["cudnn_fp32_ms"] else None
            row["vs_cudnn"] = step["cudnn_ms"] / row["ms"] if step["cudnn_ms"] else None


def geometric_mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v]
    return float(np.exp(np.mean(np.log(values)))) if values else None


def suite_summary(steps: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per layer and batch: cuDNN FP32 and TF32, the best FP32-exact variant, the runner's
    default pick, the best TF32 variant; then the geometric means of the ratios."""
    lines = []
    for step in steps:
        mine = [r for r in rows if r["step"] == step["step"] and r["batch"] == step["batch"] and r["status"] == "ok" and r["ms"]]

        def fastest(predicate):
            return min((r for r in mine if predicate(r)), key=lambda r: r["ms"], default=None)

        cudnn = fastest(lambda r: r["name"] == "cudnn_fp32")
        cudnn_tf32 = fastest(lambda r: r["name"] == "cudnn_tf32")
        best = fastest(lambda r: r["kind"] == "variant" and r["exact"])
        default = fastest(lambda r: r["kind"] == "variant" and r["name"] == step["default"])
        tf32 = fastest(lambda r: r["kind"] == "variant" and r["family"] in ("tc_tf32", "tf32"))
        best_ms = best["ms"] if best else None
        lines.append(
            {
                "step": step["step"],
                "batch": step["batch"],
                "floor_ms": step["floor_ms"],
                "cudnn_fp32_ms": cudnn and cudnn["ms"],
                "cudnn_tf32_ms": cudnn_tf32 and cudnn_tf32["ms"],
                "best": best and best["name"],
                "best_ms": best_ms,
                "best_vs_cudnn_fp32": cudnn["ms"] / best_ms if cudnn and best_ms else None,
                "default": step["default"],
                "default_ms": default and default["ms"],
                "default_vs_best": default["ms"] / best_ms if default and best_ms else None,
                "tf32": tf32 and tf32["name"],
                "tf32_ms": tf32 and tf32["ms"],
                "tf32_vs_cudnn_tf32": cudnn_tf32["ms"] / tf32["ms"] if cudnn_tf32 and tf32 else None,
            }
        )
    return {
        "layers": lines,
        "geomean_best_vs_cudnn_fp32": geometric_mean([line["best_vs_cudnn_fp32"] for line in lines]),
        "min_best_vs_cudnn_fp32": min((line["best_vs_cudnn_fp32"] for line in lines if line["best_vs_cudnn_fp32"]), default=None),
        "max_default_vs_best": max((line["default_vs_best"] for line in lines if line["default_vs_best"]), default=None),
        "geomean_tf32_vs_cudnn_tf32": geometric_mean([line["tf32_vs_cudnn_tf32"] for line in lines]),
    }


def precision_summary(steps: list[dict[str, Any]], rows: list[dict[str, Any]], precision: str) -> dict[str, Any]:
    """Per layer and batch: cuDNN's time in the format, the family's fastest correct configuration and its
    speed-up, or why it has none; then the geometric mean of the speed-ups over the layers it ran."""
    ours_families, peer = precision_families(precision), cudnn_name(precision)
    lines = []
    for step in steps:
        mine = [r for r in rows if r["step"] == step["step"] and r["batch"] == step["batch"]]
        timed = [r for r in mine if r["status"] == "ok" and r["ms"]]
        ours = min((r for r in timed if r["family"] in ours_families), key=lambda r: r["ms"], default=None)
        cudnn = next((r for r in timed if r["name"] == peer), None)
        missed = next((r for r in mine if r["family"] in ours_families and r["status"] != "ok"), None)
        lines.append({
            "step": step["step"],
            "batch": step["batch"],
            "cudnn_ms": cudnn and cudnn["ms"],
            "variant": ours and ours["name"],
            "ms": ours and ours["ms"],
            "vs_cudnn": cudnn["ms"] / ours["ms"] if ours and cudnn else None,
            "why_not": None if ours or missed is None else f"{missed['status']}: {missed['reason']}",
        })
    return {
        "precision": precision,
        "families": list(ours_families),
        "peer": peer,
        "layers": lines,
        "ran": sum(line["ms"] is not None for line in lines),
        "geomean_vs_cudnn": geometric_mean([line["vs_cudnn"] for line in lines]),
    }


def fused_totals(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and batch: all its fused steps, each by its fastest exact variant, added up."""
    totals = []
    keys = dict.fromkeys((s["model"], s["batch"]) for s in steps if s["fused"])
    for model, batch in keys:
        parts = [s for s in steps if s["fused"] and s["model"] == model and s["batch"] == batch]
        best = [s.get("best_ms") for s in parts]
        cudnn = [s["cudnn_fp32_ms"] for s in parts]
        target = FUSED_TOTAL_TARGETS_MS.get(model) if batch == TARGET_BATCH else None
        ms = sum(best) if all(best) else None
        totals.append(
            {
                "model": model,
                "batch": batch,
                "steps": [s["step"] for s in parts],
                "variants": [s["best"] for s in parts],
                "ms": ms,
                "cudnn_fp32_ms": sum(cudnn) if all(cudnn) else None,
                "target_ms": target,
                "met": (ms is not None and ms < target) if target else None,
            }
        )
    return totals


class Bench:
    """One bench run: the device, the roofline, the peers, and the rows as they come."""

    def __init__(
        self,
        options: Options,
        progress: Callable[[str], None] | None = None,
        checkpoint: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.options = options
        # given the payload so far after each step: a long run cut short still leaves its rows
        self.checkpoint = checkpoint
        self.progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        self.steps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.peers: list[Any] = []
        self.peer_notes: dict[str, str] = {}
        self.torch = None
        self.user_sources = _user_sources(options.kernels)
        self.configs: dict[str, Config] = {}  # the configurations timed, by the name their rows give

    # the run -----------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.options.validate()
        if not cuda.is_available():
            raise DeviceError("bench needs a CUDA device, and CuPy sees none (is CuPy installed and a GPU visible?)")
        cases = suite_cases() if self.options.suite == "cnn" else conv_cases(self.options.models)
        device = current_cuda_device()
        self.progress(f"bench: {device.name}: measuring copy bandwidth and FP32 rate")
        self.roof = roofline.measure()
        self._find_peers()
        # a 16-bit run times each Conv alone: its element bound covers a Conv and its bias, not a fused chain
        fusing = (False, True) if self.options.precision == FP32 else (False,)
        work = [(case, fused, batch) for case in cases for fused in fusing if not fused or case.epilogue for batch in self.options.batches]
        for index, (case, fused, batch) in enumerate(work, 1):
            self.progress(f"bench: [{index}/{len(work)}] {case.label(fused)}, batch {batch}")
            self._bench_step(case, fused, batch)
            if self.checkpoint:
                self.checkpoint(self.payload(device, None, complete=False))
        streams = None
        if self.options.streams and self.options.suite == "models" and self.options.precision == FP32:
            streams = self._bench_streams(cases[0])
        return self.payload(device, streams)

    def payload(self, device, streams, complete: bool = True) -> dict[str, Any]:
        precision = self.options.precision
        return header(SCHEMA, device, list(self.options.models), list(self.options.batches)) | {
            "precision": precision,
            "complete": complete,
            "versions": self._versions(),
            "settings": {
                "batches": list(self.options.batches),
                "warmup": self.options.warmup,
                "repeat": self.options.repeat,
                "all_configs": self.options.all_configs,
                "models": list(self.options.models),
                "suite": self.options.suite,
                "families": list(self.options.families or families.FAMILIES),
                "min_sample_ms": MIN_SAMPLE_MS,
                "cuda_graphs": self.options.cuda_graphs,
                "tolerances": {"exact": EXACT_TOLERANCE, "fp32_peer": FP32_PEER_TOLERANCE, "inexact": INEXACT_TOLERANCE},
                "format_bound": None if precision == FP32 else bound_words(precision),  # what a 16-bit run checks instead
            },
            "roofline": self.roof.record(),
            "peers": {peer.name: "available" for peer in self.peers} | self.peer_notes,
            "steps": self.steps,
            "rows": self.rows,
            "fused_totals": fused_totals(self.steps),
            "suite_summary": suite_summary(self.steps, self.rows) if self.options.suite == "cnn" and precision == FP32 else None,
            "precision_summary": None if precision == FP32 else precision_summary(self.steps, self.rows, precision),
            "streams": streams,
        }

    def _versions(self) -> dict[str, Any]:
        import cupy
        import onnxruntime

        runtime = cupy.cuda.runtime
        versions = {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cupy": cupy.__version__,
            "cuda_runtime": runtime.runtimeGetVersion(),
            "cuda_driver": runtime.driverGetVersion(),
            "onnxruntime": onnxruntime.__version__,
            "onnxruntime_providers": list(onnxruntime.get_available_providers()),
            "torch": None,
            "cudnn": None,
        }
        if self.torch is not None:
            versions["torch"] = self.torch.__version__
            versions["cudnn"] = self.torch.backends.cudnn.version()
        return versions

    def _find_peers(self) -> None:
        # a 16-bit run's one peer is cuDNN in its format: onnxruntime's runs FP32
        precisions = ("fp32", "tf32") if self.options.precision == FP32 else (self.options.precision,)
        torch, reason = peer_module.torch_or_reason()
        if torch is None:
            self.peer_notes.update(dict.fromkeys(map(cudnn_name, precisions), reason))
        else:
            self.torch = torch
            torch.backends.cudnn.benchmark = True
            self.peers += [peer_module.cudnn_peer(torch, precision) for precision in precisions]
        if self.options.precision != FP32:
            return
        reason = peer_module.onnxruntime_cuda_reason()
        if reason:
            self.peer_notes["onnxruntime_cuda"] = reason
        else:
            self.peers.append(peer_module.onnxruntime_peer(cuda.device_id()))

    # one step at one batch -----------------------------------------------------------

    def _bench_step(self, case: ConvCase, fused: bool, batch: int) -> None:
        spec = dataclasses.replace(case.spec, batch=batch)
        epilogue = case.epilogue if fused else NONE
        flops, nbytes = step_cost(spec, epilogue, batch)
        step = dict.fromkeys(STEP_KEYS)
        step.update(
            step=case.label(fused),
            model=case.model,
            conv=case.conv,
            fused=fused,
            epilogue=epilogue.suffix.lstrip("+"),
            batch=batch,
            shape=describe_spec(spec),
            flops=flops,
            bytes=nbytes,
        )
        if self.options.precision == FP32:  # the roofline measures FP32's rate: no floor for a 16-bit run
            step.update(floor_ms=self.roof.floor_ms(flops, nbytes), bound=roofline.bound_by(flops, nbytes, self.roof.bytes_per_s, self.roof.flops_per_s))
            # the pick for launches as this bench times them: the cost model weighs the host's part only eagerly
            default = runner_default(spec, (case.w, case.b), epilogue, graphed=self.options.cuda_graphs)
        else:
            default, _ = precision_pick(spec, (case.w, case.b), self.options.precision)  # None: the row of its family says why
        candidates = self._candidates(spec, epilogue, default, (case.w, case.b))
        step["default"] = default and default.name()
        self.steps.append(step)
        problem = Problem.random(spec, epilogue, (case.w, case.b))
        for variant, heuristic in candidates:
            self._add(self._bench_variant(step, problem, variant, heuristic))
        for source in self.user_sources:
            self._add(self._bench_user(step, problem, source))
        for peer in self.peers:
            if fused and peer.name != "cudnn_fp32":
                continue  # a fused step is compared with the FP32 chain only
            self._add(self._bench_peer(step, problem, peer))
        reference_rows(self.rows, step, self.options.precision)
        best = [r for r in self.rows if r["step"] == step["step"] and r["batch"] == batch and r["name"] == step["best"]]
        step["best_ms"] = best[0]["ms"] if best else None
        del problem
        self._release()

    def _add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        figure = f"{row['ms']:.4g} ms" if row["ms"] else row["status"] + (f" ({row['reason']})" if row["reason"] else "")
        self.progress(f"bench:     {row['name']:<28} {figure}")

    def _timed_families(self, spec: ConvSpec, weights: Weights | None) -> Sequence[str] | None:
        """The families to time: --families, or in a 16-bit run the one the precision runs this Conv in alone
        (precision_family); None: every family."""
        if self.options.precision == FP32:
            return self.options.families
        return [precision_family(spec, weights, self.options.precision)]

    def _candidates(self, spec: ConvSpec, epilogue: Epilogue, default: Config | None,
                    weights: Weights | None = None) -> list[tuple[Config | Family, bool]]:
        """(configuration, is the heuristic's pick) for every family that applies; a family
        with no configuration for this shape stands for itself, and its row says why."""
        candidates: list[tuple[Config | Family, bool]] = []
        timed = self._timed_families(spec, weights)
        for family in families.FAMILIES.values():
            if epilogue != NONE and not family.fuses or timed and family.name not in timed:
                continue
            try:
                heuristic = families.configure(spec, family, epilogue)
            except Exception:
                heuristic = family
            configs = [heuristic]
            if self.options.all_configs:
                try:
                    configs += family.configs(spec, epilogue)
                except Exception:
                    pass
            candidates += [(config, config == heuristic) for config in dict.fromkeys(configs)]
        if default and not timed and all(config != default for config, _ in candidates):
            candidates.append((default, False))  # the runner's pick is always timed
        return candidates

    def _bench_variant(self, step, problem: Problem, variant: Config | Family, heuristic: bool) -> dict[str, Any]:
        family = families.family_of(variant)
        bound = candidate_bound(self.options.precision)  # opplugin's kernels give FP32
        tolerance = None if bound else EXACT_TOLERANCE if family.exact else INEXACT_TOLERANCE
        trial = run_trial(problem, variant, tolerance=tolerance, warmup=self.options.warmup, repeat=self.options.repeat, capture=self._capture(),
                          bound=bound)
        if isinstance(variant, Config):
            self.configs[trial.variant] = variant
        return variant_row(step, trial, problem.epilogue, family, heuristic, tolerance)

    def _bench_user(self, step, problem: Problem, source) -> dict[str, Any]:
        """A --kernel file's row: checked and timed like a family, under the file's name."""
        from .user_trial import user_trial

        trial = user_trial(problem, source, EXACT_TOLERANCE, self.options.warmup, self.options.repeat, self._capture())
        # FP32 as far as its check against float64 shows: exact by measurement, never by construction
        common = dict(family="user", exact=True, exact_by="measurement", heuristic=True, tolerance=EXACT_TOLERANCE, rel_error=trial.rel_error,
                      implementation=trial.kernel_name, bytes=trial.bytes)
        label = source.label + problem.epilogue.suffix
        if trial.status != "ok":
            return make_row(step, label, "variant", status=trial.status, reason=trial.reason, **common)
        return make_row(step, label, "variant", ms=trial.ms, calls_per_sample=trial.calls, timer=trial.timer, reason=trial.reason, **common)

    def _capture(self) -> Capture | None:
        """How opplugin's calls are captured for timing: into CUDA graphs, unless the bench times eager calls."""
        return graphed.cupy_replay if self.options.cuda_graphs else None

    def _bench_peer(self, step, problem: Problem, peer) -> dict[str, Any]:
        bound = candidate_bound(self.options.precision, peer.output_format)
        tolerance = None if bound else FP32_PEER_TOLERANCE if peer.exact else INEXACT_TOLERANCE
        common = dict(family=None, exact=peer.exact, implementation=peer.implementation, tolerance=tolerance, timer=peer.timer)
        try:
            # a 16-bit peer's input and weights are converted here, once, before anything is timed
            run = peer.prepare(problem.spec, problem.epilogue, problem.x, *problem.weights, residual=problem.residual)
            verdict = judge(problem, peer.fp32_output(run()), tolerance, bound)
            rel_error = verdict.rel_error
            common.update(bound_fraction=verdict.bound_fraction)
            if verdict.wrong:
                return make_row(step, peer.name, "peer", status="incorrect", reason=verdict.wrong, rel_error=rel_error, **common)
            if self.options.cuda_graphs and peer.capture is not None:
                timing = time_call(run, self.options.warmup, self.options.repeat, peer.capture)
                common.update(timer=timing.timer, reason=timing.note)
                ms, calls = timing.ms, timing.calls
            else:
                ms, calls = median_ms(run, self.options.warmup, self.options.repeat, host_clock=peer.timer == "host")
        except peer_module.PeerUnavailable as err:
            return make_row(step, peer.name, "peer", status="unsupported", reason=str(err), **common)
        except Exception as err:
            if cuda.is_out_of_memory(err):
                self._release()
            return make_row(step, peer.name, "peer", status="failed", reason=first_line(err, named=True), **common)
        return make_row(step, peer.name, "peer", ms=ms, calls_per_sample=calls, rel_error=rel_error, **common)

    def _release(self) -> None:
        cuda.release_cached_memory()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    # streams -------------------------------------------------------------------------

    def _bench_streams(self, case: ConvCase) -> dict[str, Any] | None:
        batch = max(self.options.batches)
        label = case.label(False)
        rows = [r for r in self.rows if r["step"] == label and r["batch"] == batch]
        ours = [r for r in rows if r["name"] in self.configs and r["exact"] and r["status"] == "ok"]  # not a --kernel file's
        best = min(ours, key=lambda r: r["ms"], default=None)
        if best is None:
            return {"step": label, "batch": batch, "status": "skipped", "reason": "no correct exact variant to run"}
        self.progress(f"bench: streams: {label}, batch {batch}, {best['name']}, host to host")
        try:
            result = host_to_host(case, batch, self.configs[best["name"]], self.options.warmup, self.options.repeat)
        except Exception as err:
            self._release()
            return {"step": label, "batch": batch, "variant": best["name"], "status": "failed", "reason": first_line(err, named=True)}
        self._release()
        return result


def runner_default(spec: ConvSpec, weights, epilogue: Epilogue, graphed: bool = True) -> Config | None:
    """The configuration the runner picks for this step without a tuning cache, its kernels launched
    from CUDA graphs (`graphed`) or eagerly (None: none runs it)."""
    from ..ops.conv.choice import heuristic_config

    try:
        return heuristic_config(spec, weights, epilogue, graphed)
    except PluginError:  # no variant runs this Conv
        return None


def _user_sources(paths: Sequence[str]) -> list[Any]:
    """KernelSources of the --kernel Conv files (read now: a missing file stops the bench first)."""
    from ..user_kernels import KernelSource

    return [KernelSource(path, "Conv") for path in paths]


def variant_row(step: dict[str, Any], trial: Trial, epilogue: Epilogue, family, heuristic: bool, tolerance: float | None) -> dict[str, Any]:
    """A trial as a bench row (`tolerance` None: a 16-bit run, held to its format's element bound)."""
    exact_by = family.exact_by if family.exact else None
    common = dict(family=family.name, exact=family.exact, exact_by=exact_by, heuristic=heuristic, tolerance=tolerance, rel_error=trial.rel_error,
                  bound_fraction=trial.bound_fraction)
    if trial.kernel_name:
        common.update(implementation=trial.kernel_name, bytes=trial.bytes)
    label = trial.variant + epilogue.suffix
    if trial.status != "ok":
        return make_row(step, label, "variant", status=trial.status, reason=trial.reason, **common)
    return make_row(step, label, "variant", ms=trial.ms, calls_per_sample=trial.calls, timer=trial.timer, reason=trial.reason, **common)


def run_bench(
    options: Options,
    progress: Callable[[str], None] | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark; the payload is what `--json` writes."""
    return Bench(options, progress, checkpoint).run()


def wrong_rows(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in payload["rows"] if r["status"] == "incorrect"]
