"""The pool plugins: MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool on 2-D float32
maps (ReduceMean over H and W runs this kernel from ops/reduction). The CPU device runs the numpy reference, a CUDA device kernels/pool.cu,
or, between half-precision steps that keep their tensors channel-last in 16 bits, kernels/pool_channel_last.cu (channel_last.py)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import ChannelLast, Kernel, NodeInfo, Plugin
from ..channel_last import check_offered, plain_offer
from ..specs import check_one_kernel, spec_of
from . import linked_kernel
from .channel_last import PLAIN, LinkedPool, linked, linked_config, offered
from .kernel import PoolKernel, ReferencePoolKernel, compile_job, kernel_name
from .spec import PoolSpec


def build_pool(spec: PoolSpec, device: Device, config: LinkedPool | None) -> Kernel:
    """The pool's kernel: on channel-last tensors where `config` links some, else the plain one of the device."""
    if config is not None:
        return linked_kernel.LinkedPoolKernel(spec, config)
    return PoolKernel(spec) if device.is_cuda else ReferencePoolKernel(spec)


def pool_compile_jobs(spec: PoolSpec, device: Device, config: LinkedPool | None) -> list[CompileJob]:
    """What build_pool compiles."""
    if not device.is_cuda:
        return []
    return [linked_kernel.compile_job(spec, config, device.arch) if config else compile_job(spec, device.arch)]


def checked_pool(node: NodeInfo, device: Device, spec: PoolSpec, variant: str | None, fused: Sequence[NodeInfo]) -> LinkedPool | None:
    """The linked configuration `variant` names (None: the plain kernel), once the followers and the variant are
    found to be ones a pool's kernel can run."""
    config = linked_config(spec, device, variant)
    check_one_kernel(node, device, None if config else variant, fused)
    return config


class ChannelLastPools:
    """Plugin.channel_last, linked_variant and nonfinite_exact_variant for a plugin whose node may be a pool
    (its spec a PoolSpec): the pools' own, and ReduceMean's over H and W."""

    def channel_last(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = ()) -> ChannelLast | None:
        """A pool's step can take X channel-last, and a window pool's write Y so (channel_last.py): in any 16-bit
        format with the plain kernel, in its own with a linked variant (whose links the plan makes again)."""
        spec = spec_of(node, self.make_spec)
        if not isinstance(spec, PoolSpec) or fused or prologue:
            return None
        config = None if variant in (None, PLAIN) else linked_config(spec, device, variant)
        return plain_offer(offered(spec, device), variant, config)

    def linked_variant(self, node: NodeInfo, device: Device, variant: str | None, inputs: frozenset[int], output: bool,
                       format: str, fused: Sequence[NodeInfo] = (), prologue: Sequence[NodeInfo] = ()) -> str:
        check_offered(self.channel_last(node, device, variant, fused, prologue), output, format, f"{node.op_type} {node.name}", variant)
        return linked(spec_of(node, self.make_spec), format, inputs, output).name()

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        """The plain kernel, on a GPU: an average rounded into FP16 as a linked kernel stores it may pass its range,
        and the plain one keeps NaN and Inf as onnxruntime's average does (a max pool reruns on onnxruntime)."""
        return PLAIN if device.is_cuda and isinstance(spec_of(node, self.make_spec), PoolSpec) else None


class PoolPlugin(ChannelLastPools, Plugin):
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
        spec = spec_of(node, self.make_spec)
        config = linked_config(spec, device, variant)
        return kernel_name(spec, device.is_cuda, config.name() if config else None)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        spec = spec_of(node, self.make_spec)
        return pool_compile_jobs(spec, device, checked_pool(node, device, spec, variant, fused))

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = spec_of(node, self.make_spec)
        return build_pool(spec, device, checked_pool(node, device, spec, variant, fused))


class MaxPoolPlugin(PoolPlugin):
    op_type = "MaxPool"


class AveragePoolPlugin(PoolPlugin):
    op_type = "AveragePool"


class GlobalMaxPoolPlugin(PoolPlugin):
    op_type = "GlobalMaxPool"


class GlobalAveragePoolPlugin(PoolPlugin):
    op_type = "GlobalAveragePool"
