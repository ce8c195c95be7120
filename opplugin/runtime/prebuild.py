"""Building a plan's kernels with their compiles done first, side by side.

Each plugin step says which kernel sources its build will compile (Plugin.compile_jobs, the
same choice of variant that `build` makes, without compiling); the runtime adds its own (the
NaN/Inf flag kernel). The jobs the kernel cache lacks compile in parallel
(gpu/parallel_compile.py), then every step is built once, its loads now cache hits. A step
whose plugin declares nothing compiles as it builds.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence, TypeVar

from ..gpu import kernel_cache, parallel_compile
from ..gpu.device import Device
from . import nonfinite

KernelT = TypeVar("KernelT")


class NamedStep(Protocol):
    name: str


def runtime_jobs(device: Device) -> list[kernel_cache.CompileJob]:
    """The kernels the runtime itself may load on `device`: the NaN/Inf flag kernel of watched steps."""
    return [nonfinite.flag_job(device.arch)] if device.is_cuda else []


def build_all(steps: Iterable[NamedStep], build: Callable[[NamedStep], KernelT],
              jobs_of: Callable[[NamedStep], Sequence[kernel_cache.CompileJob]],
              extra_jobs: Sequence[kernel_cache.CompileJob] = (),
              compile_jobs: Callable[[list[kernel_cache.CompileJob]], int] | None = None) -> dict[str, KernelT]:
    """{step name: build(step)} in the steps' order, after `compile_jobs` (default:
    parallel_compile.compile_missing, in parallel with a progress line) has compiled what the
    cache lacks of `extra_jobs` and every step's `jobs_of(step)`."""
    compile_jobs = compile_jobs or parallel_compile.compile_missing
    steps = list(steps)
    jobs = [*extra_jobs, *(job for step in steps for job in jobs_of(step))]
    if jobs:  # the CPU device's steps compile nothing
        compile_jobs(jobs)
    return {step.name: build(step) for step in steps}
