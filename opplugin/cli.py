"""The command line: opplugin run | check | plan."""
from __future__ import annotations

import argparse
import json
import sys

from . import __version__
from .errors import OpPluginError

DEFAULT_MODEL = "lenet86"


def _add_common(parser: argparse.ArgumentParser, batch: int) -> None:
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="ONNX file, or a shipped model: lenet86, ece408_high (default lenet86)")
    parser.add_argument("--batch", type=int, default=batch, help=f"images per run (default {batch})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: the GPU when there is one")
    parser.add_argument("--variant", help="Conv kernel variant (baseline, const, const_mo, ...); default: the fastest on this GPU")
    parser.add_argument("--data", default="auto", help="auto | fashion-mnist | random (auto: the bundled test set for shipped models)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --data random")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opplugin", description="Run ONNX models with Conv swapped for custom CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"opplugin {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the swapped model and print the per-op timing report")
    _add_common(run, batch=10000)
    run.add_argument("--repeat", type=int, help="timed runs; the report gives medians (default 5 on a GPU, 2 on the CPU)")
    run.add_argument("--warmup", type=int, help="untimed runs first (default 2 on a GPU, 0 on the CPU)")
    run.add_argument("--no-compare", action="store_true", help="skip the comparison with onnxruntime")
    run.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    run.add_argument("--csv", metavar="FILE", help="also write the step table as CSV")

    check = commands.add_parser("check", help="compare the swapped model with onnxruntime, step by step")
    _add_common(check, batch=10000)
    check.add_argument("--atol", type=float, default=None, help="absolute tolerance (default 1e-4)")
    check.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-3)")
    check.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")

    plan = commands.add_parser("plan", help="show how the model is split into plugin and onnxruntime steps")
    _add_common(plan, batch=1)
    return parser


def _runner(args):
    from .model import load_model
    from .runner import Runner

    model = load_model(args.model)
    if args.batch < 1:
        from .errors import InputError

        raise InputError(f"--batch must be at least 1, got {args.batch}")
    variants = {"Conv": args.variant} if args.variant else None
    return model, Runner(model, args.batch, args.device, variants)


def _progress(label: str, done: int, total: int) -> None:
    if sys.stderr.isatty():
        end = "\n" if done == total else ""
        print(f"\r{label} {done}/{total}", end=end, file=sys.stderr, flush=True)


def cmd_run(args) -> int:
    from . import report as reports
    from .check import compare, onnxruntime_reference, top1
    from .inputs import make_inputs

    model, runner = _runner(args)
    inputs = make_inputs(model, args.batch, args.data, args.seed)
    if not runner.device.is_cuda:
        print("No CUDA device: plugin steps run the numpy reference backend on the CPU.", file=sys.stderr)
    on_gpu = runner.device.is_cuda
    warmup = args.warmup if args.warmup is not None else (2 if on_gpu else 0)
    repeat = args.repeat if args.repeat is not None else (5 if on_gpu else 2)
    profile = runner.profile(inputs.feeds, warmup, repeat, progress=_progress)

    extra = {"data": inputs.source}
    output_name = model.outputs[0]
    ours = profile.result.outputs[output_name]
    predicted = top1(ours)
    if predicted is not None and inputs.labels is not None:
        extra["accuracy"] = float((predicted == inputs.labels).mean())
    if not args.no_compare:
        reference = onnxruntime_reference(model, inputs.feeds, [])[output_name]
        agreement = compare(ours, reference)
        ref_top1 = top1(reference)
        agreement["top1_agreement"] = float((predicted == ref_top1).mean()) if predicted is not None else 1.0
        extra["agreement"] = agreement

    result = reports.build_report(runner, profile, warmup, extra)
    print(reports.format_text(result))
    if args.json:
        reports.write_atomic(args.json, json.dumps(result, indent=2) + "\n")
    if args.csv:
        reports.write_atomic(args.csv, reports.to_csv(result["steps"]))
    return 0


def cmd_check(args) -> int:
    from . import report as reports
    from .check import DEFAULT_ATOL, DEFAULT_RTOL, check, format_check
    from .inputs import make_inputs

    atol = DEFAULT_ATOL if args.atol is None else args.atol
    rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
    model, runner = _runner(args)
    inputs = make_inputs(model, args.batch, args.data, args.seed)
    where = runner.device.name if runner.device.is_cuda else "CPU (numpy reference backend; no CUDA device)"
    print(f"Checking {model.name}, batch {args.batch}, on {where}, against onnxruntime CPU; inputs: {inputs.source}\n")
    result = check(runner, inputs.feeds, inputs.labels, atol, rtol)
    print(format_check(result, atol, rtol))
    if args.json:
        payload = {
            "model": model.name,
            "batch": args.batch,
            "device": runner.device.name,
            "atol": atol,
            "rtol": rtol,
            "passed": result.passed,
            "records": result.records,
            "top1_agreement": result.top1_agreement,
            "accuracy": result.accuracy,
            "reference_accuracy": result.reference_accuracy,
        }
        reports.write_atomic(args.json, json.dumps(payload, indent=2) + "\n")
    return 0 if result.passed else 1


def cmd_plan(args) -> int:
    from .model import load_model
    from .plan import describe, make_plan
    from .runner import select_device

    model = load_model(args.model)
    device = select_device(args.device)
    plan = make_plan(model, args.batch, device)
    notes = {}
    for step in plan.plugin_steps:
        explain = getattr(step.plugin, "variant_notes", None)
        if explain:
            notes[step.name] = explain(step.node, device)
    print(describe(plan, {k: v for k, v in notes.items() if v}))
    return 0


COMMANDS = {"run": cmd_run, "check": cmd_check, "plan": cmd_plan}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: provider-discovery warnings are not the user's business
    try:
        return COMMANDS[args.command](args)
    except OpPluginError as err:
        print(f"opplugin: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("opplugin: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
