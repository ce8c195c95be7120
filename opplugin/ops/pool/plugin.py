"""The pool plugins: MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool on 2-D float32
maps (ReduceMean over H and W runs this kernel from ops/reduction). The CPU device runs the numpy reference, a CUDA device kernels/pool.cu."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import Kernel, NodeInfo, Plugin
from ..specs import check_one_kernel, spec_of
from .kernel import PoolKernel, ReferencePoolKernel, compile_job, kernel_name
from .spec import PoolSpec


class PoolPlugin(Plugin):
    """Runs one pooling op type (the subclasses name it)."""

    op_type = ""

    def make_spec(self, node: NodeInfo) -> PoolSpec:
        """The node's PoolSpec; a PluginError when it has none."""
        if node.inputs[0].dtype != np.float32:
            raise PluginError(f"only float32 is implemented, the input is {node.inputs[0].dtype}")
        if len([o for o in node.node.output if o]) > 1:
            raise PluginError("the Indices output is not implemented")
        return PoolSpec.from_node(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        try:
            spec = spec_of(node, self.make_spec)
        except PluginError as err:
            return str(err)
        planned = tuple(node.outputs[0].shape)
        computed = spec.output_shape(planned[0]) if planned else ()
        if planned != computed:
            # onnx's shape inference before opset 22 keeps a ceil_mode window that starts in the end pads;
            # onnxruntime drops it (as does this plugin): the plan's shapes after this node would be wrong
            return f"the planned output shape {list(planned)} differs from the one onnxruntime computes, {list(computed)}"
        return None

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        return kernel_name(spec_of(node, self.make_spec), device.is_cuda)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        spec = self._checked_spec(node, device, variant, fused)
        return [compile_job(spec, device.arch)] if device.is_cuda else []

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = self._checked_spec(node, device, variant, fused)
        return PoolKernel(spec) if device.is_cuda else ReferencePoolKernel(spec)

    def _checked_spec(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo]) -> PoolSpec:
        """The node's PoolSpec, once the followers and the variant asked for are found to be ones `build` can make."""
        check_one_kernel(node, device, variant, fused)
        return spec_of(node, self.make_spec)


class MaxPoolPlugin(PoolPlugin):
    op_type = "MaxPool"


class AveragePoolPlugin(PoolPlugin):
    op_type = "AveragePool"


class GlobalMaxPoolPlugin(PoolPlugin):
    op_type = "GlobalMaxPool"


class GlobalAveragePoolPlugin(PoolPlugin):
    op_type = "GlobalAveragePool"

