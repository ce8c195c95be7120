"""`opplugin tune`: time every FP32-exact configuration of each Conv step on this GPU, and
every implementation of each custom node (custom_tune.py). With a 16-bit `precision` (fp16,
bf16), every configuration of the family a run in it gives each Conv step (ops/conv/plugin.py,
precision_fit: wg_fp16, or dw_fp16 for a depthwise Conv) instead, each held element by element to the format's bound
(format_bound.py) rather than to FP32's error.

For each plugin step of the plan whose op is Conv (with its fused epilogue),
every configuration `families.tuning_configs` offers goes through one trial
(see trial.py): built (a failure is recorded, not fatal), skipped if a compiled
function uses local memory (the registers spilled, and a spilling kernel is
slower and its timing misleading), run on a fresh standard-normal input into
an output poisoned with NaN and checked against the float64 oracle (relative
L2 error at most 1e-5, nothing left unwritten), and only then timed.

The fastest configuration that passed is the step's choice and goes into the
tuning cache (`opplugin.ops.conv.tuning_cache`) under the precision, which `choose_config`
(FP32) and `ConvPlugin.precision_variant` (fp16, bf16) read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..gpu import cuda
from ..ops.conv import tuning_cache
from ..gpu.device import Device, current_cuda_device
from ..core.number_formats import FP32
from ..errors import DeviceError, InputError, positive_int
from ..report.jsonout import header
from ..graph.model import Model, load_model
from ..ops.conv import families
from ..ops.conv.choice import tuning_key
from ..ops.conv.epilogue import NONE, Epilogue
from ..ops.conv.plugin import CONV_PRECISIONS, PRECISION_FAMILIES, constant_weights, conv_spec, epilogue_of, precision_fit
from ..ops.conv.prologue import from_nodes
from ..ops.conv.spec import ConvSpec
from ..plan.partition import Plan, PluginStep, make_plan
from .custom_tune import CustomStepTuning, custom_steps, custom_table_lines, store_choices, tune_custom_step
from ..core.texttable import text_table
from .bench_precision import candidate_bound
from .format_bound import bound_words
from .trial import EXACT_TOLERANCE, Problem, Trial, run_trial

# 2: "precision", "element_bound", and each step's "not_tuned"
SCHEMA = "opplugin-tune/2"
TUNED_PRECISIONS = CONV_PRECISIONS
STAYS_FP32 = "stays fp32"  # how a step the precision's family cannot run is reported
# the precisions a run takes that tune does not, and why
NOT_TUNED = {
    "tf32": "a Conv under --precision tf32 runs FP32-exact (3xTF32), from FP32's cache entries: tune --precision fp32 tunes it",
    "mixed": "a mixed run reads fp16's cache entries for its FP16 steps and fp32's for the rest: tune each of the two",
}
DEFAULT_WARMUP = 3
DEFAULT_REPEAT = 10
RUNNERS_UP_KEPT = 5
# the words the tuning table uses for a trial's status
RESULT_WORDS = {"ok": "pass", "incorrect": "fail", "spills": "skip", "unsupported": "skip", "failed": "error"}

Progress = Callable[[str], None]


@dataclass
class StepTuning:
    step: str
    ops: list[str]
    spec: ConvSpec
    epilogue: Epilogue  # what the timed kernels fuse, and the cache keys the choice by
    results: list[Trial] = field(default_factory=list)
    precision: str = FP32
    not_tuned: str | None = None  # why nothing was timed (under fp16: the plan's reason the step stays FP32)
    user: list[Trial] = field(default_factory=list)  # --kernel files: timed beside the configurations, never cached

    @property
    def passed(self) -> list[Trial]:
        """Configurations that passed, fastest first."""
        return sorted((r for r in self.results if r.status == "ok"), key=lambda r: r.ms)

    @property
    def chosen(self) -> Trial | None:
        passed = self.passed
        return passed[0] if passed else None

    def cache_choice(self) -> tuning_cache.Choice | None:
        passed = self.passed
        if not passed:
            return None
        best, rest = passed[0], passed[1 : 1 + RUNNERS_UP_KEPT]
        return tuning_cache.Choice(
            variant=best.variant,
            median_ms=best.ms,
            batch=self.spec.batch,
            runners_up=[{"variant": r.variant, "median_ms": r.ms} for r in rest],
            date=tuning_cache.Choice.now(),
        )


@dataclass
class TuneReport:
    model: str
    batch: int
    device: Device
    steps: list[StepTuning]
    cache_path: Path | None = None  # where the choices were written; None when nothing was
    cache_error: str | None = None
    warmup: int = DEFAULT_WARMUP
    repeat: int = DEFAULT_REPEAT
    custom: list[CustomStepTuning] = field(default_factory=list)  # the custom nodes' implementations (custom_tune.py)
    custom_path: Path | None = None  # where their choices were written
    precision: str = FP32


def checked_tune_precision(precision: str) -> str:
    """`precision` when tune takes it (TUNED_PRECISIONS), else an InputError in one line that says why."""
    if precision in NOT_TUNED:
        raise InputError(f"tune --precision {precision}: not tuned; {NOT_TUNED[precision]}")
    if precision not in TUNED_PRECISIONS:
        raise InputError(f"tune --precision {precision!r}: one of {', '.join(TUNED_PRECISIONS)}")
    return precision


def cuda_device(device: Device | str | None) -> Device:
    """The CUDA device to tune on; DeviceError when there is none."""
    if isinstance(device, Device):
        if not device.is_cuda:
            raise DeviceError("tuning times kernels on a GPU; the CPU device has none")
        return device
    if device not in (None, "auto", "cuda"):
        raise DeviceError(f"tuning needs a CUDA device; got --device {device}")
    if not cuda.is_available():
        raise DeviceError("tuning needs a CUDA device, and none is usable (is CuPy installed and a GPU visible?)")
    return current_cuda_device()


def conv_steps(model: Model, batch: int, device: Device, plan: Plan | None = None) -> list[tuple[PluginStep, ConvSpec, Epilogue]]:
    """The plan's Conv steps with their shape at this batch and their fused epilogue."""
    plan = plan or make_plan(model, batch, device)
    found = []
    for step in plan.plugin_steps:
        if step.node.op_type != "Conv":
            continue
        epilogue = (epilogue_of(step.fused) if step.fused else NONE) or NONE
        if step.prologue:  # tuned as the fused step runs: the cache keys it by its prologue too
            epilogue = dataclasses.replace(epilogue, prologue=from_nodes(step.prologue, step.prologue[0].data_input()))
        found.append((step, conv_spec(step.node), epilogue))
    return found


