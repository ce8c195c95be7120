"""`opplugin tune`: time every FP32-exact configuration of each Conv step on this GPU.

For each plugin step of the plan whose op is Conv (with its fused epilogue),
every configuration `conv_cuda.tuning_configs` offers is, in turn:

1. built (compiled by NVRTC, weights uploaded); a failure is recorded, not fatal;
2. skipped if a compiled function uses local memory: the registers spilled,
   and a spilling kernel is slower and its timing misleading;
3. checked: run once on a fresh standard-normal input into an output poisoned
   with NaN; the first images must match the float64 numpy reference (plus the
   epilogue) within a relative L2 error of 1e-5, and no NaN may remain;
4. timed: median of CUDA-event timings after warm-up, on that same input.

The fastest configuration that passed is the step's choice and goes into the
tuning cache (`opplugin.tuning_cache`), which `choose_variant` reads.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import cuda, tuning_cache
from .errors import DeviceError, InputError
from .model import Model, load_model
from .ops import reference
from .ops.conv import ConvSpec, constant_weights, epilogue_of
from .ops.epilogue import NONE, Epilogue
from .plan import PluginStep, make_plan
from .registry import Device
from .texttable import text_table

MAX_RELATIVE_L2 = 1e-5
CHECK_IMAGES = 4  # images compared with the float64 reference: enough to catch any indexing slip
DEFAULT_WARMUP = 3
DEFAULT_REPEAT = 10
RUNNERS_UP_KEPT = 5

Progress = Callable[[str], None]


@dataclass
class ConfigResult:
    """One configuration of one step: status is "pass", "fail", "skip" or "error"."""

    variant: str
    status: str
    detail: str = ""  # why it failed or was skipped; for a pass the check's figure
    median_ms: float | None = None
    kernel_name: str | None = None
    local_bytes: int | None = None  # local memory per thread; None: no function found to ask
    relative_l2: float | None = None


@dataclass
class StepTuning:
    step: str
    ops: list[str]
    spec: ConvSpec
    epilogue: Epilogue
    results: list[ConfigResult] = field(default_factory=list)

    @property
    def passed(self) -> list[ConfigResult]:
        """Configurations that passed, fastest first."""
        return sorted((r for r in self.results if r.status == "pass"), key=lambda r: r.median_ms)

    @property
    def chosen(self) -> ConfigResult | None:
        passed = self.passed
        return passed[0] if passed else None

    def cache_choice(self) -> tuning_cache.Choice | None:
        passed = self.passed
        if not passed:
            return None
        best, rest = passed[0], passed[1 : 1 + RUNNERS_UP_KEPT]
        return tuning_cache.Choice(
            variant=best.variant,
            median_ms=best.median_ms,
            batch=self.spec.batch,
            runners_up=[{"variant": r.variant, "median_ms": r.median_ms} for r in rest],
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
    return cuda.device()


def conv_steps(model: Model, batch: int, device: Device) -> list[tuple[PluginStep, ConvSpec, Epilogue]]:
    """The plan's Conv steps with their shape at this batch and their fused epilogue."""
    plan = make_plan(model, batch, device)
    found = []
    for step in plan.plugin_steps:
        if step.node.op_type != "Conv":
            continue
        epilogue = epilogue_of(step.fused) if step.fused else NONE
        found.append((step, ConvSpec.from_node(step.node), epilogue or NONE))
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
) -> TuneReport:
    """Tune every Conv step of `model` at `batch` and (by default) write the choices
    to the tuning cache. `progress`, when given, receives one line per configuration."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise InputError(f"batch must be a positive integer, got {batch!r}")
    if warmup < 0 or repeat < 1:
        raise InputError(f"warm-up must be at least 0 and repeat at least 1 (got {warmup}, {repeat})")
    device = cuda_device(device)
    model = model if isinstance(model, Model) else load_model(model)
    say = progress or (lambda line: None)
    report = TuneReport(model.name, int(batch), device, [])
    for step, spec, epilogue in conv_steps(model, int(batch), device):
        report.steps.append(tune_step(step, spec, epilogue, say, warmup, repeat))
    choices = {
        tuning_cache.key_for(t.spec, t.epilogue, device.name): t.cache_choice() for t in report.steps if t.chosen
    }
    if write_cache and choices:
        try:
            report.cache_path = tuning_cache.store(choices)
        except OSError as err:
            report.cache_error = f"could not write {tuning_cache.cache_path()}: {err}"
    return report


def tune_step(step: PluginStep, spec: ConvSpec, epilogue: Epilogue, say: Progress, warmup: int, repeat: int) -> StepTuning:
    from .ops import conv_cuda

    tuned = StepTuning(step.name, step.ops, spec, epilogue)
    weights = constant_weights(step.node)
    configs = conv_cuda.tuning_configs(spec, weights, epilogue)
    if not configs:
        say(f"{step.name}: no FP32-exact configuration runs this Conv{epilogue.suffix}; the heuristic stays")
        return tuned
    say(f"{step.name} ({' > '.join(step.ops)}): {len(configs)} configurations at batch {spec.batch}")
    problem = make_problem(spec, weights, epilogue)
    for index, variant in enumerate(configs, 1):
        result = evaluate_config(spec, variant, weights, epilogue, problem, warmup, repeat)
        tuned.results.append(result)
        timing = f"{result.median_ms:.4f} ms" if result.median_ms is not None else "-"
        say(f"[{step.name} {index}/{len(configs)}] {variant:<20} {result.status:<5} {timing:>12}  {result.detail}".rstrip())
    return tuned


@dataclass
class Problem:
    """One step's test data: the device inputs every configuration runs on and the
    float64 reference of the first images."""

    inputs: list[Any]
    expected: np.ndarray
    images: int


def make_problem(spec: ConvSpec, weights, epilogue: Epilogue) -> Problem:
    import cupy

    rng = np.random.default_rng()
    x = cupy.random.standard_normal(spec.input_shape(), dtype=cupy.float32)
    if weights is None:  # weights computed at run time: draw them too
        w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
        b = rng.standard_normal(spec.out_channels, dtype=np.float32) if spec.has_bias else None
    else:
        w, b = (np.asarray(weights[0], np.float32), None if weights[1] is None else np.asarray(weights[1], np.float32))
    images = min(CHECK_IMAGES, spec.batch)
    x64 = cupy.asnumpy(x[:images]).astype(np.float64)
    b64 = None if b is None else b.astype(np.float64)
    conv = reference.conv(x64, w.astype(np.float64), b64, spec.strides, spec.pads, spec.dilations, spec.group)
    inputs = [x, cupy.asarray(w)] + ([cupy.asarray(b)] if b is not None else [])
    return Problem(inputs, epilogue.apply(conv), images)


def evaluate_config(spec, variant, weights, epilogue, problem: Problem, warmup: int, repeat: int) -> ConfigResult:
    """Build, screen for spills, check and time one configuration; never raises for
    a failure of the configuration itself."""
    from .ops import conv_cuda

    try:
        kernel = conv_cuda.build_kernel(spec, variant, weights, epilogue)
    except Exception as err:  # a compile or build failure rules out this configuration only
        return ConfigResult(variant, "error", f"build failed: {_first_line(err)}")
    result = ConfigResult(variant, "pass", kernel_name=kernel.name)
    try:
        result.local_bytes = local_memory_bytes(kernel)
    except Exception as err:
        return replace(result, status="error", detail=f"cannot read the kernel's attributes: {_first_line(err)}")
    if result.local_bytes:
        return replace(result, status="skip", detail=f"spills: {result.local_bytes} bytes of local memory per thread")
    try:
        out = cuda.empty(kernel.output_shape(spec.batch), np.float32)
        out.fill(np.nan)
        kernel(problem.inputs, None, out=out)
        result.relative_l2, nan_count = compare(out, problem)
        if nan_count:
            return replace(result, status="fail", detail=f"{nan_count} output elements never written (still NaN)")
        if not result.relative_l2 <= MAX_RELATIVE_L2:
            return replace(result, status="fail", detail=f"rel L2 {result.relative_l2:.2e} > {MAX_RELATIVE_L2:.0e}")
        times = cuda.time_ms(lambda: kernel(problem.inputs, None, out=out), warmup=warmup, repeat=repeat)
    except Exception as err:  # a launch failure: resources, or an error the kernel raised
        return replace(result, status="error", detail=f"run failed: {_first_line(err)}")
    result.median_ms = statistics.median(times)
    result.detail = f"rel L2 {result.relative_l2:.1e}"
    return result


def compare(out, problem: Problem) -> tuple[float, int]:
    """(relative L2 error of the first images, NaN elements anywhere in the output)."""
    import cupy

    nan_count = int(cupy.isnan(out).sum())
    got = cupy.asnumpy(out[: problem.images]).astype(np.float64)
    if got.shape != problem.expected.shape:
        return float("inf"), nan_count
    diff = np.nan_to_num(got - problem.expected, nan=np.inf)
    scale = max(float(np.linalg.norm(problem.expected)), np.finfo(np.float64).tiny)
    return float(np.linalg.norm(diff)) / scale, nan_count


def kernel_functions(kernel) -> list[Any]:
    """The compiled CUDA functions (CuPy RawKernels) behind a built Conv kernel.

    A kernel may list them through a `functions()` method; otherwise its
    attributes are searched (GridKernel keeps its one function in `_function`,
    a two-kernel variant may keep a tuple)."""
    listed = getattr(kernel, "functions", None)
    if callable(listed):
        return list(listed())
    found = []
    for value in vars(kernel).values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if _is_function(item):
                found.append(item)
    return found


def _is_function(obj) -> bool:
    try:
        attributes = obj.attributes
    except Exception:  # any object without CUDA function attributes
        return False
    return isinstance(attributes, dict) and "local_size_bytes" in attributes


def local_memory_bytes(kernel) -> int | None:
    """The most local memory per thread any function of the kernel uses (spills,
    or arrays the compiler could not keep in registers); None if none was found."""
    functions = kernel_functions(kernel)
    if not functions:
        return None
    return max(int(f.attributes["local_size_bytes"]) for f in functions)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


# --- the text table ---------------------------------------------------------------------


def format_report(report: TuneReport) -> str:
    lines = [f"Tuned {report.model} at batch {report.batch} on {report.device.name}", ""]
    for tuned in report.steps:
        spec = tuned.spec
        shape = f"{spec.in_channels}x{'x'.join(map(str, spec.in_size))} -> {spec.out_channels} maps, {'x'.join(map(str, spec.kernel))} filter"
        bucket = tuning_cache.batch_bucket(spec.batch)
        lines.append(f"{tuned.step}  ({' > '.join(tuned.ops)}; {shape}; batch {spec.batch}, bucket {bucket})")
        if not tuned.results:
            lines += ["  no FP32-exact configuration runs this step; it keeps the heuristic's variant", ""]
            continue
        chosen = tuned.chosen
        rows = []
        for r in sorted(tuned.results, key=_table_order):
            ms = f"{r.median_ms:.4f}" if r.median_ms is not None else "-"
            rows.append((r.variant, ms, f"{r.status}: {r.detail}" if r.detail else r.status, "*" if r is chosen else ""))
        lines += text_table(("config", "median ms", "result", "chosen"), rows, right=(1,), indent="  ")
        if chosen is None:
            lines.append("  no configuration passed: the heuristic's variant stays")
        lines.append("")
    if report.cache_path:
        lines.append(f"Tuning cache written: {report.cache_path}")
    elif report.cache_error:
        lines.append(f"Tuning cache NOT written: {report.cache_error}")
    else:
        lines.append("Tuning cache unchanged (no configuration passed)")
    return "\n".join(lines)


def _table_order(result: ConfigResult):
    """Passing configurations fastest first, then the others in the order tried."""
    return (0, result.median_ms) if result.status == "pass" else (1, 0.0)
