"""Compile a Conv variant to a cubin without a GPU and read ptxas's resource report.

NVRTC from `cuda-bindings` + `nvidia-cuda-nvrtc` compiles for any supported
architecture on a CPU-only machine; `--ptxas-options=-v` makes ptxas report,
per kernel, its registers, stack frame, spill stores/loads and constant
memory. CI uses this to check every variant for every shipped Conv shape.

A compile takes up to seconds (the fully unrolled map-group kernels), so each
distinct (source, options, architecture) is compiled once per process, and
`precompile` does a whole list of them in a pool of processes first.
"""
from __future__ import annotations

import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from .. import cuda, resources

# CuPy appends -ftz=true to every compile; the check does the same so that
# its figures describe the code that actually runs.
CUPY_IMPLIED_OPTIONS: tuple[str, ...] = ("-ftz=true",)


class NvrtcUnavailable(RuntimeError):
    """cuda-bindings' nvrtc (or the NVRTC library it loads) is not installed."""


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message carries its log."""


@dataclass
class ResourceUsage:
    """ptxas's report for one kernel compiled for one architecture."""

    kernel: str
    arch: str
    registers: int = 0
    stack_frame: int = 0  # bytes
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    global_memory: int = 0  # bytes of module-scope __device__ variables
    # bank -> bytes: the module line (user __constant__ data in bank 3; ptxas for
    # sm_90 leaves it out) merged with the kernel's own line (parameters and so on)
    constant_memory: dict[int, int] = field(default_factory=dict)
    cubin_bytes: int = 0
    options: tuple[str, ...] = ()
    log: str = ""

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python before the cuda.bindings split
        except ImportError as err:
            message = "cuda-bindings is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)"
            raise NvrtcUnavailable(message) from err
    try:
        nvrtc.nvrtcVersion()
    except Exception as err:  # the bindings load libnvrtc lazily
        raise NvrtcUnavailable(f"the NVRTC library could not be loaded: {err}") from err
    return nvrtc


def nvrtc_available() -> bool:
    try:
        _nvrtc()
    except NvrtcUnavailable:
        return False
    return True


def _check(nvrtc, result, what: str) -> Any:
    """cuda-bindings returns (status, values...); raise on a failed status."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def compile_cubin(source: str, options: tuple[str, ...], arch: str, name: str = "kernel.cu") -> tuple[bytes, str]:
    """(cubin, log) of `source` compiled for `arch` (e.g. "sm_90") with ptxas -v."""
    nvrtc = _nvrtc()
    program = _check(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        all_options = [*options, *CUPY_IMPLIED_OPTIONS, f"--gpu-architecture={arch}", "--ptxas-options=-v"]
        encoded = [o.encode() for o in all_options]
        status, = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        log_buffer = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(program, log_buffer), "nvrtcGetProgramLog")
        log = log_buffer.rstrip(b"\x00 ").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC could not compile {name} for {arch} ({status.name}):\n{log}")
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(program)


_FUNCTION = re.compile(r"Function properties for (\w+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_GMEM = re.compile(r"(\d+) bytes gmem")


def parse_ptxas_log(log: str, arch: str) -> dict[str, ResourceUsage]:
    """Per kernel name, the figures ptxas -v printed for it."""
    usages: dict[str, ResourceUsage] = {}
    current: ResourceUsage | None = None
    module_gmem, module_cmem = 0, {}
    for line in log.splitlines():
        if match := _FUNCTION.search(line):
            name = match.group(1)
            current = usages.setdefault(
                name, ResourceUsage(name, arch, global_memory=module_gmem, constant_memory=dict(module_cmem))
            )
        elif match := _GMEM.search(line):
            module_gmem = int(match.group(1))
            module_cmem = {int(bank): int(size) for size, bank in _CMEM.findall(line)}
        elif current is None:
            continue
        elif match := _FRAME.search(line):
            current.stack_frame, current.spill_stores, current.spill_loads = (int(g) for g in match.groups())
        elif match := _REGISTERS.search(line):
            current.registers = int(match.group(1))
            current.constant_memory.update({int(bank): int(size) for size, bank in _CMEM.findall(line)})
    return usages


# (source file, options, arch) -> (cubin bytes, ptxas log) of a successful compile
_reports: dict[tuple[str, tuple[str, ...], str], tuple[int, str]] = {}


def _report(source_file: str, options: tuple[str, ...], arch: str) -> tuple[int, str]:
    """(cubin size, log) of kernels/<source_file> compiled with `options` for `arch`."""
    key = (source_file, options, arch)
    if key not in _reports:
        cubin, log = compile_cubin(resources.kernel_source(source_file), options, arch, name=source_file)
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
    """Compile every kernel of a Conv variant ("baseline", "const_mo8", ...) for a ConvSpec."""
    return [check_source(unit.source, unit.defines, unit.function, arch) for unit in variant_units(spec, variant, epilogue)]


def variant_units(spec, variant: str, epilogue=None) -> list:
    """The CompileUnits of a Conv variant for a ConvSpec (and epilogue)."""
    from ..ops.conv import families
    from ..ops.conv.epilogue import NONE

    return families.compile_units(spec, variant, epilogue or NONE)


def check_pool(spec, arch: str = "sm_90") -> ResourceUsage:
    """Compile kernels/pool.cu for a PoolSpec (ops/pool): the usage of its one kernel."""
    from ..ops.pool import kernel

    return check_source(kernel.SOURCE, kernel.defines(spec), kernel.function_name(spec), arch)
