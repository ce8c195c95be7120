"""Building a plan's kernels with their compiles done first, side by side.

A step's kernel compiles its CUDA sources while it is built: only then does its plugin
know them (the variant chosen, the weights digest of a constant-memory module). So the
steps are built in rounds with the kernel cache's misses deferred
(kernel_cache.deferring_misses): a build that needs a kernel the cache lacks stops there
and hands over its compile job; once every step has been tried, the jobs compile in
parallel (gpu/parallel_compile.py), and the steps that stopped are built again. A step that
loads k missing kernels one after another takes k rounds; most take one. A step's build
must therefore be safe to start again, as building it twice is.
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol, TypeVar

from ..gpu import kernel_cache, parallel_compile

# after this many rounds the steps still waiting are built plainly, compiling as they go
MAX_ROUNDS = 4

KernelT = TypeVar("KernelT")


class NamedStep(Protocol):
    name: str


def build_all(steps: Iterable[NamedStep], build: Callable[[NamedStep], KernelT],
              compile_jobs: Callable[[list[kernel_cache.CompileJob]], int] | None = None) -> dict[str, KernelT]:
    """{step name: build(step)} in the steps' order, every kernel compile the builds need
    done beforehand by `compile_jobs` (default: parallel_compile.compile_missing, in
    parallel with a progress line)."""
    compile_jobs = compile_jobs or parallel_compile.compile_missing
    steps = list(steps)
    kernels: dict[str, KernelT] = {}
    waiting = steps
    for _ in range(MAX_ROUNDS):
        jobs, stopped = [], []
        with kernel_cache.deferring_misses():
            for step in waiting:
                try:
                    kernels[step.name] = build(step)
                except kernel_cache.MissingKernel as missing:
                    jobs.append(missing.job)
                    stopped.append(step)
        if not stopped:
            break
        compile_jobs(jobs)
        waiting = stopped
    else:
        for step in waiting:
            kernels[step.name] = build(step)
    return {step.name: kernels[step.name] for step in steps}
