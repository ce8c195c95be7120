"""`CudaSourcePlugin`: the base class for a plugin whose kernel is CUDA source and whose
launch is written in Python (more than one kernel, a workspace, a grid that directives
cannot say). Compiling, the mapping of NVRTC's messages to the source's own lines and
the Kernel object are done here; a subclass says what is particular to it:

    class MyConv(CudaSourcePlugin):
        op_type = "Conv"
        source_path = "my_conv.cu"          # or `source_text`
        entry = "my_conv"                   # the extern "C" __global__ function

        def defines(self, node):            # macros for this node
            return {"C": ..., "M": ...}

        def output_shapes(self, node, inputs):
            x = inputs[0]
            return [(x.shape[0], M, OH, OW)]

        def launch(self, function, node, inputs, outputs, stream):
            function((blocks,), (256,), (inputs[0], inputs[1], outputs[0], np.int32(inputs[0].shape[0])))

    opplugin.registry.register(MyConv(), replace=True)

On a machine without a GPU `build` raises a PluginError: such a plugin has no CPU code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..gpu.device import Device
from ..errors import PluginError
from ..registry import Kernel, NodeInfo, Plugin
from .compiler import Rejected, compile_node
from .contract import Contract
from .source import KernelSource, check_entry_point, parse_directives


class _FreeSource(KernelSource):
    """A KernelSource whose contract is the subclass's own entry point, with no signature check."""

    def __init__(self, path: str, text: str, entry: str):
        self.path, self.op_type, self.text = path, "custom", text
        self.contract = Contract("custom", entry, (), lambda node, epilogue: {}, lambda defines: 0, False, "")
        self.launch = parse_directives(path, text)
        check_entry_point(path, text, self.contract)


class SourceKernel(Kernel):
    """A node's build of a CudaSourcePlugin: allocates the outputs, then the plugin's launch."""

    variant = None

    def __init__(self, plugin: "CudaSourcePlugin", node: NodeInfo, function: Any, name: str):
        self.plugin, self.node, self.function = plugin, node, function
        self.functions = [function]
        self.name = name

    def flops(self, batch: int) -> int:
        return self.plugin.flops(self.node, batch)

    def bytes_moved(self, batch: int) -> int:
        return self.plugin.bytes_moved(self.node, batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy

        from ..gpu import cuda

        with cuda.on_stream(stream):
            outputs = [cupy.empty(shape, cupy.float32) for shape in self.plugin.output_shapes(self.node, inputs)]
            self.plugin.launch(self.function, self.node, inputs, outputs, stream)
        return outputs


class CudaSourcePlugin(Plugin):
    """Subclass and set op_type, entry and source_path (or source_text); write defines,
    output_shapes and launch. supports() takes float32 nodes on a GPU; override it to turn
    down more. flops() and bytes_moved() count 0 unless overridden (the report then
    leaves GFLOP/s and GB/s empty)."""

    op_type: str = ""
    entry: str = ""
    source_path: str | None = None
    source_text: str | None = None

    def _source(self) -> _FreeSource:
        if self.source_text is not None:
            return _FreeSource(self.source_path or f"<{type(self).__name__}>", self.source_text, self.entry)
        if not self.source_path or not Path(self.source_path).is_file():
            raise PluginError(f"{type(self).__name__}: source_path {self.source_path!r} is not a file")
        return _FreeSource(self.source_path, Path(self.source_path).read_text(), self.entry)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        if not device.is_cuda:
            return f"{type(self).__name__} runs CUDA source only, and there is no GPU"
        return None if all(t.dtype.kind == "f" and t.dtype.itemsize == 4 for t in node.inputs if t.name) else "float32 only"

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        """The node's kernel, its source compiled through CuPy (not the kernel cache: compile_jobs declares nothing)."""
        if not device.is_cuda:
            raise PluginError(f"{type(self).__name__} needs a CUDA device")
        source = self._source()
        try:
            compiled = compile_node(source, self.defines(node), on_gpu=True)
        except Rejected as reason:
            raise PluginError(f"{source.path} rejects {node.name}: {reason}") from None
        return SourceKernel(self, node, compiled.module.get_function(self.entry), self.kernel_name(node, device))

    # --- what a subclass writes --------------------------------------------------------

    def defines(self, node: NodeInfo) -> dict[str, int]:
        """The macros this node's module is compiled with."""
        return {}

    def output_shapes(self, node: NodeInfo, inputs: Sequence[Any]) -> list[tuple[int, ...]]:
        raise NotImplementedError(f"{type(self).__name__} must say its output shapes")

    def launch(self, function: Any, node: NodeInfo, inputs: Sequence[Any], outputs: list[Any], stream: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must launch its kernel")

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        return Path(self.source_path).name if self.source_path else type(self).__name__

    def flops(self, node: NodeInfo, batch: int) -> int:
        return 0

    def bytes_moved(self, node: NodeInfo, batch: int) -> int:
        return 0
