"""Checking Conv variants offline: each compiled to a cubin without a GPU
(opplugin.gpu.nvrtc), with ptxas's resource report. CI uses this to check every variant
for every shipped Conv shape.

A compile takes up to seconds (the fully unrolled map-group kernels), so each
distinct (source, options, architecture) is compiled once per process, and
`precompile` does a whole list of them in a pool of processes first.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Mapping

from ..gpu import cuda
from ..core import paths
from ..gpu.nvrtc import CUPY_IMPLIED_OPTIONS, CompileError, NvrtcUnavailable, ResourceUsage, compile_cubin, nvrtc_available, parse_ptxas_log

# The compile's own names too, so that a variant check needs this module alone.
__all__ = ["CUPY_IMPLIED_OPTIONS", "CompileError", "NvrtcUnavailable", "ResourceUsage", "check_pool", "check_source",
           "check_variant", "compile_cubin", "nvrtc_available", "parse_ptxas_log", "precompile", "variant_units"]

# (source file, options, arch) -> (cubin bytes, ptxas log) of a successful compile
_reports: dict[tuple[str, tuple[str, ...], str], tuple[int, str]] = {}


def _report(source_file: str, options: tuple[str, ...], arch: str) -> tuple[int, str]:
    """(cubin size, log) of kernels/<source_file> compiled with `options` for `arch`."""
    key = (source_file, options, arch)
    if key not in _reports:
        cubin, log = compile_cubin(paths.kernel_source(source_file), options, arch, name=source_file)
        _reports[key] = (len(cubin), log)
    return _reports[key]


def precompile(jobs: Iterable[tuple[str, Mapping[str, Any], str]], workers: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> None:
    """Compile every distinct (source file, defines, arch) of `jobs`, `workers` processes
    at a time (default: one per CPU), so that check_source finds it done. A job that
    fails to compile is left out: check_source compiles it again and raises with the log."""
    keys = list(dict.fromkeys((source, cuda.nvrtc_options(defines), arch) for source, defines, arch in jobs))
    keys = [key for key in keys if key not in _reports]
    if not keys:
        return
    workers = workers or os.cpu_count() or 1
    # spawn, not fork: the caller may hold threads (onnxruntime's, the host-copy pool)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [(key, pool.submit(_report, *key)) for key in keys]
        for done, (key, future) in enumerate(futures, 1):
            if future.exception() is None:
                _reports[key] = future.result()
            if progress:
                progress(done, len(keys))


def check_source(
    source_file: str, defines: Mapping[str, Any], kernel: str, arch: str = "sm_90"
) -> ResourceUsage:
    """Compile kernels/<source_file> with `defines` for `arch`; the usage of `kernel`."""
    options = cuda.nvrtc_options(defines)
    cubin_bytes, log = _report(source_file, options, arch)
    usages = parse_ptxas_log(log, arch)
    if kernel not in usages:
        raise CompileError(f"ptxas reported nothing for kernel {kernel!r} in {source_file}:\n{log}")
    usage = usages[kernel]
    usage.cubin_bytes = cubin_bytes
    usage.options = options
    usage.log = log
    return usage


def check_variant(spec, variant: str, arch: str = "sm_90", epilogue=None) -> list[ResourceUsage]:
    """Compile every kernel of a Conv variant ("baseline", "const_mo_m8", ...) for a ConvSpec."""
    from ..ops.conv.families.base import unit_arch

    return [check_source(unit.source, unit.defines, unit.function, unit_arch(unit, arch))
            for unit in variant_units(spec, variant, epilogue)]


def variant_units(spec, variant: str, epilogue=None) -> list:
    """The CompileUnits of a Conv variant for a ConvSpec (and epilogue)."""
    from ..ops.conv import families
    from ..ops.conv.epilogue import NONE

    return families.compile_units(spec, variant, epilogue or NONE)


def check_pool(spec, arch: str = "sm_90", linked=None) -> ResourceUsage:
    """Compile kernels/pool.cu for a PoolSpec (ops/pool), or with `linked` (a LinkedPool, ops/pool/channel_last.py)
    kernels/pool_channel_last.cu: the usage of its one kernel."""
    from ..ops.pool import kernel, linked_kernel

    if linked is not None:
        return check_source(linked_kernel.SOURCE, linked_kernel.defines(spec, linked), linked_kernel.function_name(spec), arch)
    return check_source(kernel.SOURCE, kernel.defines(spec), kernel.function_name(spec), arch)
