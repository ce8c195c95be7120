"""NVIDIA Nsight Compute (`ncu`) as opplugin drives it: where it is, the command line that profiles
the steps a child process marks with NVTX ranges, and its report read back as plain records.

The child names each step's range RANGE_PREFIX + the step's index in the plan (node names may hold
any character); `ncu --nvtx-include` profiles only the kernels launched inside those ranges, with
the `full` section set and the CUDA source imported (kernels built with -lineinfo map to their lines).
The report is read through ncu's own CSV export: the `raw` page (every metric of every kernel, one
row each) and the `source` page (per source line, the warp-stall samples that fell on it).
"""
from __future__ import annotations

import csv
import io
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..core import paths
from ..errors import DeviceError
from ..gpu.toolkit import find_tool

NCU = "ncu"
RANGE_PREFIX = "opplugin-step-"
NVTX_COLUMN = "thread Domain:Push/Pop_Range"
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
OCCUPANCY_LIMITS = ("registers", "shared_mem", "warps", "blocks", "barriers")
NO_COUNTERS = "ERR_NVGPUCTRPERM"


def find_ncu() -> str | None:
    return find_tool(NCU, "/opt/nvidia/nsight-compute/*/ncu")


def profile_command(ncu: str, report: str, child: list[str]) -> list[str]:
    """Profile the kernels inside the child's step ranges into `report` (.ncu-rep)."""
    return [ncu, "--nvtx", "--nvtx-include", f"regex:{RANGE_PREFIX}\\d+/", "--set", "full", "--import-source", "yes",
            "--force-overwrite", "--export", report, *child]


def refusal(output: str) -> str | None:
    """Why ncu profiled nothing, in one line, from its output; None where it says nothing of the kind."""
    if NO_COUNTERS in output:
        return ("the GPU refuses its performance counters to this user (ERR_NVGPUCTRPERM): profiling needs them "
                "(run as root, or with NVreg_RestrictProfilingToAdminUsers=0)")
    error = next((line for line in output.splitlines() if line.startswith("==ERROR==")), None)
    return error.removeprefix("==ERROR==").strip() if error else None


