"""`opplugin profile --report FILE.html`: the profiled steps on the page every report shares
(report/page.py): their roofline at the profiled times, a table of every kernel's counters, and the
source lines where the samples fell."""
from __future__ import annotations

from ..report.charts import Point, Roof, roofline_svg
from ..report.page import Section, render, table
from .profiled import StepProfile
from .roofline import Roofline


def profile_page(model: str, device: str, batch: int, version: str, when: str, profiles: list[StepProfile],
                 roof: Roofline | None) -> str:
    header = [("model", model), ("device", device), ("batch", str(batch)), ("opplugin", version), ("date", when)]
    return render(f"opplugin profile: {model}", header, [_roofline(profiles, roof), _counters(profiles), _lines(profiles)])


def _roofline(profiles: list[StepProfile], roof: Roofline | None) -> Section:
    points = []
    for profile in profiles:
        gflops, gbytes = profile.rates()
        if gflops and gbytes:
            points.append(Point(profile.name, gflops / gbytes, gflops, f"{profile.ms:.4f} ms under the profiler, {gbytes:.4g} GB/s"))
    ceiling = Roof(roof.bytes_per_s, roof.flops_per_s) if roof is not None else None
    note = (f"{len(points)} profiled step(s) at their time under Nsight Compute, under this GPU's measured ceilings"
            if ceiling is not None else f"{len(points)} profiled step(s); the roof could not be measured")
    return Section("Roofline", roofline_svg(points, ceiling) if points else "", note)


def _counters(profiles: list[StepProfile]) -> Section:
    header = ["step", "kernel", "ms", "compute %", "memory %", "nearer", "occupancy %", "of %", "limited by", "regs",
              "shared B", "L1 hit %", "L2 hit %", "bank conflicts", "spills", "top stall"]
    rows = []
    for profile in profiles:
        for k in profile.kernels:
            stall = f"{k.stalls[0][0]} {k.stalls[0][1]:.2f}" if k.stalls else "-"
            rows.append([profile.name, k.kernel[:60], _n(k.ms, 4), _n(k.compute_pct), _n(k.memory_pct), k.bound(),
                         _n(k.achieved_occupancy_pct), _n(k.theoretical_occupancy_pct), k.occupancy_limit or "-",
                         _n(k.registers_per_thread), _n(k.shared_bytes_per_block), _n(k.l1_hit_pct), _n(k.l2_hit_pct),
                         _n(k.shared_bank_conflicts), _n(k.spilled_instructions), stall])
    return Section("Counters", table(header, rows, numeric=(2, 3, 4, 6, 7, 9, 10, 11, 12, 13, 14)),
                   "Every kernel launched in each profiled step, as Nsight Compute measured it (speed of light in %).")


def _lines(profiles: list[StepProfile]) -> Section:
    rows = [[profile.name, kernel.kernel[:40], f"{line.file.rsplit('/', 1)[-1]}:{line.line}", f"{line.share:.0%}", line.text]
            for profile in profiles for kernel, hot in zip(profile.kernels, profile.hot_lines) for line in hot]
    note = ("Where the warp-stall samples fell, for kernels compiled with line information."
            if rows else "No profiled kernel carried line information.")
    return Section("Hottest source lines", table(["step", "kernel", "line", "share", "source"], rows, numeric=(3,)) if rows else "", note)


def _n(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
