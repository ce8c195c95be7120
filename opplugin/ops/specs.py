"""A plugin's record of a node (`Plugin.make_spec`: a ConvSpec, say), which the plan makes
once per node and hands over as `node.spec`; and the checks of the plugins of one kernel."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..gpu.device import Device
from ..errors import PluginError
from ..registry import NodeInfo


def spec_of(node: NodeInfo, make_spec: Callable[[NodeInfo], Any]) -> Any:
    """The plan's record of `node`, or, for a NodeInfo made by hand (no record), `make_spec`'s made now."""
    return node.spec if node.spec is not None else make_spec(node)


def reason_against(node: NodeInfo, make_spec: Callable[[NodeInfo], Any]) -> str | None:
    """Why `make_spec` cannot read the node (its PluginError's message), or None: the `supports`
    of a plugin whose every limit is checked while it makes a node's record."""
    try:
        spec_of(node, make_spec)
    except PluginError as err:
        return str(err)
    return None


def check_one_kernel(node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo]) -> None:
    """A PluginError for what a plugin of one kernel that fuses nothing cannot build: followers, or a
    variant other than its kernel ('cuda'; on the CPU device, the numpy 'reference')."""
    if fused:
        raise PluginError(f"{node.op_type} {node.name} fuses nothing, not {[n.op_type for n in fused]}")
    if variant not in (None, "reference", "cuda"):
        raise PluginError(f"{node.op_type} has no variant {variant!r}; its kernel is 'cuda' (on the CPU device: 'reference')")
    if variant == "cuda" and not device.is_cuda:
        raise PluginError("variant 'cuda' needs a CUDA device; the CPU device runs the numpy reference")
