"""Compiling CUDA source to a cubin with NVRTC alone, no GPU needed, and reading
ptxas's resource report.

NVRTC from `cuda-bindings` + `nvidia-cuda-nvrtc` compiles for any supported
architecture on a CPU-only machine; `--ptxas-options=-v` makes ptxas report,
per kernel, its registers, stack frame, spill stores/loads and constant
memory. `plan` compiles user kernels this way where there is no GPU, and the
lab's nvrtc_check checks every built-in variant with it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# CuPy appends -ftz=true to every compile; this compile does the same so that
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


# NVRTC's fast-compile mode (CUDA 12.8 on): the same front end and ptxas, less optimisation.
# A compile that only shows whether a source compiles takes it: 5 to 40 times quicker on
# unrolled kernels; its register and spill figures are not those of a full build.
FAST_COMPILE_OPTIONS: tuple[str, ...] = ("--Ofast-compile=max",)
FAST_COMPILE_SINCE = (12, 8)


def fast_compile_options() -> tuple[str, ...]:
    """FAST_COMPILE_OPTIONS where the installed NVRTC has the mode, else nothing."""
    try:
        _, major, minor = _nvrtc().nvrtcVersion()
    except (NvrtcUnavailable, ValueError, TypeError):
        return ()
    return FAST_COMPILE_OPTIONS if (major, minor) >= FAST_COMPILE_SINCE else ()


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
