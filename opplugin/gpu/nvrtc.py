"""Compiling CUDA source to a cubin with NVRTC alone, no GPU needed, and reading
ptxas's resource report.

NVRTC is reached through CuPy's own wrapper where CuPy is installed (the library
CuPy runs kernels with), else through `cuda-bindings` + `nvidia-cuda-nvrtc`, which
compile for any supported architecture on a CPU-only machine. The runtime's kernel
cache (kernel_cache.py) compiles with it too. `--ptxas-options=-v` makes ptxas report,
per kernel, its registers, stack frame, spill stores/loads and constant
memory. `plan` compiles user kernels this way where there is no GPU, and the
lab's nvrtc_check checks every built-in variant with it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import first_line

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


class _CudaBindings:
    """NVRTC through cuda-bindings (`cuda.bindings.nvrtc`): calls return (status, values...)."""

    name = "cuda-bindings"

    def __init__(self):
        try:
            from cuda.bindings import nvrtc
        except ImportError:
            from cuda import nvrtc  # cuda-python before the cuda.bindings split
        self.nvrtc = nvrtc
        self.version()  # the bindings load libnvrtc lazily: fail here, not at the first compile

    def _check(self, result, what: str) -> Any:
        status, *values = result if isinstance(result, tuple) else (result,)
        if status != self.nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{what} failed: {status!r}")
        return values[0] if len(values) == 1 else values

    def version(self) -> tuple[int, int]:
        major, minor = self._check(self.nvrtc.nvrtcVersion(), "nvrtcVersion")
        return int(major), int(minor)

    def supported_archs(self) -> tuple[int, ...]:
        count = self._check(self.nvrtc.nvrtcGetNumSupportedArchs(), "nvrtcGetNumSupportedArchs")
        return tuple(int(a) for a in self._check(self.nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")[:count])

    def compile(self, source: str, options: Sequence[str], name: str) -> tuple[bytes | None, str]:
        nvrtc = self.nvrtc
        program = self._check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
        try:
            encoded = [o.encode() for o in options]
            status, = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
            size = self._check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log_buffer = b" " * size
            self._check(nvrtc.nvrtcGetProgramLog(program, log_buffer), "nvrtcGetProgramLog")
            log = log_buffer.rstrip(b"\x00 ").decode(errors="replace")
            if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                return None, log
            size = self._check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
            cubin = b" " * size
            self._check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
            return cubin, log
        finally:
            nvrtc.nvrtcDestroyProgram(program)


class _CupyBindings:
    """NVRTC through CuPy's own wrapper: the library CuPy compiles with, so on a GPU machine
    the cubins are those CuPy would make; errors are NVRTCError exceptions."""

    name = "cupy"

    def __init__(self):
        from cupy_backends.cuda.libs import nvrtc

        self.nvrtc = nvrtc
        for needed in ("getVersion", "getSupportedArchs", "createProgram", "compileProgram", "getCUBIN", "getProgramLog"):
            getattr(nvrtc, needed)  # an older CuPy without getCUBIN: AttributeError, and cuda-bindings is tried
        self.version()

    def version(self) -> tuple[int, int]:
        major, minor = self.nvrtc.getVersion()
        return int(major), int(minor)

    def supported_archs(self) -> tuple[int, ...]:
        return tuple(int(a) for a in self.nvrtc.getSupportedArchs())

    def compile(self, source: str, options: Sequence[str], name: str) -> tuple[bytes | None, str]:
        nvrtc = self.nvrtc
        program = nvrtc.createProgram(source, name, (), ())
        try:
            try:
                nvrtc.compileProgram(program, list(options))
            except nvrtc.NVRTCError:
                return None, nvrtc.getProgramLog(program)
            return nvrtc.getCUBIN(program), nvrtc.getProgramLog(program)
        finally:
            nvrtc.destroyProgram(program)


@functools.lru_cache(maxsize=1)
def _binding():
    """CuPy's NVRTC wrapper where CuPy is installed (what a GPU run compiles with), else cuda-bindings'."""
    failures = []
    for binding in (_CupyBindings, _CudaBindings):
        try:
            return binding()
        except Exception as err:  # not installed, too old, or libnvrtc missing: try the next
            failures.append(f"{binding.name}: {first_line(err)}")
    raise NvrtcUnavailable("NVRTC could not be loaded (pip install cuda-bindings nvidia-cuda-nvrtc); " + "; ".join(failures))


def _nvrtc():
    """The NVRTC binding in use (NvrtcUnavailable when there is none)."""
    return _binding()


def nvrtc_version() -> tuple[int, int]:
    return _nvrtc().version()


def supported_archs() -> tuple[int, ...]:
    """The compute capabilities (90 for sm_90) the installed NVRTC compiles for."""
    return _nvrtc().supported_archs()


# NVRTC's fast-compile mode (CUDA 12.8 on): the same front end and ptxas, less optimisation.
# A compile that only shows whether a source compiles takes it: 5 to 40 times quicker on
# unrolled kernels; its register and spill figures are not those of a full build.
FAST_COMPILE_OPTIONS: tuple[str, ...] = ("--Ofast-compile=max",)
FAST_COMPILE_SINCE = (12, 8)


def fast_compile_options() -> tuple[str, ...]:
    """FAST_COMPILE_OPTIONS where the installed NVRTC has the mode, else nothing."""
    try:
        version = nvrtc_version()
    except (NvrtcUnavailable, CompileError, ValueError, TypeError):
        return ()
    return FAST_COMPILE_OPTIONS if version >= FAST_COMPILE_SINCE else ()


def nvrtc_available() -> bool:
    try:
        _nvrtc()
    except NvrtcUnavailable:
        return False
    return True


def compile_program(source: str, options: Sequence[str], name: str = "kernel.cu") -> tuple[bytes | None, str]:
    """(cubin, log) of `source` compiled with exactly `options` (the architecture among them);
    the cubin is None when NVRTC rejects the source, and the log says why."""
    return _nvrtc().compile(source, options, name)


def compile_cubin(source: str, options: tuple[str, ...], arch: str, name: str = "kernel.cu") -> tuple[bytes, str]:
    """(cubin, log) of `source` compiled for `arch` (e.g. "sm_90") with ptxas -v."""
    cubin, log = compile_program(source, [*options, *CUPY_IMPLIED_OPTIONS, f"--gpu-architecture={arch}", "--ptxas-options=-v"], name)
    if cubin is None:
        raise CompileError(f"NVRTC could not compile {name} for {arch}:\n{log}")
    return cubin, log


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
