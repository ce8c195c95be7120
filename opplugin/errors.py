"""Typed errors: each one says what is wrong in one line; the CLI prints it and exits 2."""


class OpPluginError(Exception):
    """Base of every error opplugin raises on purpose."""


class ModelError(OpPluginError, ValueError):
    """The model file is missing, unreadable, not ONNX, or not something opplugin can run."""


class InputError(OpPluginError, ValueError):
    """Inputs do not match the model: wrong name, rank, shape, dtype, or batch."""


class DeviceError(OpPluginError, RuntimeError):
    """The requested device is not there or cannot be used."""


class PluginError(OpPluginError, ValueError):
    """A plugin was misused: unknown variant, unsupported node, kernel build failure."""
