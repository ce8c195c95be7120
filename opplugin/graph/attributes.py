"""An ONNX node's attribute by name, as a Python value: what the graph rewrites read."""
from __future__ import annotations

import onnx
from onnx import helper


def attribute(node: onnx.NodeProto, name: str, default=None):
    """The value of `node`'s attribute `name`, or `default` where the node does not set it."""
    for entry in node.attribute:
        if entry.name == name:
            return helper.get_attribute_value(entry)
    return default