def tune(
    model: Model | str,
    batch: int,
    device: Device | str | None = "auto",
    progress: Progress | None = None,
    *,
    warmup: int = DEFAULT_WARMUP,
    repeat: int = DEFAULT_REPEAT,
    write_cache: bool = True,
    kernels: dict[str, str] | None = None,
    precision: str = FP32,
) -> TuneReport:
    """Tune every Conv step and custom node of `model` at `batch` and (by default) write the
    choices to the tuning cache, as `precision`'s. `progress`, when given, receives one line per configuration."""
    precision = checked_tune_precision(precision)
    batch = positive_int(batch, "batch")
    warmup = positive_int(warmup, "warm-up", allow_zero=True)
    repeat = positive_int(repeat, "repeat")
    device = cuda_device(device)
    model = model if isinstance(model, Model) else load_model(model)
    say = progress or (lambda line: None)
    report = TuneReport(model.name, batch, device, [], warmup=warmup, repeat=repeat, precision=precision)
    sources = _user_sources(kernels)
    plan = make_plan(model, batch, device)
    for step, spec, epilogue in conv_steps(model, batch, device, plan):
        report.steps.append(tune_step(step, spec, epilogue, say, warmup, repeat, sources, precision))
    report.custom = [tune_custom_step(step, device, say, warmup, repeat) for step in custom_steps(plan)]
    if write_cache:
        try:
            report.custom_path = store_choices(report.custom)
        except OSError as err:
            report.cache_error = f"could not write the custom ops' choices: {err}"
    choices = {
        tuning_key(t.spec, t.epilogue, device.name, precision=precision): t.cache_choice() for t in report.steps if t.chosen
    }
    if write_cache and choices:
        try:
            report.cache_path = tuning_cache.store(choices)
        except OSError as err:
            report.cache_error = f"could not write {tuning_cache.cache_path()}: {err}"
    return report


