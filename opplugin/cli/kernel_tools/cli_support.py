"""The command line's side of user kernels: the --kernel, --sanitize and --watch flags,
`opplugin new`, and the lines `plan`, `run` and `check` print about user kernels."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...user_kernels.contract import CONTRACTS
from ...user_kernels.flags import op_type_named

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
    from ...user_kernels.source import KernelSource

    return {op_type: KernelSource(path, op_type) for op_type, path in kernels.items()}


def cmd_new(args) -> int:
    from ...user_kernels import starter_text

    if not args.op:
        print("Starter kernels (opplugin new OP FILE.cu):")
        for op_type, contract in CONTRACTS.items():
            print(f"  {op_type.lower():<6} {contract.signature}")
        return 0
    op_type = op_type_named(args.op)
    if not args.file:
        raise InputError(f"opplugin new {args.op} needs the file to write, e.g. opplugin new {args.op} my_{args.op.lower()}.cu")
    from ...core.files import check_writable, write_atomic

    target = Path(args.file)
    if target.is_dir():
        raise InputError(f"{args.file} is a folder; give the path of the .cu file to write")
    if target.exists() and not args.force:
        raise InputError(f"{args.file} exists; pass --force to overwrite it")
    check_writable(args.file, f"opplugin new {args.op}")  # a missing, read-only or forbidden folder: one line
    write_atomic(target, starter_text(op_type).replace("THIS_FILE.cu", target.name))
    print(f"Wrote {args.file}: a {op_type} kernel, one thread per output. Try: opplugin check --kernel {op_type}={args.file}")
    return 0


def say_cpu_note(registry, device) -> None:
    """The one line run and check print when user kernels are given and there is no GPU."""
    from ...user_kernels.plugin import UserPlugin

    if not device.is_cuda and any(isinstance(p, UserPlugin) for p in registry.values()):
        print(CPU_NOTE, file=sys.stderr)


@dataclass(frozen=True)
class UserKernelUse:
    """What a user kernel does with one node of its op type, as `plan` shows it (text and JSON).
    `status`: "compiled", "rejected" (the built-in choice runs the node), "not_compiled" (no
    NVRTC here) or "unused" (no node of its op type runs as a plugin step; `step` is None)."""

    kernel: str  # the file's name
    path: str  # as the user gave it
    op_type: str
    step: str | None
    status: str
    reason: str | None = None  # why rejected or not compiled
    fused: tuple[str, ...] = ()  # the op types of the fused followers
    fused_by_kernel: bool | None = None  # whether the source applies them itself (None: nothing fused)

    def as_json(self) -> dict:
        return {"kernel": self.kernel, "path": self.path, "op_type": self.op_type, "step": self.step, "status": self.status,
                "reason": self.reason, "fused": list(self.fused), "fused_by_kernel": self.fused_by_kernel}

    def line(self, users: dict) -> str:
        if self.status == "unused":
            return f"  {self.kernel}: no {self.op_type} node of this model runs as a plugin step"
        if self.status == "rejected":
            return f"  {self.step}: {self.kernel} rejects it ({self.reason}); the built-in choice runs it"
        if self.status == "not_compiled":
            return f"  {self.step}: {self.kernel} not compiled: {self.reason}"
        line = f"  {self.step}: {self.kernel}"
        chain = " > ".join(self.fused)
        if self.fused and not self.fused_by_kernel:
            source = users[self.op_type].source
            why = "does not fuse its epilogue" if not source.launch.fuses_epilogue else "fuses only ACT and the max pool"
            return line + f"; then {chain} as a separate CuPy step (the source {why})"
        return line + (f", with {chain} fused (fuses=epilogue)" if self.fused else "")


def user_plugins(registry) -> dict:
    from ...user_kernels.plugin import UserPlugin

    return {op: p for op, p in (registry or {}).items() if isinstance(p, UserPlugin)}


def compile_user_kernels(plan, registry) -> list[UserKernelUse]:
    """Compile each user kernel for each node of its op type, with NVRTC alone where there is no
    GPU (so compile errors show on any machine): what it does with each. A compile error raises."""
    from ...gpu.nvrtc import NvrtcUnavailable
    from ...user_kernels.compiler import Rejected

    users = user_plugins(registry)
    on_gpu = plan.device.is_cuda
    uses = []
    for step in plan.plugin_steps:
        plugin = users.get(step.node.op_type)
        if plugin is None:
            continue
        named = dict(kernel=plugin.source.label, path=plugin.source.path, op_type=plugin.op_type, step=step.name)
        try:
            plugin.compile(step.node, step.fused, on_gpu)
        except Rejected as reason:
            uses.append(UserKernelUse(**named, status="rejected", reason=str(reason)))
            continue
        except NvrtcUnavailable as err:
            uses.append(UserKernelUse(**named, status="not_compiled", reason=str(err)))
            continue
        fused = tuple(n.op_type for n in step.fused)
        by_kernel = plugin.fuses(plugin.epilogue(step.fused)) if step.fused else None
        uses.append(UserKernelUse(**named, status="compiled", fused=fused, fused_by_kernel=by_kernel))
    for op_type, plugin in users.items():
        if not any(s.node.op_type == op_type for s in plan.plugin_steps):
            uses.append(UserKernelUse(plugin.source.label, plugin.source.path, op_type, None, "unused"))
    return uses


def plan_lines(plan, registry, uses: list[UserKernelUse]) -> list[str]:
    """The plan's lines about the user kernels: where they were compiled, and what each does with each node."""
    from ...user_kernels.compiler import OFFLINE_ARCH

    if not uses:
        return []
    where = plan.device.name if plan.device.is_cuda else f"{OFFLINE_ARCH} with NVRTC (no GPU here: the numpy reference runs these nodes)"
    users = user_plugins(registry)
    return ["", f"User kernels (compiled for {where}):", *(use.line(users) for use in uses)]


def compile_without_gpu(plan, registry) -> None:
    """run and check without a GPU: compile the user kernels all the same, so that an error in the
    source stops the command as it would on a GPU; one line when NVRTC is not installed."""
    uses = compile_user_kernels(plan, registry)
    missing = next((use for use in uses if use.status == "not_compiled"), None)
    if missing is not None:
        print(f"{missing.kernel} not compiled: {missing.reason}", file=sys.stderr)


def sanitize_kernels(args, kernels: dict[str, str]) -> None:
    from .sanitize import sanitize

    sources = list(user_sources(kernels).values())
    sanitize(args.model, sources, say=lambda line: print(line, flush=True))


def watch_kernels(args, model, device, batch: int, make_runner, kernels: dict[str, str], cycles: int | None = None,
                  say=None, inputs=None) -> int:
    """--watch: check and time the user kernels at `batch` after every save of their files (`cycles` saves;
    None: until Ctrl-C), on `inputs` (the user's own) or else the --data the flags name."""
    from ...verify.check import DEFAULT_ATOL, DEFAULT_RTOL, check
    from ...inputs.feeds import make_inputs
    from .watch import StepResult, watch

    atol = getattr(args, "atol", DEFAULT_ATOL)  # run has no tolerance flags: check's defaults
    rtol = getattr(args, "rtol", DEFAULT_RTOL)
    if inputs is None:
        inputs = make_inputs(model, batch, args.data, args.seed, pinned=device.is_cuda)
    roof = None
    if device.is_cuda:
        from ...lab import roofline

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
