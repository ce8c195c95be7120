"""Typed errors: each one says what is wrong in its first line; the CLI prints it and exits 2."""
from __future__ import annotations


class OpPluginError(Exception):
    """Base of every error opplugin raises on purpose."""


class ModelError(OpPluginError, ValueError):
    """The model file is missing, unreadable, not ONNX, or not something opplugin can run."""


class InputError(OpPluginError, ValueError):
    """Inputs do not match the model: wrong name, rank, shape, dtype, or batch."""


class DeviceError(OpPluginError, RuntimeError):
    """The requested device is not there or cannot be used."""


class OutOfDeviceMemory(DeviceError):
    """Even the smallest chunk of the batch did not fit in device memory."""


class PluginError(OpPluginError, ValueError):
    """A plugin was misused: unknown variant, unsupported node, kernel build failure."""


class KernelCompileError(PluginError):
    """NVRTC rejected a kernel source. The first line of the message names the source
    and its -D options; the compiler's log follows on the next lines."""

    def __init__(self, source_file: str, options: tuple[str, ...], log: str):
        self.source_file, self.options, self.log = source_file, tuple(options), log.strip()
        first = next((line.strip() for line in self.log.splitlines() if "error" in line), "see the log below")
        defines = " ".join(o for o in self.options if o.startswith("-D")) or "no -D options"
        super().__init__(f"kernel {source_file} failed to compile with NVRTC ({defines}): {first}\n{self.log}")