def _user_sources(kernels: dict[str, str] | None) -> list[Any]:
    from ..user_kernels import KernelSource

    return [KernelSource(path, "Conv") for op, path in (kernels or {}).items() if op == "Conv"]


def tuning_candidates(spec: ConvSpec, weights, epilogue: Epilogue, precision: str = FP32) -> tuple[list[families.Config], Epilogue, str | None]:
    """(the configurations tune times for a Conv step, the epilogue they fuse, why there are none): in FP32 every
    FP32-exact one; in fp16 or bf16 those of the precision's family for this Conv (precision_fit) with the part of the epilogue it fuses, as
    a run in that precision builds the step, or the reason the plan gives for keeping the step in FP32."""
    if precision == FP32:
        configs = families.tuning_configs(spec, weights, epilogue)
        return configs, epilogue, None if configs else f"no FP32-exact configuration runs this Conv{epilogue.suffix}"
    family, _, fused, reason = precision_fit(spec, weights, epilogue, precision)
    if reason is not None:
        return [], epilogue, f"{STAYS_FP32}: {reason}"
    configs = families.family_configs(spec, family, weights, fused)
    return configs, fused, None if configs else f"no {family} configuration runs this Conv{fused.suffix}"


def tune_step(step: PluginStep, spec: ConvSpec, epilogue: Epilogue, say: Progress, warmup: int, repeat: int,
              sources: list[Any] = (), precision: str = FP32) -> StepTuning:
    weights = constant_weights(step.node)
    configs, epilogue, why_none = tuning_candidates(spec, weights, epilogue, precision)
    tuned = StepTuning(step.name, step.ops, spec, epilogue, precision=precision, not_tuned=why_none)
    if not configs:
        say(f"{step.name}: {why_none}{_untuned_runs(precision, why_none)}")
        return tuned
    say(f"{step.name} ({' > '.join(step.ops)}): {len(configs)} configurations at batch {spec.batch}")
    problem = make_problem(spec, weights, epilogue)
    for index, config in enumerate(configs, 1):
        result = evaluate_config(problem, config, warmup, repeat, precision)
        tuned.results.append(result)
        timing = f"{result.ms:.4f} ms" if result.ms is not None else "-"
        say(f"[{step.name} {index}/{len(configs)}] {result.variant:<20} {RESULT_WORDS[result.status]:<5} {timing:>12}  {detail(result)}".rstrip())
    if sources:
        from .user_trial import user_trial

        tuned.user = [user_trial(problem, source, EXACT_TOLERANCE, warmup, repeat) for source in sources]
    return tuned


def make_problem(spec: ConvSpec, weights, epilogue: Epilogue) -> Problem:
    """The step's test data: the node's weights (drawn when it has none) and a fresh input."""
    return Problem.random(spec, epilogue, weights)


def evaluate_config(problem: Problem, config: families.Config, warmup: int, repeat: int, precision: str = FP32) -> Trial:
    """One configuration's trial, spills screened out, checked as a kernel in `precision` is (run_trial)."""
    bound = candidate_bound(precision)
    return run_trial(problem, config, tolerance=EXACT_TOLERANCE, warmup=warmup, repeat=repeat, screen_spills=True, bound=bound)


def _untuned_runs(precision: str, why: str | None = None) -> str:
    """What runs a step tune chose nothing for, after "; " (nothing where `why` says the step stays FP32)."""
    if precision == FP32:
        return "; the heuristic's variant stays"
    return "" if why and why.startswith(STAYS_FP32) else f"; the family's own pick ({' or '.join(PRECISION_FAMILIES[precision])}) runs it"


def detail(result: Trial) -> str:
    """What the table says beside a configuration's status: the check's figure for a pass, else why."""
    if result.status == "ok":
        return f"rel L2 {result.rel_error:.1e}"
    return result.reason or ""


# --- the text table ---------------------------------------------------------------------


