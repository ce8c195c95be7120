"""Compiling many kernels at once: those of a list of jobs that the kernel cache lacks,
on worker threads (one per core, fewer where memory is short), with one progress line.

NVRTC compiles one source on one core, and a model's plan holds tens of distinct kernels
(efficientnet_b0 at batch 1: 78, some seconds each when fully unrolled), so a cold first
run spent a minute and a half on one core of 16. Both NVRTC bindings (nvrtc.py) release
the GIL while NVRTC compiles, so threads compile side by side, and they beat worker
processes (a cold `opplugin run` of efficientnet_b0 at batch 1 on the 16 cores of an
H200 machine: its 78 kernels in 9.4 s and 76 s of CPU on threads, 11.8 s and 105 s on
spawned processes). Processes remain a choice (`pool=`). The workers write nothing: each
returns its cubin or NVRTC's log, and the calling thread writes the cache
(kernel_cache.store), whole files only.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from typing import Iterable, TextIO

from . import kernel_cache
from ..errors import KernelCompileError
from .kernel_cache import CompileJob

# Each worker is counted as needing this much of the available memory (generous for NVRTC
# on the largest unrolled kernels), so that a machine short of memory runs fewer at once.
MEMORY_PER_WORKER = 1 << 30
# "threads" share this process; "processes" are spawned (the caller may hold threads,
# onnxruntime's or CUDA's, which a fork would copy half-way)
POOLS = ("threads", "processes")


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def worker_count(jobs: int) -> int:
    """Workers for `jobs` compiles: one per usable core, no more than the jobs or the memory allows."""
    memory = available_memory()
    by_memory = max(1, memory // MEMORY_PER_WORKER) if memory is not None else jobs
    return max(1, min(jobs, usable_cores(), by_memory))


class ProgressLine:
    """One line on stderr while kernels compile: "compiling 78 kernels on 16 threads ...",
    counting on a terminal, and ending with the time taken."""

    def __init__(self, total: int, workers: int, pool: str, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = total
        self.started = time.monotonic()
        self.head = f"compiling {_count(total, 'kernel')} on {_count(workers, 'thread' if pool == 'threads' else 'process')} ..."
        self._write(self.head)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def advance(self, done: int) -> None:
        if self.tty:
            self._write(f"\r{self.head} {done}/{self.total}")

    def finish(self, ok: bool) -> None:
        seconds = time.monotonic() - self.started
        self._write(f" done in {seconds:.1f} s\n" if ok else " failed\n")


def _count(number: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{number} {noun if number == 1 else plural}"


def compile_missing(jobs: Iterable[CompileJob], workers: int | None = None, pool: str = "threads",
                    stream: TextIO | None = None) -> int:
    """Compile into the kernel cache every job of `jobs` it does not hold yet, `workers` at a
    time (default: worker_count) in a pool of `pool` ("threads" or "processes"); how many
    were compiled. When NVRTC rejects one, the running compiles finish, the rest are dropped
    and KernelCompileError names the first rejected job in the order given; whatever did
    compile stays cached."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    missing = [job for job in dict.fromkeys(jobs) if kernel_cache.cached_path(job) is None]
    if not missing:
        return 0
    workers = max(1, min(workers or worker_count(len(missing)), len(missing)))
    progress = ProgressLine(len(missing), workers, pool, stream)
    ok = False
    try:
        if workers == 1:
            failures = _compile_here(missing, progress)
        else:
            with _executor(pool, workers) as executor:
                failures = _compile_in(executor, missing, progress)
        ok = not failures
    finally:
        progress.finish(ok)
    if failures:
        job, log = min(failures, key=lambda failure: missing.index(failure[0]))
        raise KernelCompileError(job.label, job.options, log)
    return len(missing)


def _executor(pool: str, workers: int) -> Executor:
    if pool == "threads":
        return ThreadPoolExecutor(workers, thread_name_prefix="opplugin-nvrtc")
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _compile_here(jobs: list[CompileJob], progress: ProgressLine) -> list[tuple[CompileJob, str]]:
    for done, job in enumerate(jobs, 1):
        cubin, log = kernel_cache.compile_job(job)
        if cubin is None:
            return [(job, log)]
        kernel_cache.store(job, cubin)
        progress.advance(done)
    return []


def _compile_in(executor: Executor, jobs: list[CompileJob], progress: ProgressLine) -> list[tuple[CompileJob, str]]:
    """Run the jobs on the executor, storing each cubin as it arrives; the (job, log) of those rejected."""
    running: dict[Future, CompileJob] = {executor.submit(kernel_cache.compile_job, job): job for job in jobs}
    failures, done = [], 0
    try:
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job = running.pop(future)
                if future.cancelled():
                    continue
                cubin, log = future.result()  # a worker process that died raises here (BrokenProcessPool)
                if cubin is None:
                    failures.append((job, log))
                    _cancel(running)  # the ones running finish and are kept
                    continue
                kernel_cache.store(job, cubin)
                done += 1
                progress.advance(done)
    except BaseException:
        _cancel(running)  # an interrupt waits for the compiles under way, not for all the others
        raise
    return failures


def _cancel(futures: Iterable[Future]) -> None:
    for future in futures:
        future.cancel()
