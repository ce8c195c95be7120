"""The compile check's NVRTC compiles: each distinct one done once per run, in a pool of
processes, and kept on disk between runs.

A compile is (kernels/<source>, NVRTC options, arch). `check_source` and `check_variant`
read ptxas's report of one the way `opplugin.lab.nvrtc_check`'s functions of the same
names do, from this module's store: this module calls only nvrtc_check's public
functions (`compile_cubin`, `parse_ptxas_log`, `variant_units`).

Every compile has MINIMAL_OPTIONS (NVRTC's -minimal: the same cubin, quicker).
`fast=True` adds FAST_OPTIONS (NVRTC's --Ofast-compile=max) to a compile: the same
source and macros through the front end and ptxas, with less optimisation, 5 to 40
times quicker on the unrolled kernels. Its register and spill figures are not those of
the build CuPy makes, so it serves checks that a configuration compiles, never
resource checks.

The disk store (one small JSON file per compile: cubin size and ptxas log) is keyed by
a hash of the source text with its headers inlined, the options, the architecture and
the NVRTC version; it lives in pytest's cache directory (`pytest --cache-clear` or `-p
no:cacheprovider` gives a cold run) or in $OPPLUGIN_COMPILE_CACHE ("off": none).
Failed compiles are not stored: the check compiles again and raises with NVRTC's log.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from opplugin.gpu import cuda
from opplugin.core import paths
from opplugin.lab import nvrtc_check
from opplugin.ops.conv import families
from opplugin.ops.conv.families.base import unit_arch

FAST_OPTIONS: tuple[str, ...] = ("--Ofast-compile=max",)
# NVRTC's -minimal leaves out the declarations of texture and surface functions, of the device
# runtime's functions and of kernel launch from device code, which no kernel here uses: 4 to 5 ms
# less front end a compile (a trivial kernel's takes 20 instead of 24), 5.6 of the check's 172
# CPU-seconds. It changes no cubin: every compile of the check, made both ways with NVRTC 13.5,
# gave the same bytes (but two depthwise builds whose bytes ptxas varies from one run to the
# next either way) and the same ptxas report. A kernel that needs one of those declarations
# fails here with NVRTC's error: drop the option then.
MINIMAL_OPTIONS: tuple[str, ...] = ("-minimal",)
CACHE_ENV = "OPPLUGIN_COMPILE_CACHE"

Key = tuple[str, tuple[str, ...], str]  # (source file, options, arch)

_reports: dict[Key, tuple[int, str]] = {}  # key -> (cubin bytes, ptxas log)
_disk: Path | None = None


# The architectures whose full builds the checks read resources from: Hopper, the target (its
# wgmma kernels build for sm_90a). An Ampere (sm_80) compile is NVRTC's fast one unless a check
# asks for the full build (`full`): it shows that the kernel compiles for Ampere, and ptxas still
# reports its constant bank there (bank 3), at a tenth to a fortieth of the time; the registers,
# spills and stack frame the checks hold are the sm_90 build's. A full build of every sm_80 case
# took 101 of the check's 300 CPU-seconds, cold, on CI's 2 cores the difference between a suite
# over 2 minutes and one under.
FULL_BUILD_ARCHS = ("sm_90", "sm_90a")


def key(source_file: str, defines: Mapping[str, Any], arch: str, fast: bool = False, *, full: bool = False) -> Key:
    """A compile of kernels/<source_file> with `defines` for `arch`: fast where asked, and for an
    architecture outside FULL_BUILD_ARCHS unless `full`."""
    fast = fast or (not full and arch not in FULL_BUILD_ARCHS)
    return source_file, cuda.nvrtc_options(defines) + (FAST_OPTIONS if fast else ()) + MINIMAL_OPTIONS, arch


def _full_build(k: Key) -> Key | None:
    """The full build of a fast compile's source and macros (None for a full one)."""
    source_file, options, arch = k
    return (source_file, tuple(o for o in options if o not in FAST_OPTIONS), arch) if FAST_OPTIONS[0] in options else None


