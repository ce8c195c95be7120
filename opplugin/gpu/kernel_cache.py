"""The on-disk cache of compiled kernels: one cubin per (source, options, architecture,
NVRTC version), named by a hash of them, in ``<cache dir>/kernels`` (core/paths.cache_dir).

Every kernel the runtime loads comes through `binary_path`: a hit is a file for CuPy to
load; a miss is compiled here, with NVRTC (nvrtc.py), and written whole or not at all
(files.write_atomic), so that a process reading the cache never sees
half a cubin. A runner compiles the kernels its plugins declare (Plugin.compile_jobs) all at
once, in parallel (parallel_compile.py), before it builds its steps: those loads are hits.
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import nvrtc
from ..core.paths import cache_dir as user_cache_dir
from ..errors import KernelCompileError
from ..core.files import write_atomic

SUBDIR = "kernels"
# part of every key: a change in how the cache names or writes its files starts afresh
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class CompileJob:
    """One compile: `source` with `options` (the -D macros among them) for `arch` ("sm_90").
    `label` names it in errors: the kernel file, or the generated kernel's name."""

    label: str
    source: str
    options: tuple[str, ...]
    arch: str

    def nvrtc_options(self) -> tuple[str, ...]:
        """Everything NVRTC gets: the options, those CuPy always adds, and the architecture."""
        return (*self.options, *nvrtc.CUPY_IMPLIED_OPTIONS, f"--gpu-architecture={self.arch}")

    @functools.cached_property
    def file_name(self) -> str:
        digest = hashlib.sha256()
        for part in (str(LAYOUT_VERSION), "%d.%d" % nvrtc.nvrtc_version(), *self.nvrtc_options(), self.source):
            digest.update(part.encode())
            digest.update(b"\0")  # so that no two different lists of parts run together alike
        return digest.hexdigest()[:40] + ".cubin"


def cache_dir() -> Path:
    """Where cubins are kept: the cache directory's `kernels` folder, or a folder of this
    process's own when that one cannot be written (a read-only home)."""
    return _usable_dir(str(user_cache_dir() / SUBDIR))


@functools.lru_cache(maxsize=None)
def _usable_dir(wanted: str) -> Path:
    path = Path(wanted)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="opplugin-kernels-"))


def cached_path(job: CompileJob) -> Path | None:
    path = cache_dir() / job.file_name
    return path if path.is_file() else None


def binary_path(job: CompileJob) -> Path:
    """The cubin of `job` in the cache, compiled now when missing; KernelCompileError, naming the
    kernel, when NVRTC rejects it."""
    path = cached_path(job)
    if path is not None:
        return path
    cubin, log = compile_job(job)
    if cubin is None:
        raise KernelCompileError(job.label, job.options, log)
    return store(job, cubin)


def compile_job(job: CompileJob) -> tuple[bytes | None, str]:
    """(cubin, NVRTC's log) of one job; the cubin is None when NVRTC rejects the source.
    Plain values, so that it runs in a worker process as well as here."""
    return nvrtc.compile_program(job.source, job.nvrtc_options(), job.label)


def store(job: CompileJob, cubin: bytes) -> Path:
    """Write `cubin` as the job's cache file, whole or not at all (files.write_atomic)."""
    final = cache_dir() / job.file_name
    write_atomic(final, cubin)
    return final
