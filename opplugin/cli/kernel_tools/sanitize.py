"""`--sanitize`: each user kernel (a --kernel file, or a CUDA C or Triton implementation of an
--ops declaration) run on a small batch under NVIDIA's compute-sanitizer.

memcheck finds out-of-bounds and misaligned accesses, initcheck reads of memory
nothing wrote, and racecheck (only when the source uses __shared__ memory) shared
memory hazards. The kernels run in a child process (sanitize_child.py) built with
-lineinfo and without CuPy's memory pool, so that every array is an allocation of
its own and a write past its end is caught; the findings that point into the user's
file come back as a short table with the source lines. The child names each kernel it launched
on a line of its own (LAUNCHED), so the last line says which kernels ran clean.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ...core.texttable import text_table
from ...custom.declaration import DeviceCode
from ...gpu.toolkit import find_tool
from ...user_kernels.compiler import LINEINFO_ENV
from ...user_kernels.source import KernelSource, UserKernelError

SANITIZER = "compute-sanitizer"
LAUNCHED = "opplugin-sanitize launched: "
CHILD_TIMEOUT_S = 300
_AT = re.compile(r"\bat (\w+)(?:\+0x[0-9a-f]+)?(?: in (.+):(\d+))?")
_NOISE = ("ERROR SUMMARY", "COMPUTE-SANITIZER", "Program hit", "Saved host backtrace", "Target application returned",
          "LEAK SUMMARY", "RACECHECK SUMMARY")


@dataclass
class Finding:
    tool: str
    message: str
    function: str
    file: str | None
    line: int | None
    count: int = 1


def find_sanitizer() -> str | None:
    return find_tool(SANITIZER)


def device_code(source: KernelSource) -> DeviceCode:
    """A --kernel file as the sanitizer sees it."""
    return DeviceCode(source.label, source.contract.entry, source.path, source.text, source.uses_shared_memory)


def tools_for(codes: list[DeviceCode]) -> list[str]:
    tools = ["memcheck", "initcheck"]
    if any(c.shared_memory for c in codes):
        tools.append("racecheck")
    return tools


def parse_findings(tool: str, output: str, codes: list[DeviceCode]) -> list[Finding]:
    """The findings of one tool's output that point into a user kernel (by entry point or file)."""
    entries = {c.entry for c in codes}
    files = {Path(c.path).name for c in codes}
    found: dict[tuple, Finding] = {}
    message = None
    for raw in output.splitlines():
        if not raw.startswith("========="):
            continue
        text = raw[len("========="):]
        body = text.strip()
        if not body or any(body.startswith(n) for n in _NOISE):
            continue
        if not text.startswith("     "):  # a finding's first line; its details are indented
            message = body.removeprefix("Error: ")
            at = _AT.search(body)  # racecheck names the place on the first line
            if at and tool == "racecheck":
                _add(found, tool, message, at, entries, files)
                message = None
            continue
        at = _AT.search(body)
        if at and message:
            _add(found, tool, message, at, entries, files)
            message = None
    return list(found.values())


def _add(found: dict, tool: str, message: str, at: re.Match, entries: set[str], files: set[str]) -> None:
    function, file, line = at.group(1), at.group(2), at.group(3)
    if function not in entries and (not file or Path(file).name not in files):
        return  # a built-in kernel or a library's: not the user's business here
    message = re.sub(r"0x[0-9a-f]+", "0x…", message)
    key = (tool, message, function, file, line)
    if key in found:
        found[key].count += 1
    else:
        found[key] = Finding(tool, message, function, file, int(line) if line else None)


def source_line(finding: Finding, codes: list[DeviceCode]) -> str:
    if not finding.file or not finding.line:
        return ""
    for code in codes:
        if Path(code.path).name == Path(finding.file).name:
            lines = code.text.splitlines()
            return lines[finding.line - 1].strip() if 0 < finding.line <= len(lines) else ""
    return ""


def format_findings(findings: list[Finding], codes: list[DeviceCode]) -> str:
    rows = [[f.tool, f.message, str(f.count), f"{Path(f.file).name}:{f.line}" if f.file else f.function, source_line(f, codes)]
            for f in findings]
    return "\n".join(text_table(["tool", "finding", "times", "where", "source line"], rows, right=(2,)))


def sanitize(model: str, sources: list[KernelSource], batch: int = 2, say=print, *,
             ops_files: tuple[str, ...] = (), declared: list[DeviceCode] = ()) -> None:
    """Run every tool on the user kernels: the --kernel `sources`, and the `declared` device code of
    the --ops files' declarations; UserKernelError (exit 2) when any finds something."""
    sanitizer = find_sanitizer()
    if sanitizer is None:
        say(f"--sanitize: {SANITIZER} is not installed here (it comes with the CUDA toolkit); skipped")
        return
    codes = [*(device_code(s) for s in sources), *declared]
    arguments = [*(f"{s.op_type}={s.path}" for s in sources), *(f"--ops={path}" for path in ops_files)]
    env = os.environ | {LINEINFO_ENV: "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                                                      os.environ.get("PYTHONPATH")]))}
    first = codes[0].path if codes else model
    findings: list[Finding] = []
    launched: dict[str, None] = {}
    tools = tools_for(codes)
    for tool in tools:
        command = [sanitizer, "--tool", tool, "--print-limit", "100", "--error-exitcode", "0",
                   sys.executable, "-m", "opplugin.cli.kernel_tools.sanitize_child", model, str(batch), *arguments]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UserKernelError(f"{first}: {SANITIZER} --tool {tool} did not finish within {CHILD_TIMEOUT_S} s "
                                  "(a kernel that hangs?)") from None
        findings += parse_findings(tool, done.stdout + done.stderr, codes)
        launched.update((line.removeprefix(LAUNCHED), None) for line in done.stdout.splitlines() if line.startswith(LAUNCHED))
        child_error = [line for line in done.stderr.splitlines() if line.startswith(("opplugin:", *[c.path for c in codes]))]
        if done.returncode and not findings and child_error:
            raise UserKernelError(child_error[0] if child_error[0].startswith(first) else f"{first}: {child_error[0]}")
    if not launched:
        say(f"--sanitize: no user kernel runs in {model}; nothing to check")
        return
    names = ", ".join(launched)
    if not findings:
        say(f"--sanitize: {', '.join(tools)} found nothing in {names} (batch {batch})")
        return
    say(format_findings(findings, codes))
    total = sum(f.count for f in findings)
    raise UserKernelError(f"{first}: compute-sanitizer found {total} problem(s) in {names} (the table above)")
