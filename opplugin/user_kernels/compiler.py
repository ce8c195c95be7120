"""Compiling a user's kernel for one node, on a GPU through CuPy, else through the
NVRTC bindings (which need no GPU), and reading NVRTC's log: a rejected shape, a
contract failure, or an error at a line of the user's file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..gpu import cuda
from .source import CONTRACT_FILE, KernelSource, UserKernelError

# A source rejects a node's shape with `#error reject: <reason>` (see the starter).
_REJECT = re.compile(r"#error directive: reject:?\s*(.*)")
# NVRTC's message lines: FILE(LINE): error: message
_MESSAGE = re.compile(r"^(.*)\((\d+)\): (?:catastrophic )?error: (.*)$")
# the architecture `plan` compiles for on a machine without a GPU
OFFLINE_ARCH = "sm_90"
# set in the sanitizer's and the profiler's child process, so that their findings carry source lines
LINEINFO_ENV = cuda.LINEINFO_ENV


@dataclass
class Compiled:
    """A node's compile: the loaded CuPy module on a GPU (None offline) and the options used."""

    module: Any
    options: tuple[str, ...]


class Rejected(Exception):
    """The source rejected this node's shape; the message is its reason."""


def options_for(digest: str | None = None) -> tuple[str, ...]:
    extra = cuda.line_info_options()
    # the digest makes modules of nodes with different constant weights distinct (CuPy shares equal compiles)
    tag = (f"-DOPPLUGIN_WEIGHTS_DIGEST={digest}",) if digest else ()
    return cuda.BASE_OPTIONS + extra + tag


def compile_node(source: KernelSource, defines: Mapping[str, int], on_gpu: bool, digest: str | None = None) -> Compiled:
    """Compile `source` with a node's macros: Rejected for a shape it turns down, UserKernelError for any other failure."""
    text = source.generated(defines)
    options = options_for(digest)
    if on_gpu:
        import cupy

        module = cupy.RawModule(code=text, options=options)
        try:
            module.compile()
        except cupy.cuda.compiler.CompileException as err:
            raise_for_log(source, err.get_message(), defines)
        return Compiled(module, options)
    from ..gpu.nvrtc import CompileError, NvrtcUnavailable, compile_cubin, fast_compile_options

    try:  # without a GPU the compile only shows whether the source compiles: the fast mode does
        compile_cubin(text, options + fast_compile_options(), OFFLINE_ARCH, name=source.label)
    except NvrtcUnavailable:
        raise
    except CompileError as err:
        raise_for_log(source, str(err), defines)
    return Compiled(None, options)


def raise_for_log(source: KernelSource, log: str, defines: Mapping[str, int]) -> None:
    """Rejected or UserKernelError for NVRTC's log of a failed compile."""
    reject = _REJECT.search(log)
    if reject:
        raise Rejected(reject.group(1).strip() or "rejected by the source")
    messages = [m for m in (_MESSAGE.match(line.strip()) for line in log.splitlines()) if m]
    contract = source.contract
    in_check = [m for m in messages if m.group(1) == CONTRACT_FILE]
    # a wrong signature explains the errors it causes in the body (a parameter missing), so it comes first
    if any("static assertion failed" in m.group(3) for m in in_check):
        raise UserKernelError(f"{source.path}: wrong signature for {contract.entry}: it must be {contract.signature}")
    if messages and len(in_check) == len(messages):
        raise UserKernelError(f"{source.path}: no entry point: it must define {contract.signature}")
    first = next((m for m in messages if m.group(1) != CONTRACT_FILE), None)
    where = f"{source.path}:{first.group(2)}: {first.group(3)}" if first else f"{source.path}: NVRTC failed"
    macros = " ".join(f"{k}={v}" for k, v in defines.items())
    log = re.sub(r'compilation of "[^"]*"', f'compilation of "{source.path}"', log.strip())  # not CuPy's temporary file
    raise UserKernelError(f"{where}\nNVRTC's log (macros {macros}):\n{log}")
