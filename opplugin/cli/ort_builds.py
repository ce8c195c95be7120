"""Which onnxruntime build is installed, the command that installs the GPU build, and
what the CPU build costs a run on the GPU.

`onnxruntime` (CPU provider only) and `onnxruntime-gpu` (CUDA provider too) install the
same `onnxruntime` module; with both installed, whichever came last wins. The extras in
pyproject.toml give one or the other; this module finds out what an environment has.
"""
from __future__ import annotations

import statistics
from importlib import metadata
from typing import Iterable

from ..errors import OpPluginError

CPU_BUILD, GPU_BUILD = "onnxruntime", "onnxruntime-gpu"
# pyproject.toml's cuda12 and cuda13 extras: onnxruntime-gpu on PyPI is built for CUDA 13 from 1.27 on
GPU_REQUIREMENT = {12: "onnxruntime-gpu[cuda,cudnn]>=1.20,<1.27", 13: "onnxruntime-gpu[cuda,cudnn]>=1.27"}
NEWEST_CUDA = max(GPU_REQUIREMENT)


class MissingOnnxruntime(OpPluginError, ImportError):
    """Neither onnxruntime build is installed."""


def installed_builds() -> list[str]:
    """The onnxruntime distributions installed here, of CPU_BUILD and GPU_BUILD."""
    found = []
    for name in (CPU_BUILD, GPU_BUILD):
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def require_onnxruntime() -> None:
    """MissingOnnxruntime, with the install command, when onnxruntime does not import."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise MissingOnnxruntime(
            "onnxruntime is not installed: install opplugin with one of its extras, "
            "cpu (onnxruntime) or cuda12 / cuda13 (CuPy and onnxruntime-gpu), "
            "e.g. python3 -m pip install -e '.[cpu]' in the checkout"
        ) from None


def both_builds_warning(builds: Iterable[str] | None = None) -> str | None:
    """A line saying that both builds are installed (one overwrote the other), else None."""
    builds = list(installed_builds() if builds is None else builds)
    if CPU_BUILD not in builds or GPU_BUILD not in builds:
        return None
    return (f"both {CPU_BUILD} and {GPU_BUILD} are installed and share one module, so which provider runs depends on "
            f"the order they went in; keep one: python3 -m pip uninstall -y {CPU_BUILD} {GPU_BUILD} && "
            f"python3 -m pip install '{GPU_REQUIREMENT[NEWEST_CUDA]}'")


def gpu_install_command(cuda_major: int | None) -> str:
    """The shell command that swaps the CPU build for the GPU one built for this CUDA major version."""
    requirement = GPU_REQUIREMENT.get(cuda_major or NEWEST_CUDA, GPU_REQUIREMENT[NEWEST_CUDA])
    return f"python3 -m pip uninstall -y {CPU_BUILD} && python3 -m pip install '{requirement}'"


def round_trip_copy_ms(step_ms: dict[str, list[float]], kinds: dict[str, str], steps: Iterable, graph_tensors: set[str]) -> float:
    """The median time of the copies that take tensors to and from onnxruntime steps on the
    host: every copy row ("copy H2D t", "stage D2H t", ...) of a tensor an onnxruntime step
    reads or writes, graph inputs and outputs left out (a run copies those anyway)."""
    crossing = {name for step in steps if step.kind == "onnxruntime" for name in [*step.inputs, *step.outputs]}
    crossing -= graph_tensors
    total = 0.0
    for row, readings in step_ms.items():
        if kinds.get(row) != "copy":
            continue
        tensor = row.split(" ", 2)[-1]
        if tensor in crossing:
            total += statistics.median(readings)
    return total


def cpu_provider_warning(profile, cuda_major: int | None) -> str | None:
    """One line for a GPU run whose onnxruntime steps ran on the CPU provider: what their
    copies cost in this run and the command that removes them. None when it does not apply."""
    plan = profile.plan
    ort_steps = [step for step in plan.steps if step.kind == "onnxruntime"]
    if not plan.device.is_cuda or not ort_steps or not plan.plugin_steps or "CUDA" in plan.onnxruntime_provider:
        return None
    graph_tensors = {value.name for value in plan.model.inputs} | set(plan.model.outputs)
    copy_ms = round_trip_copy_ms(profile.step_ms, profile.kinds, plan.steps, graph_tensors)
    count = len(ort_steps)
    return (f"warning: onnxruntime has no CUDA provider, so its {count} step{'s' if count != 1 else ''} ran on the CPU and "
            f"copies to and from them added up to {copy_ms:.3f} ms per run (median); to run them on the GPU: "
            f"{gpu_install_command(cuda_major)}")
