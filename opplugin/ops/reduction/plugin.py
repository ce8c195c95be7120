"""The plugins of the reductions and normalisations. The CPU device runs the numpy reference,
a CUDA device kernels/reduce.cu; a ReduceMean over H and W of an N x C x H x W tensor is a
global average pool and runs the pool plugin's kernel, made for that case. A LayerNormalization over
the channel axis between half-precision steps runs kernels/norm_channel_last.cu (channel_last.py)."""
from __future__ import annotations

from typing import Any, Sequence

from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import Kernel, NodeInfo, Plugin
from ..specs import check_one_kernel, spec_of
from ..pool import kernel as pool_kernel
from ..pool.channel_last import linked_config
from ..pool.plugin import ChannelLastPools, build_pool, checked_pool, pool_compile_jobs
from ..pool.spec import PoolSpec
from . import linked_kernel
from .channel_last import ChannelLastNorms, LinkedNorm
from .channel_last import linked_config as linked_norm_config
from .kernel import ReferenceRowKernel, RowKernel, compile_jobs, kernel_name
from .spec import NormSpec, ReduceSpec, SoftmaxSpec, affine


class RowPlugin(Plugin):
    """One op type of this package (the subclasses name it and its spec)."""

    op_type = ""
    spec_type: Any = None

    def make_spec(self, node: NodeInfo) -> Any:
        """The node's spec; a PluginError (the reason `plan` shows) when it has none."""
        spec = self.spec_type.from_node(node)
        if isinstance(spec, NormSpec):
            affine(spec, node)  # a scale or bias the kernel cannot take says so now
        return spec

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        try:
            spec = spec_of(node, self.make_spec)
        except PluginError as err:
            return str(err)
        planned = tuple(node.outputs[0].shape)
        if planned and planned != spec.output_shape(planned[0]):
            return f"the planned output shape {list(planned)} is not {list(spec.output_shape(planned[0]))}"
        return None

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        spec = spec_of(node, self.make_spec)
        if isinstance(spec, PoolSpec):
            config = linked_config(spec, device, variant)
            return pool_kernel.kernel_name(spec, device.is_cuda, config.name() if config else None)
        linked = linked_norm_config(spec, device, variant) if isinstance(spec, NormSpec) else None
        return linked_kernel.kernel_name(spec, linked) if linked else kernel_name(spec, device.is_cuda)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        spec = spec_of(node, self.make_spec)
        if isinstance(spec, PoolSpec):
            return pool_compile_jobs(spec, device, checked_pool(node, device, spec, variant, fused))
        linked = self._checked_linked_norm(node, device, spec, variant, fused)
        if linked:
            return [linked_kernel.compile_job(spec, linked, device.arch)]
        spec = self._checked_spec(node, device, variant, fused)
        return compile_jobs(spec, device.arch) if device.is_cuda else []

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = spec_of(node, self.make_spec)
        if isinstance(spec, PoolSpec):
            return build_pool(spec, device, checked_pool(node, device, spec, variant, fused))
        linked = self._checked_linked_norm(node, device, spec, variant, fused)
        if linked:
            return linked_kernel.LinkedNormKernel(spec, linked, *affine(spec, node))
        spec = self._checked_spec(node, device, variant, fused)
        scale, bias = affine(spec, node) if isinstance(spec, NormSpec) else (None, None)
        return RowKernel(spec, scale, bias) if device.is_cuda else ReferenceRowKernel(spec, scale, bias)

    def _checked_linked_norm(self, node: NodeInfo, device: Device, spec: Any, variant: str | None,
                             fused: Sequence[NodeInfo]) -> LinkedNorm | None:
        """The linked configuration a normalisation's `variant` names (None: none), once it is found to fuse nothing."""
        linked = linked_norm_config(spec, device, variant) if isinstance(spec, NormSpec) else None
        if linked:
            check_one_kernel(node, device, None, fused)
        return linked

    def _checked_spec(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo]) -> Any:
        """The node's spec, once the followers and the variant asked for are found to be ones `build` can make."""
        check_one_kernel(node, device, variant, fused)
        return spec_of(node, self.make_spec)


class ReducePlugin(RowPlugin):
    spec_type = ReduceSpec


def _reduce_plugin(op_type: str) -> type:
    return type(f"{op_type}Plugin", (ReducePlugin,), {"op_type": op_type, "__module__": __name__})


# one class per op type (the registry tells built-ins by their class); ReduceMean's is its own, below
(ReduceSumPlugin, ReduceMaxPlugin, ReduceMinPlugin, ReduceProdPlugin, ReduceL1Plugin, ReduceL2Plugin, ReduceSumSquarePlugin,
 ReduceLogSumPlugin) = (_reduce_plugin(op) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                                                      "ReduceSumSquare", "ReduceLogSum"))


class ReduceMeanPlugin(ChannelLastPools, ReducePlugin):
    """Any axes but the batch; over H and W of a 4-D tensor, the global average pool kernel (which reads X
    channel-last in 16 bits between half-precision steps, as GlobalAveragePool's step does)."""

    op_type = "ReduceMean"

    def make_spec(self, node: NodeInfo) -> Any:
        spec = super().make_spec(node)
        return PoolSpec.from_node(node) if len(spec.input_shape) == 4 and spec.axes == (2, 3) else spec


class SoftmaxPlugin(RowPlugin):
    op_type = "Softmax"
    spec_type = SoftmaxSpec


class LogSoftmaxPlugin(SoftmaxPlugin):
    op_type = "LogSoftmax"


class LayerNormalizationPlugin(ChannelLastNorms, RowPlugin):
    """Over the channel axis of an N x C x H x W tensor, its X and Y may be kept channel-last in 16 bits between
    half-precision steps (channel_last.py); GroupNormalization's and InstanceNormalization's never are."""

    op_type = "LayerNormalization"
    spec_type = NormSpec


class GroupNormalizationPlugin(LayerNormalizationPlugin):
    op_type = "GroupNormalization"


class InstanceNormalizationPlugin(LayerNormalizationPlugin):
    op_type = "InstanceNormalization"
