"""An ONNX node's attributes as Python values: one by name (what the graph rewrites read), or all of them."""
from __future__ import annotations

import onnx
from onnx import helper


def attribute(node: onnx.NodeProto, name: str, default=None):
    """The value of `node`'s attribute `name`, or `default` where the node does not set it."""
    for entry in node.attribute:
        if entry.name == name:
            return helper.get_attribute_value(entry)
    return default


def attributes(node: onnx.NodeProto) -> dict:
    """Every attribute the node sets, by name, as Python values."""
    return {entry.name: helper.get_attribute_value(entry) for entry in node.attribute}
