"""Typed errors: each one says what is wrong in its first line; the CLI prints it and exits 2.

Also the two helpers every layer uses around them: `positive_int` checks a count
the user gave, `first_line` shortens any error to the line a table or a message
has room for.
"""
from __future__ import annotations

from typing import Any

import numpy as np


class OpPluginError(Exception):
    """Base of every error opplugin raises on purpose. The CLI prints its message after
    "opplugin: error: ", or as it is where the message says where itself (`located`: a
    compiler-like "file:line: ..."), and exits 2."""

    located: bool = False
    # True where the GPU is still busy with a kernel that never finished: the process must exit
    # at once rather than wait for the device at its normal exit
    abandon_process: bool = False


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


def positive_int(value: Any, what: str, *, allow_zero: bool = False) -> int:
    """`value` as an int; InputError naming `what` when it is not a whole number of at
    least 1 (or 0 with allow_zero). Booleans are refused: True is not a batch size."""
    least = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        kind = "a non-negative integer" if allow_zero else "a positive integer"
        raise InputError(f"{what} must be {kind}, got {value!r}")
    return int(value)


def batch_sizes(values: Any, default: Any) -> list[int]:
    """The sizes of a `--batches` flag, given space or comma separated (`default` when it is
    not given); InputError unless each is a positive integer."""
    words = [word for item in (values or default) for word in str(item).replace(",", " ").split()]
    try:
        numbers = [int(word) for word in words]
    except ValueError:
        raise InputError(f"--batches must be positive integers, got {' '.join(words)}") from None
    return [positive_int(number, "--batches") for number in numbers]


def first_line(error: BaseException, *, named: bool = False) -> str:
    """The first line of an error's message, or its type's name when the message is
    empty; `named` puts the type's name in front ("KernelCompileError: ...")."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if not line:
        return type(error).__name__
    return f"{type(error).__name__}: {line}" if named else line