def export(ncu: str, report: str, page: str, *extra: str) -> str:
    """One page of a saved report as CSV text."""
    done = subprocess.run([ncu, "--import", report, "--csv", "--page", page, *extra], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise DeviceError(f"ncu could not read its report {report}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done.stdout


@dataclass
class KernelCounters:
    """One profiled kernel launch: what ran, how long, and why it is as fast as it is."""

    step: int | None  # the step's index in the plan (its NVTX range); None outside every range
    kernel: str
    ms: float | None
    compute_pct: float | None  # SM throughput, % of the speed of light
    memory_pct: float | None  # the busiest memory unit's throughput, % of its speed of light
    achieved_occupancy_pct: float | None
    theoretical_occupancy_pct: float | None
    occupancy_limit: str | None  # what caps the blocks an SM holds (registers, shared_mem, warps, blocks, barriers)
    registers_per_thread: float | None
    shared_bytes_per_block: float | None
    block: float | None
    grid: float | None
    l1_hit_pct: float | None
    l2_hit_pct: float | None
    shared_bank_conflicts: float | None
    spilled_instructions: float | None  # instructions that spill or fill registers to local memory
    stalls: list[tuple[str, float]] = field(default_factory=list)  # top reasons: cycles per issued instruction

    def bound(self) -> str:
        """Which speed of light it is nearer: "compute" or "memory" (or "latency" when both are low)."""
        compute, memory = self.compute_pct or 0.0, self.memory_pct or 0.0
        if max(compute, memory) < 40:
            return "latency"
        return "compute" if compute >= memory else "memory"


def number(text: str | None) -> float | None:
    """A metric's value as ncu prints it ("7,680", "24.70", "n/a") as a float, or None."""
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def raw_records(text: str) -> list[dict[str, str]]:
    """The raw page's rows, each a dict of metric -> value (the units row dropped)."""
    rows = list(csv.reader(io.StringIO(text)))
    header = next((i for i, row in enumerate(rows) if row and row[0] == "ID"), None)
    if header is None:
        return []
    names = rows[header]
    return [dict(zip(names, row)) for row in rows[header + 2:] if len(row) == len(names)]


def step_of(record: dict[str, str]) -> int | None:
    ranges = next((v for k, v in record.items() if k.startswith(NVTX_COLUMN)), "")
    found = re.search(rf"{RANGE_PREFIX}(\d+)", ranges)
    return int(found.group(1)) if found else None


def kernel_counters(record: dict[str, str], stalls: int = 3) -> KernelCounters:
    def get(name: str) -> float | None:
        return number(record.get(name))

    limits = {name: get(f"launch__occupancy_limit_{name}") for name in OCCUPANCY_LIMITS}
    known = {k: v for k, v in limits.items() if v is not None}
    reasons = [(m.group(1), value) for key, text in record.items() if (m := STALL.match(key)) and (value := number(text))]
    duration = get("gpu__time_duration.sum")
    return KernelCounters(
        step=step_of(record), kernel=record.get("Kernel Name", "?"),
        ms=duration / 1e6 if duration is not None else None,
        compute_pct=get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        memory_pct=get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        achieved_occupancy_pct=get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=get("sm__maximum_warps_per_active_cycle_pct"),
        occupancy_limit=min(known, key=known.__getitem__) if known else None,
        registers_per_thread=get("launch__registers_per_thread"),
        shared_bytes_per_block=get("launch__shared_mem_per_block"),
        block=get("launch__block_size"), grid=get("launch__grid_size"),
        l1_hit_pct=get("l1tex__t_sector_hit_rate.pct"), l2_hit_pct=get("lts__t_sector_hit_rate.pct"),
        shared_bank_conflicts=get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
        spilled_instructions=get("sass__inst_executed_register_spilling"),
        stalls=sorted(reasons, key=lambda r: -r[1])[:stalls])


@dataclass(frozen=True)
class HotLine:
    """A CUDA source line of a kernel and its share of the kernel's warp-stall samples."""

    file: str
    line: int
    share: float
    text: str


@dataclass(frozen=True)
class SourceBlock:
    """One profiled kernel's part of the source page: its function and its hottest lines."""

    function: str
    lines: list[HotLine]


SAMPLES = "Warp Stall Sampling (All Samples)"
SOURCE_VIEW = "cuda,sass"  # the CUDA lines carry the samples of their instructions only beside the SASS


def hot_lines(text: str, top: int = 3) -> list[SourceBlock]:
    """Per kernel with line information, in the report's order, its `top` source lines by warp-stall
    samples, from the source page exported with --print-source cuda,sass. ncu does not escape the
    quotes in a source line, so a row is read from its end (the metrics' columns are whole) and the
    line's text from the file itself."""
    blocks: list[SourceBlock] = []
    file, function, samples_from_end = "", None, None
    samples: dict[int, float] = {}
    sources: dict[str, list[str]] = {}  # a file's lines, read once however many kernels it holds

    def close() -> None:
        if function is not None:
            if file not in sources:
                sources[file] = _source_lines(file)
            blocks.append(SourceBlock(function, _ranked(file, sources[file], samples, top)))

    for raw in text.splitlines():
        row = next(csv.reader([raw]), [])
        if not row:
            continue
        if row[0] == "File Path":
            close()
            file, function, samples_from_end, samples = row[1] if len(row) > 1 else "", None, None, {}
        elif row[0] == "Function Name":
            function = row[1] if len(row) > 1 else "?"
        elif row[0] == "Line No" and SAMPLES in row:
            samples_from_end = len(row) - row.index(SAMPLES)
        elif samples_from_end and row[0].isdigit() and len(row) >= samples_from_end:
            count = number(row[len(row) - samples_from_end])
            if count:
                samples[int(row[0])] = samples.get(int(row[0]), 0.0) + count
    close()
    return blocks


def _ranked(file: str, source: list[str], samples: dict[int, float], top: int) -> list[HotLine]:
    total = sum(samples.values())
    if not total:
        return []
    ranked = sorted(samples.items(), key=lambda item: -item[1])[:top]
    return [HotLine(file, line, count / total, source[line - 1].strip() if 0 < line <= len(source) else "")
            for line, count in ranked]


def _source_lines(file: str) -> list[str]:
    """The lines of the source a kernel was compiled from: the file ncu names, else (a built-in
    kernel, compiled under its file's name alone, its includes inlined) that source from kernels/."""
    try:
        path = Path(file)
        return (path.read_text() if path.is_file() else paths.kernel_source(path.name)).splitlines()
    except (OSError, UnicodeDecodeError):
        return []


def lines_by_kernel(counters: list[KernelCounters], blocks: list[SourceBlock]) -> list[list[HotLine]]:
    """Each profiled kernel's hot lines: the next source block of its function, in report order
    (kernels without line information have none)."""
    left = list(blocks)
    found = []
    for kernel in counters:
        block = next((b for b in left if b.function == kernel.kernel or kernel.kernel.startswith(b.function + "(")), None)
        if block is not None:
            left.remove(block)
        found.append(block.lines if block is not None else [])
    return found