def format_report(report: TuneReport) -> str:
    in_precision = f" in {report.precision} ({bound_words(report.precision)})" if report.precision != FP32 else ""
    lines = [f"Tuned {report.model} at batch {report.batch} on {report.device.name}{in_precision}", ""]
    for tuned in report.steps:
        spec = tuned.spec
        shape = f"{spec.in_channels}x{'x'.join(map(str, spec.in_size))} -> {spec.out_channels} maps, {'x'.join(map(str, spec.kernel))} filter"
        bucket = tuning_cache.batch_bucket(spec.batch)
        lines.append(f"{tuned.step}  ({' > '.join(tuned.ops)}; {shape}; batch {spec.batch}, bucket {bucket})")
        if not tuned.results:
            lines += [f"  {tuned.not_tuned}{_untuned_runs(tuned.precision, tuned.not_tuned)}", ""]
            continue
        chosen = tuned.chosen
        rows = []
        for r in sorted(tuned.results, key=_table_order):
            ms = f"{r.ms:.4f}" if r.ms is not None else "-"
            word, why = RESULT_WORDS[r.status], detail(r)
            rows.append((r.variant, ms, f"{word}: {why}" if why else word, "*" if r is chosen else ""))
        lines += text_table(("config", "median ms", "result", "chosen"), rows, right=(1,), indent="  ")
        if chosen is None:
            lines.append(f"  no configuration passed{_untuned_runs(tuned.precision)}")
        for r in tuned.user:
            against = f", {r.ms / chosen.ms:.2f}x the time of {chosen.variant}" if r.ms and chosen else ""
            figure = f"{r.ms:.4f} ms{against}" if r.ms is not None else RESULT_WORDS[r.status]
            lines.append(f"  your kernel {r.variant}: {figure}" + (f" ({detail(r)})" if detail(r) else ""))
        lines.append("")
    if report.custom:
        lines += ["Custom nodes: each implementation against its op's float64 reference, then timed", ""]
        lines += custom_table_lines(report.custom)
    if report.custom_path:
        lines.append(f"Custom ops' choices written: {report.custom_path}")
    if report.cache_path:
        lines.append(f"Tuning cache written: {report.cache_path}")
    elif report.cache_error:
        lines.append(f"Tuning cache NOT written: {report.cache_error}")
    else:
        lines.append("Tuning cache unchanged (no configuration passed)")
    return "\n".join(lines)


# --- the JSON of `tune --json` --------------------------------------------------------

# what each configuration's entry carries (from its Trial); null where the trial did not get that far
CONFIG_KEYS = ("variant", "status", "result", "reason", "ms", "rel_error", "kernel_name", "local_bytes", "calls")


def config_entry(trial: Trial, chosen: bool) -> dict[str, Any]:
    fields = dataclasses.asdict(trial)
    return {key: fields.get(key) for key in CONFIG_KEYS} | {"result": RESULT_WORDS[trial.status], "chosen": chosen}


def build_tune_report(report: TuneReport) -> dict[str, Any]:
    """The tuning as plain data: the shared header (report/jsonout.py), how trials ran, and per Conv
    step every configuration tried, passing ones fastest first as in the table."""
    steps = []
    for tuned in report.steps:
        chosen = tuned.chosen
        steps.append({
            "step": tuned.step,
            "ops": list(tuned.ops),
            "conv": dataclasses.asdict(tuned.spec),
            "epilogue": tuned.epilogue.suffix or None,
            "batch_bucket": tuning_cache.batch_bucket(tuned.spec.batch),
            "chosen": chosen.variant if chosen else None,
            "not_tuned": tuned.not_tuned,
            "configs": [config_entry(r, r is chosen) for r in sorted(tuned.results, key=_table_order)],
        })
    return header(SCHEMA, report.device, report.model, report.batch) | {
        "warmup": report.warmup,
        "repeat": report.repeat,
        "precision": report.precision,
        "tolerance": EXACT_TOLERANCE if report.precision == FP32 else None,  # relative L2 error against float64
        "element_bound": None if report.precision == FP32 else bound_words(report.precision),
        "steps": steps,
        "cache_path": str(report.cache_path) if report.cache_path else None,
        "cache_error": report.cache_error,
        "custom_steps": [{"step": t.step, "op": t.op, "reference_host_ms": t.reference_ms,
                          "chosen": t.chosen.variant if t.chosen else None,
                          "implementations": [dataclasses.asdict(trial) for trial in t.trials]} for t in report.custom],
        "custom_choices_path": str(report.custom_path) if report.custom_path else None,
    }


def _table_order(result: Trial):
    """Passing configurations fastest first, then the others in the order tried."""
    return (0, result.ms) if result.status == "ok" else (1, 0.0)
