"""A profiled step: its kernels' Nsight Compute counters (ncu.py) joined to the plan's record of it,
with its FLOPs and bytes against the device's roofline; and the report `opplugin profile` prints
and writes as JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .ncu import HotLine, KernelCounters
from .roofline import Roofline, bound_by


@dataclass
class StepProfile:
    name: str
    index: int  # in the plan
    ops: tuple[str, ...]
    nodes: tuple[str, ...]
    implementation: str
    flops: int | None
    bytes_moved: int | None
    run_ms: float | None  # the step's median in the timed run before profiling
    kernels: list[KernelCounters] = field(default_factory=list)
    hot_lines: list[list[HotLine]] = field(default_factory=list)  # per kernel

    @classmethod
    def join(cls, step, index: int, counters: list[KernelCounters], lines: list[list[HotLine]], run_ms: float | None) -> "StepProfile":
        """The plan record's `step` with the counters of the kernels launched in its range."""
        mine = [(c, lines[i] if i < len(lines) else []) for i, c in enumerate(counters) if c.step == index]
        return cls(step.name, index, tuple(step.ops), tuple(step.nodes), step.implementation, step.flops, step.bytes_moved,
                   run_ms, [c for c, _ in mine], [h for _, h in mine])

    @property
    def ms(self) -> float | None:
        """The kernels' time under the profiler (with its clocks locked, a little above a plain run's)."""
        times = [k.ms for k in self.kernels if k.ms is not None]
        return sum(times) if times else None

    def rates(self) -> tuple[float | None, float | None]:
        """Achieved GFLOP/s and GB/s over the kernels' time."""
        if not self.ms:
            return None, None
        seconds = self.ms * 1e-3
        return (self.flops / seconds / 1e9 if self.flops else None, self.bytes_moved / seconds / 1e9 if self.bytes_moved else None)

    def floor(self, roof: Roofline | None) -> tuple[float | None, str | None]:
        """The roofline's least time for this step's FLOPs and bytes, and which ceiling sets it."""
        if roof is None or not self.bytes_moved:
            return None, None
        flops = self.flops or 0
        return roof.floor_ms(flops, self.bytes_moved), bound_by(flops, self.bytes_moved, roof.bytes_per_s, roof.flops_per_s)


def profile_lines(profiles: list[StepProfile], roof: Roofline | None) -> list[str]:
    """The text report: per step its figures against the roofline, then per kernel its counters."""
    lines = []
    if roof is not None:
        lines.append(f"Roofline of this device (measured): {roof.bytes_per_s / 1e9:,.0f} GB/s, {roof.flops_per_s / 1e12:.1f} TFLOP/s FP32")
    for profile in profiles:
        lines += ["", _step_line(profile, roof)]
        if not profile.kernels:
            lines.append("  no kernel was profiled in this step (it ran on the host, or only copied)")
        for launches in _by_name(profile):
            (kernel, hot), count = max(launches, key=lambda pair: pair[0].ms or 0.0), len(launches)
            total = sum(k.ms or 0.0 for k, _ in launches)
            name = _short(kernel.kernel) + (f"  x{count} launches, {total:.4f} ms in all; the longest:" if count > 1 else "")
            lines += [f"  {name}", *(f"    {text}" for text in _kernel_lines(kernel, hot))]
    return lines


def _by_name(profile: StepProfile) -> list[list[tuple[KernelCounters, list[HotLine]]]]:
    """The step's launches grouped by kernel, in order of first launch (an epilogue left to CuPy launches many)."""
    groups: dict[str, list] = {}
    for kernel, hot in zip(profile.kernels, profile.hot_lines):
        groups.setdefault(kernel.kernel, []).append((kernel, hot))
    return list(groups.values())


def _step_line(profile: StepProfile, roof: Roofline | None) -> str:
    nodes = ", ".join(profile.nodes) if profile.nodes else profile.name
    parts = [f"{profile.name} ({' > '.join(profile.ops)}; nodes {nodes}) runs {profile.implementation}"]
    if profile.ms is not None:
        parts.append(f"{profile.ms:.4f} ms under the profiler" + (f" ({profile.run_ms:.4f} ms in the timed run)" if profile.run_ms else ""))
    gflops, gbytes = profile.rates()
    if gflops is not None or gbytes is not None:
        parts.append(", ".join(f for f in (f"{gflops:,.0f} GFLOP/s" if gflops else "", f"{gbytes:,.0f} GB/s" if gbytes else "") if f))
    floor, bound = profile.floor(roof)
    if floor and profile.ms:
        parts.append(f"{profile.ms / floor:.1f}x its {bound}-bound floor of {floor:.4f} ms")
    return ": ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "")


def _kernel_lines(kernel: KernelCounters, hot: list[HotLine]) -> list[str]:
    pct = lambda value: "-" if value is None else f"{value:.0f}%"  # noqa: E731
    lines = [f"{'-' if kernel.ms is None else f'{kernel.ms:.4f} ms'}  speed of light: compute {pct(kernel.compute_pct)}, "
             f"memory {pct(kernel.memory_pct)} (nearer the {kernel.bound()} limit)",
             f"occupancy {pct(kernel.achieved_occupancy_pct)} achieved of {pct(kernel.theoretical_occupancy_pct)} theoretical"
             f" (limited by {kernel.occupancy_limit or '-'}); {_whole(kernel.registers_per_thread)} registers/thread, "
             f"{_whole(kernel.shared_bytes_per_block)} B shared/block, block {_whole(kernel.block)}, grid {_whole(kernel.grid)}",
             f"L1 hit {pct(kernel.l1_hit_pct)}, L2 hit {pct(kernel.l2_hit_pct)}, shared bank conflicts "
             f"{_whole(kernel.shared_bank_conflicts)}, spill instructions {_whole(kernel.spilled_instructions)}"]
    if kernel.stalls:
        lines.append("top stalls (cycles per issued instruction): " + ", ".join(f"{reason} {value:.2f}" for reason, value in kernel.stalls))
    for line in hot:
        lines.append(f"{line.file.rsplit('/', 1)[-1]}:{line.line}  {line.share:.0%} of samples  {line.text}")
    return lines


def _whole(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _short(name: str, width: int = 120) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def profile_json(model: str, device: str, batch: int, profiles: list[StepProfile], roof: Roofline | None) -> dict[str, Any]:
    """Everything the text says, and every counter read, as JSON (schema opplugin-profile/1)."""
    steps = []
    for profile in profiles:
        gflops, gbytes = profile.rates()
        floor, bound = profile.floor(roof)
        steps.append({"step": profile.name, "index": profile.index, "ops": list(profile.ops), "nodes": list(profile.nodes),
                      "implementation": profile.implementation, "flops": profile.flops, "bytes_moved": profile.bytes_moved,
                      "run_ms": profile.run_ms, "profiled_ms": profile.ms, "gflop_per_s": gflops, "gb_per_s": gbytes,
                      "floor_ms": floor, "bound": bound,
                      "kernels": [asdict(k) | {"nearer": k.bound(), "hot_lines": [asdict(h) for h in hot]}
                                  for k, hot in zip(profile.kernels, profile.hot_lines)]})
    return {"schema": "opplugin-profile/1", "model": model, "device": device, "batch": batch,
            "roofline": roof.record() if roof is not None else None, "steps": steps}