def _distinct(keys: Iterable[Key], also: Iterable[Key] = ()) -> list[Key]:
    """Each key once, but a fast compile whose full build is among them or in `also`: a check of it
    reads the full build (`check_source`), which shows as much that it compiles."""
    keys = list(dict.fromkeys(keys))
    present = set(keys).union(also)
    return [k for k in keys if _full_build(k) not in present]


def use_pytest_cache(config) -> None:
    """Keep compiles in pytest's cache directory (none under -p no:cacheprovider: a cold run)."""
    cache = getattr(config, "cache", None)
    use_disk(cache.mkdir("opplugin-compiles") if cache is not None else None)


def use_disk(directory: str | os.PathLike | None) -> None:
    """Keep compiles in `directory` (None: in memory only); $OPPLUGIN_COMPILE_CACHE wins."""
    global _disk
    chosen = os.environ.get(CACHE_ENV, directory)
    _disk = None if chosen in (None, "", "off") else Path(chosen)


@lru_cache(maxsize=None)
def _compiler_version() -> str:
    from importlib import metadata

    from cuda.bindings import nvrtc  # importable: the caller checked nvrtc_check.nvrtc_available()

    _, major, minor = nvrtc.nvrtcVersion()
    packages = []
    for name in ("nvidia-cuda-nvrtc", "cuda-bindings"):
        try:
            packages.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return f"nvrtc {major}.{minor} {' '.join(packages)} {' '.join(nvrtc_check.CUPY_IMPLIED_OPTIONS)}"


def _path(k: Key) -> Path | None:
    if _disk is None:
        return None
    source_file, options, arch = k
    text = json.dumps([_compiler_version(), paths.kernel_source(source_file), options, arch])
    return _disk / f"{hashlib.sha256(text.encode()).hexdigest()}.json"


def _load(k: Key) -> bool:
    path = _path(k)
    if path is None or not path.is_file():
        return False
    try:
        stored = json.loads(path.read_text())
        _reports[k] = (int(stored["cubin_bytes"]), str(stored["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable: compile again
    return True


def _store(k: Key, report: tuple[int, str]) -> None:
    _reports[k] = report
    path = _path(k)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"cubin_bytes": report[0], "log": report[1]}))
        temporary.replace(path)
    except OSError:
        pass  # a read-only cache directory costs a compile next time, nothing else


def _compile(source_file: str, options: tuple[str, ...], arch: str) -> tuple[int, str]:
    cubin, log = nvrtc_check.compile_cubin(paths.kernel_source(source_file), options, arch, name=source_file)
    return len(cubin), log


def _report(k: Key) -> tuple[int, str]:
    if k not in _reports and not _load(k):
        _store(k, _compile(*k))
    return _reports[k]


