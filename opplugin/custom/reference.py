"""A custom op's numpy reference as the kernel of its nodes, cast to the declared dtypes: on the
CPU, or on a GPU where no implementation can run them (through the host)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import PluginError
from ..gpu.device import Device
from ..registry import Kernel, NodeInfo


class ReferenceKernel(Kernel):
    """A node run by its op's reference in float64, each output cast to its declared dtype and
    checked against its declared shape (a mismatch is the declaration's, said in one line)."""

    variant = "reference"
    nonfinite_exact = True

    def __init__(self, op: Any, node: NodeInfo, attributes: Mapping[str, Any], device: Device):
        """`op`: the node's CustomOp (its call_reference runs the reference)."""
        self.op, self.node_name, self.attributes, self.device = op, node.name, dict(attributes), device
        self.name = f"{op.name}.reference"
        self.inputs = list(node.inputs)
        self.outputs = list(node.outputs)
        self.elements = sum(int(np.prod(t.shape)) for t in self.outputs)

    def flops(self, batch: int) -> int:
        return 0  # unknown: the reference is arbitrary numpy

    def bytes_moved(self, batch: int) -> int:
        return 0

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        on_gpu = self.device.is_cuda
        host = [self._host(value, on_gpu, stream) for value in inputs]
        results = self.op.call_reference(self.node_name, host, self.attributes)
        batch = _batch(host, self.inputs)
        outputs = []
        for declared, tensor, result in zip(self.op.output_names, self.outputs, results):
            expected = _at_batch(tuple(tensor.shape), batch, self.inputs)
            if tuple(result.shape) != expected:
                raise PluginError(f"{self.node_name}: the reference of {self.op.op_type} returned {declared} "
                                  f"of shape {list(result.shape)}; its shape function says {list(expected)}")
            outputs.append(np.ascontiguousarray(result, dtype=tensor.dtype))
        if on_gpu:
            import cupy

            from ..gpu import cuda

            with cuda.on_stream(stream):
                return [cupy.asarray(value) for value in outputs]
        return outputs

    @staticmethod
    def _host(value: Any, on_gpu: bool, stream: Any) -> Any:
        if value is None or not on_gpu or isinstance(value, np.ndarray):
            return value
        if stream is not None:
            stream.synchronize()
        return value.get()


def _batch(values: Sequence[Any], declared) -> int | None:
    """The batch these inputs carry: the first axis of the first input, where the plan's first input has one."""
    for value, tensor in zip(values, declared):
        if value is not None and tensor.name and tensor.shape:
            return int(np.shape(value)[0])
    return None


def _at_batch(shape: tuple[int, ...], batch: int | None, declared) -> tuple[int, ...]:
    """An output's plan shape with its first axis at `batch`, where it has the plan's batch there."""
    planned = next((t.shape[0] for t in declared if t.name and t.shape), None)
    if batch is None or not shape or planned is None or shape[0] != planned:
        return shape
    return (batch, *shape[1:])
