"""A plugin's record of a node (`Plugin.describe`: a ConvSpec, say), which the plan makes
once per node and hands over as `node.spec`."""
from __future__ import annotations

from typing import Any, Callable

from ..errors import PluginError
from ..registry import NodeInfo


def spec_of(node: NodeInfo, describe: Callable[[NodeInfo], Any]) -> Any:
    """The plan's record of `node`, or, for a NodeInfo made by hand (no record), `describe`'s made now."""
    return node.spec if node.spec is not None else describe(node)


def reason_against(node: NodeInfo, describe: Callable[[NodeInfo], Any]) -> str | None:
    """Why `describe` cannot read the node (its PluginError's message), or None: the `supports`
    of a plugin whose every limit is checked while it describes a node."""
    try:
        spec_of(node, describe)
    except PluginError as err:
        return str(err)
    return None
