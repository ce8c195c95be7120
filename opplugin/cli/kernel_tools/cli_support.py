"""The command line's side of user kernels: the registry of the --kernel files, --sanitize
and --watch as run and check call them, and the lines plan, run and check print about
user kernels."""
from __future__ import annotations

import sys
from dataclasses import dataclass

from ...gpu.nvrtc import NvrtcUnavailable
from ...user_kernels import user_registry
from ...user_kernels.compiler import OFFLINE_ARCH, Rejected
from ...user_kernels.plugin import UserPlugin
from ...user_kernels.source import KernelSource
from ...registry import node_key
from ...verify.check import check
from ..loading import read_ops
from ..options import ToleranceOptions

CPU_NOTE = "The user kernel cannot run without a GPU: the numpy reference backend runs its nodes instead."


def user_sources(kernels: dict[str, str]):
    """KernelSources of the --kernel files, read now so that a missing file or entry point stops the command first."""
    return {op_type: KernelSource(path, op_type) for op_type, path in kernels.items()}


def user_registry_for(kernels: dict[str, str], *, poison: bool = False):
    """The registry with the --kernel files (by op type) in place of the built-in plugins (None
    without any); `poison` fills their outputs with NaN before each call (check)."""
    if not kernels:
        return None
    return user_registry(user_sources(kernels), poison=poison)


def say_cpu_note(registry, device) -> None:
    """The one line run and check print when user kernels are given and there is no GPU."""
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
    return {op: p for op, p in (registry or {}).items() if isinstance(p, UserPlugin)}


def compile_user_kernels(plan, registry) -> list[UserKernelUse]:
    """Compile each user kernel for each node of its op type, with NVRTC alone where there is no
    GPU (so compile errors show on any machine): what it does with each. A compile error raises."""
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


def declared_files(model) -> dict[str, str]:
    """Op key -> the CUDA C file of each declaration of the model's that has one and a node in it
    (what --watch follows besides the --kernel files; an op with several files: its first)."""
    used = {node_key(node) for node in model.nodes}
    files = {}
    for key, op in model.declarations.items():
        codes = [c for c in declared_device_code([op]) if c.is_file and c.path.endswith(".cu")]
        if key in used and codes:
            files[key] = codes[0].path
    return files


# sanitize and watch are imported where they are called: only --sanitize and --watch need them


def sanitize_kernels(model: str, kernels: dict[str, str], ops_files: tuple[str, ...] = ()) -> None:
    """--sanitize: each user kernel under compute-sanitizer, on a small batch of `model`: the
    --kernel files and the CUDA C and Triton implementations of the --ops declarations."""
    from .sanitize import sanitize

    sources = list(user_sources(kernels).values())
    sanitize(model, sources, say=lambda line: print(line, flush=True), ops_files=ops_files,
             declared=declared_device_code(read_ops(ops_files)))


def declared_device_code(ops) -> list:
    """The device code of every implementation of these declarations that has some (custom.DeviceCode)."""
    codes = [implementation.device_code(op) for op in ops for implementation in op.implementations]
    return list({(c.entry, c.path): c for c in codes if c is not None}.values())


def watch_kernels(tolerance: ToleranceOptions, model, device, batch: int, make_runner, kernels: dict[str, str], inputs,
                  cycles: int | None = None, say=None) -> int:
    """--watch: check (at `tolerance`) and time the user kernels at `batch` on `inputs` after every
    save of their files (`cycles` saves; None: until Ctrl-C). `kernels`: op key -> file, the
    --kernel files and the CUDA C files of the model's declarations (declared_files)."""
    from .watch import StepResult, watch

    roof = None
    if device.is_cuda:
        from ...lab import roofline  # the lab: only --watch on a GPU needs it, so run and check start without it

        roof = roofline.measure()

    def measure() -> dict[str, StepResult]:
        runner = make_runner()
        plan = runner.plan_record(batch)
        result = check(runner.run, plan, inputs.feeds, inputs.labels, tolerance.atol, tolerance.rtol)
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

    return watch(list(dict.fromkeys(kernels.values())), measure, say or (lambda line: print(line, flush=True)), cycles=cycles)
