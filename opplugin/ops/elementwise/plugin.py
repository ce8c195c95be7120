"""The elementwise plugins: Add, Sum of two, Mul, and the activations of ops/activation.py's table,
so that what a Conv or Gemm epilogue cannot take still runs on the device. A binary op fuses
the activation after it (Add > Relu). The CPU device runs the numpy reference; a CUDA device
a CuPy ElementwiseKernel whose body is the op and the table's CUDA expression of the activation
(kernels/activation.cuh), which broadcasts a per-channel or scalar constant as numpy does."""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from ... import cuda, resources
from ...device import Device
from ...errors import PluginError
from ...registry import Kernel, NodeInfo, Plugin
from ..described import spec_of
from .. import activation as activations
from .spec import BINARY, ElementwiseSpec


def kernel_name(spec: ElementwiseSpec, on_device: bool) -> str:
    return f"elementwise.{'cuda' if on_device else 'reference'}.{spec.suffix}"


class ReferenceElementwiseKernel(Kernel):
    """The numpy reference, run as the kernel of the CPU device: float64 arithmetic, float32 out."""

    nonfinite_exact = True  # IEEE arithmetic and the table's NaN-keeping activations: NaN and Inf as onnxruntime has them
    in_views = True  # numpy and CuPy's elementwise kernels read any strided view (registry.Kernel)

    def __init__(self, spec: ElementwiseSpec, elements: int):
        self.spec, self._elements = spec, elements
        self.name = kernel_name(spec, on_device=False)

    def flops(self, batch: int) -> int:
        return batch * self._elements * (1 + (self.spec.then is not None))

    def bytes_moved(self, batch: int) -> int:
        return 4 * batch * self._elements * (2 if self.spec.unary else 3)

    def operands(self, inputs: Sequence[Any]) -> list[Any]:
        """X for an activation (a Clip's bounds are compiled in), A and B for a binary op."""
        return list(inputs[:1] if self.spec.unary else inputs[:2])

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        operands = [np.asarray(x, np.float64) for x in self.operands(inputs)]
        return [np.asarray(self.spec.apply(operands), np.float32)]


@functools.lru_cache(maxsize=None)
def _cupy_kernel(operation: str, expression: str, binary: bool):
    """One ElementwiseKernel per (op, activation expression): y = ACTIVATION(operation)."""
    import cupy

    preamble = f"#define ACTIVATION(v) ({expression})\n" + resources.kernel_source("activation.cuh")
    params = "float32 a, float32 b" if binary else "float32 a"
    return cupy.ElementwiseKernel(params, "float32 y", f"y = opplugin_activation({operation})", "opplugin_elementwise", preamble=preamble)


class CupyElementwiseKernel(ReferenceElementwiseKernel):
    """The op and its activation in one CuPy ElementwiseKernel (one launch, each element read and written once)."""

    out_view = "strided"  # CuPy's elementwise kernels write any view (registry.Kernel)

    def __init__(self, spec: ElementwiseSpec, elements: int):
        super().__init__(spec, elements)
        self.name = kernel_name(spec, on_device=True)
        activation = spec.unary or spec.then
        expression = activation.cuda_expression() if activation else "v"
        self._kernel = _cupy_kernel("a" if spec.unary else BINARY[spec.op][1], expression, spec.unary is None)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        """[Y] for the operands; Y is `out` when given (a float32 CuPy array of the output's shape, written in full)."""
        import cupy

        operands = self.operands(inputs)
        if any(not isinstance(x, cupy.ndarray) or x.dtype != np.float32 for x in operands):
            raise PluginError(f"{self.name}: the operands must be float32 CuPy arrays")
        with cuda.on_stream(stream):
            return [self._kernel(*operands) if out is None else self._kernel(*operands, out)]


class ElementwisePlugin(Plugin):
    """Runs one elementwise op type (the subclasses below name them)."""

    op_type = ""

    def describe(self, node: NodeInfo) -> ElementwiseSpec:
        return ElementwiseSpec.from_node(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        try:
            spec_of(node, self.describe)
        except PluginError as err:
            return str(err)
        return None

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """A binary op takes one activation of the table after it."""
        if node.op_type not in BINARY or not followers or followers[0].outputs[0].dtype != np.float32:
            return 0
        return int(activations.from_node(followers[0]) is not None)

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = ()) -> str:
        return kernel_name(self._fused_spec(node, fused), device.is_cuda)

    def _fused_spec(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> ElementwiseSpec:
        """The node's op with the activation it fuses, if any."""
        spec = spec_of(node, self.describe)
        if not fused:
            return spec
        then = activations.from_node(fused[0]) if len(fused) == 1 and node.op_type in BINARY else None
        if then is None:
            raise PluginError(f"{node.op_type} {node.name} cannot fuse {[n.op_type for n in fused]}")
        return spec.fused(then)

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = ()) -> Kernel:
        spec = self._fused_spec(node, fused)
        if variant not in (None, "reference", "cuda"):
            raise PluginError(f"{node.op_type} has no variant {variant!r}; its kernel is 'cuda' (on the CPU device: 'reference')")
        elements = int(np.prod(node.outputs[0].shape[1:], dtype=np.int64))
        if not device.is_cuda:
            return ReferenceElementwiseKernel(spec, elements)
        return CupyElementwiseKernel(spec, elements)


class AddPlugin(ElementwisePlugin):
    op_type = "Add"


class SumPlugin(ElementwisePlugin):
    op_type = "Sum"


class MulPlugin(ElementwisePlugin):
    op_type = "Mul"


# one per activation of ops/activation.py's table (a test checks that none is missing)
class ReluPlugin(ElementwisePlugin):
    op_type = "Relu"


class TanhPlugin(ElementwisePlugin):
    op_type = "Tanh"


class SigmoidPlugin(ElementwisePlugin):
    op_type = "Sigmoid"


class LeakyReluPlugin(ElementwisePlugin):
    op_type = "LeakyRelu"


class ClipPlugin(ElementwisePlugin):
    op_type = "Clip"


class HardSigmoidPlugin(ElementwisePlugin):
    op_type = "HardSigmoid"


class HardSwishPlugin(ElementwisePlugin):
    op_type = "HardSwish"