class _Background:
    """Compiles keys, the first first, in as many processes as there are CPUs and never more.

    While other tests run beside it (`foreground` false), one process at the lowest priority
    takes a CPU they leave idle, not one they use (onnxruntime's spinning thread pools slow
    down many times over when they must share). Once `wait` is called, `workers - 1` processes
    at normal priority join it and all of them take keys from one queue: the low-priority
    process keeps a CPU to itself then, so a long compile it began is not starved (a niced
    process cannot be given its priority back), and no two compiles share a CPU.

    `listing`: a test module whose compile_jobs() the low-priority process reads first (`head_start`),
    the keys then; `extend` adds keys to the end of the queue."""

    def __init__(self, keys: list[Key], workers: int, foreground: bool, listing: str | None = None):
        self.workers, self.cancelled, self.background = workers, False, not foreground
        self.keys = frozenset(keys)
        self.queue = list(reversed(keys))  # popped from the end: the first key first
        self.listing, self.later = listing, []  # the module being read; keys `extend` gave meanwhile
        self.parked: list[ProcessPoolExecutor] = []  # a process of each found the queue empty
        self.lock = threading.Lock()
        self.running = 0  # jobs submitted and not yet done
        self.idle = threading.Condition(self.lock)
        # spawn, not fork: the caller holds threads (onnxruntime's, the host-copy pool)
        self.spawn = multiprocessing.get_context("spawn")
        self.pools: list[ProcessPoolExecutor] = []
        if foreground:
            self._join(workers)
        elif listing is None:
            self._join(1, nice=19)
        else:
            pool = self._pool(1, nice=19)
            self.running += 1
            pool.submit(_module_jobs, listing).add_done_callback(lambda future: self._listed(future, pool))

    def _pool(self, processes: int, nice: int = 0) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(processes, mp_context=self.spawn, initializer=os.nice if nice else None,
                                   initargs=(nice,) if nice else ())
        self.pools.append(pool)
        return pool

    def _join(self, processes: int, nice: int = 0) -> None:
        """Add a pool of `processes` processes, each kept busy with one key at a time."""
        if processes < 1:
            return
        pool = self._pool(processes, nice)
        for _ in range(processes):
            self._next(pool)

    def _listed(self, future, pool: ProcessPoolExecutor) -> None:
        """The module's keys are read (none if that failed: `extend` gives them then): queue them."""
        read = [] if future.cancelled() or future.exception() is not None else future.result()
        with self.lock:
            self.listing, later, self.later = None, self.later, []
        try:
            self.extend(read + later)
        finally:
            with self.lock:
                self.running -= 1  # only now: `wait` must not find the queue empty before it is filled
                self.idle.notify_all()
            self._next(pool)

    def extend(self, keys: list[Key]) -> None:
        """Compile `keys` too, after those queued (at once if the module is being read, after it)."""
        with self.lock:
            if self.listing is not None:
                self.later += keys
                return
        todo = [k for k in _distinct(keys, self.keys) if k not in self.keys and k not in _reports and not _load(k)]
        with self.lock:
            if self.cancelled:
                return
            self.keys |= frozenset(todo)
            self.queue[:0] = reversed(todo)
            parked, self.parked = self.parked, []
        for pool in parked:
            self._next(pool)

    def _next(self, pool: ProcessPoolExecutor) -> None:
        with self.lock:
            if self.cancelled or not self.queue:
                if not self.cancelled:
                    self.parked.append(pool)
                self.idle.notify_all()
                return
            k = self.queue.pop()
            self.running += 1
        try:
            future = pool.submit(_compile, *k)
        except RuntimeError:  # the pool is shutting down (cancel)
            with self.lock:
                self.running -= 1
                self.idle.notify_all()
            return
        future.add_done_callback(lambda future, k=k: self._done(k, future, pool))

    def _done(self, k: Key, future, pool: ProcessPoolExecutor) -> None:
        try:
            if not future.cancelled() and future.exception() is None:  # a failure: the check compiles again and raises
                _store(k, future.result())
        finally:
            with self.lock:
                self.running -= 1
                self.idle.notify_all()
            self._next(pool)

    def wait(self) -> None:
        if self.background:
            self.background = False
            self._join(self.workers - 1)  # the background process goes on beside them
        with self.lock:
            while self.queue or self.running:
                self.idle.wait()
        self._close()

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            self.queue.clear()
            self.parked.clear()
            while self.running:
                self.idle.wait()
        self._close()

    def _close(self) -> None:
        for pool in self.pools:
            pool.shutdown(wait=True, cancel_futures=True)
        self.pools.clear()


_pending: _Background | None = None


