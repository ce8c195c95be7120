#!/usr/bin/env python3
"""Make the shipped custom-op example, lenet86_swish, from lenet86.

    python tools/make_custom_example.py [--beta 4] [--out models/lenet86_swish.onnx]

lenet86 with each of its three Relus replaced by a node of an op onnxruntime does not know,
`example.ops::Swish` (y = x * sigmoid(beta * x)), declared in models/lenet86_swish_ops.py.
The trained weights stay: at beta 4 the network classifies the Fashion-MNIST test set about
as well as with Relu (0.908 against 0.903 on its first 2,000 images), so the example's
accuracy line means something.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import onnx
from onnx import helper

REPO = Path(__file__).resolve().parents[1]
DOMAIN = "example.ops"


def with_swish(model: onnx.ModelProto, beta: float) -> onnx.ModelProto:
    """`model` with every Relu an example.ops::Swish of the same name, inputs and outputs."""
    swapped = onnx.ModelProto()
    swapped.CopyFrom(model)
    for node in swapped.graph.node:
        if node.op_type == "Relu":
            node.op_type, node.domain = "Swish", DOMAIN
            node.attribute.append(helper.make_attribute("beta", float(beta)))
    swapped.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    swapped.graph.name = "lenet86_swish"
    swapped.producer_name = "opplugin tools/make_custom_example.py"
    onnx.checker.check_model(swapped, full_check=False)
    return swapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beta", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=REPO / "models" / "lenet86_swish.onnx")
    args = parser.parse_args()
    onnx.save(with_swish(onnx.load(REPO / "models" / "lenet86.onnx"), args.beta), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
