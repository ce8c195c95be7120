"""The command line's side of user kernels: the --kernel, --sanitize and --watch flags,
`opplugin new`, and the lines `plan`, `run` and `check` print about user kernels."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..user_kernels.contract import CONTRACTS
from ..user_kernels.flags import op_type_named

KERNEL_HELP = "run your own kernel source for an op type, e.g. --kernel Conv=my_conv.cu (opplugin new conv my_conv.cu writes a starter)"
CPU_NOTE = "The user kernel cannot run without a GPU: the numpy reference backend runs its nodes instead."


def add_kernel_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernel", action="append", metavar="OP=FILE.cu", default=None, help=KERNEL_HELP)


def add_loop_flags(parser: argparse.ArgumentParser) -> None:
    """--sanitize and --watch, for run and check."""
    parser.add_argument("--sanitize", action="store_true",
                        help="run each user kernel on a small batch under compute-sanitizer (memcheck, racecheck, initcheck) first")
    parser.add_argument("--watch", action="store_true",
                        help="recompile, re-check and re-time the --kernel file on each save (Ctrl-C stops)")


def add_new_command(commands) -> None:
    new = commands.add_parser("new", help="write a starter kernel for an op type (no arguments: list the op types)")
    new.add_argument("op", nargs="?", help=f"the op type: {', '.join(c.lower() for c in CONTRACTS)}")
    new.add_argument("file", nargs="?", help="the .cu file to write")
    new.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def user_sources(kernels: dict[str, str]):
    """KernelSources of the --kernel files, read now so that a missing file or entry point stops the command first."""
    from ..user_kernels.source import KernelSource

    return {op_type: KernelSource(path, op_type) for op_type, path in kernels.items()}


def cmd_new(args) -> int:
    from ..user_kernels import starter_text

    if not args.op:
        print("Starter kernels (opplugin new OP FILE.cu):")
        for op_type, contract in CONTRACTS.items():
            print(f"  {op_type.lower():<6} {contract.signature}")
        return 0
    op_type = op_type_named(args.op)
    if not args.file:
        raise InputError(f"opplugin new {args.op} needs the file to write, e.g. opplugin new {args.op} my_{args.op.lower()}.cu")
    target = Path(args.file)
    if target.exists() and not args.force:
        raise InputError(f"{args.file} exists; pass --force to overwrite it")
    if not target.parent.is_dir():
        raise InputError(f"{args.file}: the folder {target.parent} does not exist")
    text = starter_text(op_type).replace("THIS_FILE.cu", target.name)
    target.write_text(text)
    print(f"Wrote {args.file}: a {op_type} kernel, one thread per output. Try: opplugin check --kernel {op_type}={args.file}")
    return 0


def say_cpu_note(registry, device) -> None:
    """The one line run and check print when user kernels are given and there is no GPU."""
    from ..user_kernels.plugin import UserPlugin

    if not device.is_cuda and any(isinstance(p, UserPlugin) for p in registry.values()):
        print(CPU_NOTE, file=sys.stderr)


def plan_lines(plan, registry) -> list[str]:
    """What each user kernel does with each node of its op type: compiled (and where the
    epilogue runs), or rejected (the reason; the built-in choice runs it). Compiling here,
    with NVRTC alone where there is no GPU, is what makes `plan` catch compile errors."""
    from ..nvrtc import NvrtcUnavailable
    from ..user_kernels.compiler import OFFLINE_ARCH, Rejected
    from ..user_kernels.plugin import UserPlugin

    users = {op: p for op, p in registry.items() if isinstance(p, UserPlugin)}
    if not users:
        return []
    on_gpu = plan.device.is_cuda
    where = plan.device.name if on_gpu else f"{OFFLINE_ARCH} with NVRTC (no GPU here: the numpy reference runs these nodes)"
    lines = ["", f"User kernels (compiled for {where}):"]
    for step in plan.plugin_steps:
        plugin = users.get(step.node.op_type)
        if plugin is None:
            continue
        label = plugin.source.label
        try:
            plugin.compile(step.node, step.fused, on_gpu)
        except Rejected as reason:
            lines.append(f"  {step.name}: {label} rejects it ({reason}); the built-in choice runs it")
            continue
        except NvrtcUnavailable as err:
            lines.append(f"  {step.name}: {label} not compiled: {err}")
            continue
        line = f"  {step.name}: {label}"
        if step.fused and not plugin.fuses(plugin.epilogue(step.fused)):
            why = "does not fuse its epilogue" if not plugin.source.launch.fuses_epilogue else "fuses only ACT and the max pool"
            line += f"; then {' > '.join(n.op_type for n in step.fused)} as a separate CuPy step (the source {why})"
        elif step.fused:
            line += f", with {' > '.join(n.op_type for n in step.fused)} fused (fuses=epilogue)"
        lines.append(line)
    for op_type, plugin in users.items():
        if not any(s.node.op_type == op_type for s in plan.plugin_steps):
            lines.append(f"  {plugin.source.label}: no {op_type} node of this model runs as a plugin step")
    return lines


def sanitize_kernels(args, kernels: dict[str, str]) -> None:
    from .sanitize import sanitize

    sources = list(user_sources(kernels).values())
    sanitize(args.model, sources, say=lambda line: print(line, flush=True))


def watch_kernels(args, model, device, batch: int, make_runner, kernels: dict[str, str], cycles: int | None = None,
                  say=None) -> int:
    """--watch: check and time the user kernels at `batch` after every save of their files (`cycles` saves;
    None: until Ctrl-C)."""
    from ..check import DEFAULT_ATOL, DEFAULT_RTOL, check
    from ..data import make_inputs
    from .watch import StepResult, watch

    atol = getattr(args, "atol", DEFAULT_ATOL)  # run has no tolerance flags: check's defaults
    rtol = getattr(args, "rtol", DEFAULT_RTOL)
    inputs = make_inputs(model, batch, args.data, args.seed, pinned=device.is_cuda)
    roof = None
    if device.is_cuda:
        from ..lab import roofline

        roof = roofline.measure()

    def measure() -> dict[str, StepResult]:
        runner = make_runner()
        plan = runner.describe(batch)
        result = check(runner.run, plan, inputs.feeds, inputs.labels, atol, rtol)
        profile = runner.profile(inputs.feeds, 1, 3) if device.is_cuda else None
        records = {r["step"]: r for r in result.records}
        results = {}
        for step in plan.plugin_steps:
            if step.ops[0] not in kernels:
                continue
            record = records.get(step.name, {})
            ms = profile.median(step.name) if profile else None
            floor = roof.floor_ms(step.flops, step.bytes_moved) if roof and step.flops else None
            results[step.name] = StepResult(step.implementation, record.get("max_abs_error"), bool(record.get("passed")),
                                            ms, ms / floor if ms and floor else None)
        return results

    return watch(list(kernels.values()), measure, say or (lambda line: print(line, flush=True)), cycles=cycles)