def _module_jobs(path: str) -> list[Key]:
    """The distinct keys of compile_jobs() in the test module at `path` (read in a worker process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_jobs_of_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(dict.fromkeys(module.compile_jobs()))


def head_start(module_path: str | os.PathLike, workers: int | None = None) -> None:
    """Begin, in the background, the compiles of compile_jobs() in the test module at `module_path`
    before anything has imported it: the low-priority process reads the module itself (conftest.py,
    before collection). `start(..., background=True)` then adds what it lacks instead of waiting."""
    global _pending
    wait()
    _pending = _Background([], workers or os.cpu_count() or 1, foreground=False, listing=str(module_path))


def start(keys: Iterable[Key], workers: int | None = None, background: bool = False) -> None:
    """Compile every distinct key not yet stored, in `workers` processes (default: one per CPU),
    or first in one low-priority process if `background`, until `wait`; a check of one of them waits.
    A background start joins one under way (`head_start`)."""
    global _pending
    if background and _pending is not None and _pending.background:
        _pending.extend(list(keys))
        return
    wait()
    todo = [k for k in _distinct(keys) if k not in _reports and not _load(k)]
    if todo:
        _pending = _Background(todo, workers or os.cpu_count() or 1, foreground=not background)


def wait() -> None:
    """Until every compile `start` began is done."""
    global _pending
    if _pending is not None:
        _pending.wait()
        _pending = None


def cancel() -> None:
    """Begin no more compiles; wait for those under way (seconds at most)."""
    global _pending
    if _pending is not None:
        _pending.cancel()
        _pending = None


def precompile(keys: Iterable[Key], workers: int | None = None) -> None:
    start(keys, workers)
    wait()


def check_source(source_file: str, defines: Mapping[str, Any], kernel: str, arch: str = "sm_90",
                 fast: bool = False, *, full: bool = False) -> nvrtc_check.ResourceUsage:
    """As nvrtc_check.check_source: kernels/<source_file> compiled with `defines` for `arch`
    (once `start`'s compiles are done if it is among them, else here and now)."""
    k = key(source_file, defines, arch, fast, full=full)
    full_build = _full_build(k)
    if full_build is not None and full_build in _reports:
        k = full_build  # made for another check: it shows as much that the configuration compiles
    if k not in _reports and _pending is not None and k in _pending.keys:
        wait()
    cubin_bytes, log = _report(k)
    usages = nvrtc_check.parse_ptxas_log(log, arch)
    if kernel not in usages:
        raise nvrtc_check.CompileError(f"ptxas reported nothing for kernel {kernel!r} in {source_file}:\n{log}")
    usage = usages[kernel]
    usage.cubin_bytes, usage.options, usage.log = cubin_bytes, k[1], log
    return usage


def check_variant(spec, variant: str, arch: str = "sm_90", epilogue=None, fast: bool = False, *,
                  full: bool = False) -> list[nvrtc_check.ResourceUsage]:
    """As nvrtc_check.check_variant: every kernel of a Conv variant for a ConvSpec."""
    return [check_source(unit.source, unit.defines, unit.function, unit_arch(unit, arch), fast, full=full)
            for unit in nvrtc_check.variant_units(spec, variant, epilogue)]


def variant_keys(spec, variant: str, arch: str, epilogue=None, fast: bool = False, *, full: bool = False) -> list[Key]:
    return [key(unit.source, unit.defines, unit_arch(unit, arch), fast, full=full)
            for unit in nvrtc_check.variant_units(spec, variant, epilogue)]


# the constant-memory families: their builds must use no local memory on either architecture
CONSTANT_FAMILIES = [name for name, family in families.FAMILIES.items() if family.constant_weights]


def is_full_build(usage: nvrtc_check.ResourceUsage) -> bool:
    """Whether `usage` reports the build CuPy makes (the fast mode's does not inline device functions:
    its stack frames and spills say nothing of the kernel that runs)."""
    return FAST_OPTIONS[0] not in usage.options


def assert_no_local_memory(usage: nvrtc_check.ResourceUsage) -> None:
    """A full build spills nothing and has no stack frame; a fast one (an Ampere compile, see
    FULL_BUILD_ARCHS) has compiled, which is all it can show."""
    assert usage.cubin_bytes > 0, usage.log
    if is_full_build(usage):
        assert (usage.spill_stores, usage.spill_loads, usage.stack_frame) == (0, 0, 0), usage.log


def assert_clean(usage, family: str) -> None:
    """A compiled kernel's resource report is sane, and a constant-memory family spills nothing."""
    assert usage.cubin_bytes > 0
    assert 0 < usage.registers <= 255
    if family in CONSTANT_FAMILIES:
        assert_no_local_memory(usage)
