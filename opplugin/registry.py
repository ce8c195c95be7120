"""The plugin protocol and the registry of plugins by ONNX op type.

A plugin claims ONNX nodes of one op type. For each node it either says why it
cannot run it (`supports` returns the reason, shown by `opplugin plan`) or builds
a `Kernel` for a device: a callable taking the node's inputs as arrays (numpy on
the CPU device, CuPy on a CUDA device) and returning its outputs.

Third-party plugins register with `register(plugin)` or through the entry-point
group ``opplugin.plugins`` (each entry point names a Plugin instance or a
zero-argument callable returning one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import onnx

from .errors import PluginError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class NodeInfo:
    """One ONNX node as a plugin sees it: attributes with ONNX defaults not yet
    filled (the op's own plugin knows them), shapes after inference for the
    runner's batch, and constant inputs (initializers) as arrays."""

    node: onnx.NodeProto
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    attributes: dict[str, Any]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name or self.node.output[0]

    @property
    def op_type(self) -> str:
        return self.node.op_type


@dataclass(frozen=True)
class Device:
    """Where a plan runs: "cpu" (numpy reference kernels) or "cuda" (CuPy)."""

    kind: str
    name: str = "cpu"
    compute_capability: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"


@runtime_checkable
class Kernel(Protocol):
    name: str  # e.g. "conv.const_mo4"; says variant and configuration

    def flops(self, batch: int) -> int: ...

    def bytes_moved(self, batch: int) -> int: ...

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]: ...


@runtime_checkable
class Plugin(Protocol):
    op_type: str

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        """None when this plugin can run the node on the device, else the reason."""
        ...

    def build(self, node: NodeInfo, device: Device, variant: str | None = None) -> Kernel:
        ...


_registry: dict[str, Plugin] = {}
_entry_points_loaded = False


def register(plugin: Plugin, *, replace: bool = False) -> Plugin:
    if isinstance(plugin, type) or not isinstance(plugin, Plugin):
        raise TypeError(f"{plugin!r} is not a Plugin instance (an object with op_type, supports and build)")
    if plugin.op_type in _registry and not replace and _registry[plugin.op_type] is not plugin:
        raise PluginError(f"a plugin for {plugin.op_type} is already registered; pass replace=True to override it")
    _registry[plugin.op_type] = plugin
    return plugin


def unregister(op_type: str) -> None:
    _registry.pop(op_type, None)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in entry_points(group="opplugin.plugins"):
        obj = entry.load()
        # an entry point may name a plugin class, a factory function, or an instance
        plugin = obj() if isinstance(obj, type) or not isinstance(obj, Plugin) else obj
        register(plugin, replace=True)


def _load_builtins() -> None:
    from .ops.conv import ConvPlugin

    if "Conv" not in _registry:
        register(ConvPlugin())


def plugins() -> dict[str, Plugin]:
    """All registered plugins by op type: built-ins, entry points, then API calls."""
    _load_builtins()
    _load_entry_points()
    return dict(_registry)


def plugin_for(op_type: str) -> Plugin | None:
    return plugins().get(op_type)
