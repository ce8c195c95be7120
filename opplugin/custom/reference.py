"""A custom op's numpy reference as the kernel of its nodes, cast to the declared dtypes: on the
CPU, or on a GPU where no implementation can run them (through the host)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import PluginError
from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from .outputs import CallShapes


class ReferenceKernel(Kernel):
    """A node run by its op's reference in float64, each output cast to its declared dtype and
    checked against its declared shape (a mismatch is the declaration's, said in one line)."""

    variant = "reference"
    nonfinite_exact = True

    def __init__(self, op: Any, node: NodeInfo, attributes: Mapping[str, Any], device: Device):
        """`op`: the node's CustomOp (its call_reference runs the reference)."""
        self.op, self.node_name, self.attributes, self.device = op, node.name, dict(attributes), device
        self.name = f"{op.name}.reference"
        self.node, self.outputs, self.shapes = node, list(node.outputs), CallShapes(node)

    def flops(self, batch: int) -> int:
        return 0  # unknown: the reference is arbitrary numpy

    def bytes_moved(self, batch: int) -> int:
        return self.shapes.bytes(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        on_gpu = self.device.is_cuda
        if on_gpu:
            _refuse_capture(stream, self.node_name)
        host = [self._host(value, on_gpu, stream) for value in inputs]
        results = self.op.call_reference(self.node_name, host, self.attributes)
        outputs = []
        for declared, tensor, shape, result in zip(self.op.output_names, self.outputs, self.shapes.output_shapes(self.shapes.batch(host)), results):
            if tuple(result.shape) != shape:
                raise PluginError(f"{self.node_name}: the reference of {self.op.op_type} returned {declared} "
                                  f"of shape {list(result.shape)}; its shape function says {list(shape)}")
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



def _refuse_capture(stream: Any, node: str) -> None:
    """PluginError while `stream` is being captured into a CUDA graph: the reference waits for the
    device and copies to the host, which would invalidate the capture. Raised before it touches the
    stream, the capture is abandoned cleanly and the run stays eager (runtime/graphs.py)."""
    import cupy

    pointer = (stream or cupy.cuda.get_current_stream()).ptr
    if cupy.cuda.runtime.streamIsCapturing(pointer):
        raise PluginError(f"{node} runs its op's reference on the host, which cannot be captured in a CUDA graph")
