"""A user's kernel file as a plugin: compiled per node with that node's macros, run
in place of the built-in choice on a GPU, the built-in plugin (or onnxruntime)
running the shapes the source rejects and everything on a machine without a GPU.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ..gpu.device import Device
from ..gpu.kernel_cache import CompileJob
from ..errors import PluginError
from ..registry import Kernel, NodeInfo, Plugin
from .compiler import Compiled, Rejected, compile_node
from .contract import user_fusable
from .source import KernelSource, UserKernelError, UserKernelHang, evaluate

# How long the first launch of a kernel (on one image) may take before it counts as hung.
HANG_SECONDS = 10.0
GRID_X_LIMIT = 2**31 - 1


class UserKernel(Kernel):
    """One node's build of a user's kernel: launches the entry point with the contract's
    arguments, into a new output (poisoned with NaN first when `poison`, so that elements
    the kernel never writes show in a check)."""

    variant = None

    def __init__(self, source: KernelSource, node_name: str, image_shape: tuple[int, ...], compiled: Compiled,
                 defines: dict[str, int], poison: bool, spec=None):
        """`image_shape`: one image of the input; `spec`: the ConvSpec of a Conv node."""
        self.source, self.node_name, self.image_shape = source, node_name, tuple(image_shape)
        self.defines, self.poison, self.spec = defines, poison, spec
        self.name = source.label
        self.function = compiled.module.get_function(source.contract.entry)
        self.functions = [self.function]  # what the lab reads registers and local memory from
        self.per_image = source.contract.outputs_per_image(defines)

    @classmethod
    def for_node(cls, source: KernelSource, node: NodeInfo, compiled: Compiled, defines: dict[str, int], poison: bool) -> "UserKernel":
        spec = _conv_spec(node) if source.op_type == "Conv" else None
        return cls(source, node.name, node.inputs[0].shape[1:], compiled, defines, poison, spec)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        if self.spec is not None:
            return (batch, self.defines["M"], self.defines["POH"], self.defines["POW"])
        return (batch, *self.image_shape)

    def flops(self, batch: int) -> int:
        if self.spec is not None:
            computed = (self.defines["POH"] * self.defines["PKH"], self.defines["POW"] * self.defines["PKW"])
            return self.spec.flops(batch, computed)
        return batch * self.per_image

    def bytes_moved(self, batch: int) -> int:
        if self.spec is not None:
            return self.spec.bytes_moved(batch) - 4 * int(np.prod(self.spec.output_shape(batch))) + 4 * batch * self.per_image
        return 8 * batch * self.per_image

    def grid(self, batch: int) -> tuple[int, ...]:
        launch = self.source.launch
        if launch.grid:
            names = self.source.grid_names(self.defines, batch)
            grid = tuple(evaluate(text, names, self.source.grid_where) for text in launch.grid)
        else:
            threads = -(-batch * self.per_image // launch.outputs_per_thread)
            grid = (max(1, -(-threads // launch.block)),)
        if grid[0] > GRID_X_LIMIT or any(g > 65535 for g in grid[1:]) or any(g < 1 for g in grid):
            raise UserKernelError(f"{self.source.path}: grid {grid} for {self.node_name} at batch {batch} is outside CUDA's limits")
        return grid

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy

        from ..gpu import cuda

        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(inputs[0], dtype=cupy.float32)
            batch = int(x.shape[0])
            y = cupy.full(self.output_shape(batch), cupy.nan, cupy.float32) if self.poison else cupy.empty(self.output_shape(batch), cupy.float32)
            if batch:
                self.function(self.grid(batch), (self.source.launch.block,), self._arguments(cupy, x, inputs, y, batch))
        return [y]

    def _arguments(self, cupy, x, inputs: Sequence[Any], y, batch: int) -> tuple:
        if self.spec is None:
            return (x, y, np.int32(batch))
        w = cupy.ascontiguousarray(inputs[1], dtype=cupy.float32)
        b = cupy.ascontiguousarray(inputs[2], dtype=cupy.float32) if len(inputs) > 2 and inputs[2] is not None else w
        return (x, w, b, y, np.int32(batch))

    def probe(self, inputs: Sequence[Any], seconds: float = HANG_SECONDS) -> None:
        """One launch on these inputs, waited for at most `seconds`: UserKernelHang when it does not finish."""
        probe_launch(self, inputs, self.source.path, self.node_name, seconds)


def probe_launch(kernel: Any, inputs: Sequence[Any], path: str, node_name: str, seconds: float = HANG_SECONDS) -> None:
    """`kernel(inputs, stream)` once on a stream of its own, waited for at most `seconds`:
    UserKernelHang when it does not finish, UserKernelError (naming `path`) when it fails."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        kernel(inputs, stream)
        done = cupy.cuda.Event()
        done.record(stream)
    except cupy.cuda.driver.CUDADriverError as err:
        raise UserKernelError(f"{path}: the kernel failed on {node_name}: {err}") from None
    deadline = time.monotonic() + seconds
    while not done.done:
        if time.monotonic() > deadline:
            raise UserKernelHang(f"{path}: the kernel did not finish within {seconds:g} s on one image of "
                                 f"{node_name} (an endless loop, or a barrier some threads never reach?)")
        time.sleep(0.01)
    try:
        stream.synchronize()
    except Exception as err:  # an illegal address or the like, reported when the launch ends
        raise UserKernelError(f"{path}: the kernel failed on {node_name}: {err}") from None


def _conv_spec(node: NodeInfo):
    from ..ops.conv.spec import ConvSpec

    return ConvSpec.from_node(node)


class UserPlugin(Plugin):
    """Runs `source` for the nodes of its op type; `fallback` (the built-in plugin, if
    any) runs the shapes the source rejects, and every node on the CPU device."""

    def __init__(self, source: KernelSource, fallback: Plugin | None = None, poison: bool = False, probe: bool = True):
        self.source, self.fallback, self.poison, self.probe = source, fallback, poison, probe
        self.op_type = source.op_type
        self.rejections: dict[str, str] = {}  # node name -> the source's reason
        self._compiled: dict[tuple, Compiled] = {}

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        if self.fallback is not None:
            return self.fallback.supports(node, device)
        if any(t.dtype != np.float32 for t in node.inputs if t.name):
            return "only float32 tensors are supported"
        return None if device.is_cuda else f"{self.source.label} needs a GPU, and there is no built-in {self.op_type} plugin"

    def make_spec(self, node: NodeInfo):
        """The built-in plugin's record of the node, which its supports, fuse and build read."""
        return self.fallback.make_spec(node) if self.fallback is not None else None

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        return self.fallback.fuse(node, followers, device) if self.fallback is not None else 0

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        return self.fallback.variant_notes(node, device) if self.fallback is not None else {}

    def epilogue(self, fused: Sequence[NodeInfo]):
        """The fused followers' Epilogue (Conv), or None when there are none."""
        if not fused:
            return None
        from ..ops.conv.plugin import epilogue_of

        return epilogue_of(fused)

    def fuses(self, epilogue) -> bool:
        """Whether the source applies `epilogue` itself (see contract.user_fusable)."""
        return epilogue is not None and self.source.launch.fuses_epilogue and user_fusable(epilogue)

    def defines(self, node: NodeInfo, fused: Sequence[NodeInfo] = ()) -> dict[str, int]:
        """The node's macros: with the fused epilogue's when the source fuses it."""
        epilogue = self.epilogue(fused)
        return self.source.contract.defines(node, epilogue if self.fuses(epilogue) else None)

    def compile(self, node: NodeInfo, fused: Sequence[NodeInfo], on_gpu: bool) -> Compiled:
        """The node's compile (cached): Rejected for a shape the source turns down."""
        defines = self.defines(node, fused)
        weights = self._constant_weights(node)
        digest = weights_digest(weights) if weights is not None and on_gpu else None
        key = (tuple(defines.items()), on_gpu, digest, self.source.text)
        if key not in self._compiled:
            try:
                compiled = compile_node(self.source, defines, on_gpu, digest)
            except Rejected as reason:
                self.rejections[node.name] = str(reason)
                raise
            self.source.check_grid(defines)
            self._compiled[key] = compiled
        return self._compiled[key]

    def _constant_weights(self, node: NodeInfo) -> list[np.ndarray] | None:
        """[W, B?] when the source asks for its weights in __constant__ memory; Rejected when they are not initializers."""
        if not (self.source.launch.constant_weights and self.source.contract.weights):
            return None
        names = [t.name for t in node.inputs[1:] if t.name]
        if not all(n in node.constants for n in names):
            raise Rejected("its weights are computed at run time, and weights=constant needs them at build time")
        return [node.constants[n] for n in names]

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str | None:
        """What runs the node, as `build` names it: the source (and the epilogue it leaves to CuPy);
        the built-in plugin's kernel where the source rejected the node; on the CPU the built-in
        reference, saying that the source runs it on a GPU."""
        built_in = self.fallback.kernel_name(node, device, variant, fused, prologue, graphed) if self.fallback else None
        if not device.is_cuda:
            return f"{built_in or f'{self.op_type} reference'} ({self.source.label} on a GPU)"
        if node.name in self.rejections:
            return built_in
        epilogue = self.epilogue(fused)
        if epilogue is None or self.fuses(epilogue):
            return self.source.label
        from ..ops.conv.plugin import unfused_name

        return unfused_name(self.source.label, epilogue)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        """None: the source compiles through CuPy (not the kernel cache) as the node is built, and a
        shape it rejects falls back to the built-in plugin, whose build then compiles as it goes."""
        return []

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        if not device.is_cuda:
            return self._fallback_build(node, device, variant, fused, prologue, graphed, "no GPU")
        try:
            weights = self._constant_weights(node)
            compiled = self.compile(node, fused, on_gpu=True)
        except Rejected as reason:
            self.rejections[node.name] = str(reason)
            return self._fallback_build(node, device, variant, fused, prologue, graphed, str(reason))
        if weights is not None:
            upload_weights(compiled, weights)
        kernel: Kernel = UserKernel.for_node(self.source, node, compiled, self.defines(node, fused), self.poison)
        if self.probe:
            kernel.probe(probe_inputs(node))
        epilogue = self.epilogue(fused)
        if epilogue is not None and not self.fuses(epilogue):
            from ..ops.conv.plugin import UnfusedEpilogueKernel

            kernel = UnfusedEpilogueKernel(kernel, epilogue)
        return kernel

    def _fallback_build(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo],
                        prologue: Sequence[NodeInfo], graphed: bool, why: str) -> Kernel:
        """The built-in plugin's build of the node, with the arguments this build was given."""
        if self.fallback is None:
            raise PluginError(f"{self.source.label} cannot run {node.name} ({why}) and no built-in {self.op_type} plugin can")
        return self.fallback.build(node, device, variant, fused, prologue, graphed)


def weights_digest(weights: list[np.ndarray]) -> str:
    from ..ops.conv.families.base import constants_digest

    return constants_digest({f"w{i}": w for i, w in enumerate(weights)})


def upload_weights(compiled: Compiled, weights: list[np.ndarray]) -> None:
    """W (and B) into the __constant__ arrays W_CONST, B_CONST the runner declares for `weights=constant`."""
    from ..ops.conv.families.base import upload_constant

    for name, values in zip(("W_CONST", "B_CONST"), weights):
        upload_constant(compiled.module, name, values)


def probe_inputs(node: NodeInfo, images: int = 1) -> list[Any]:
    """`images` images of standard-normal data for the node's inputs, its constants as they are."""
    import cupy

    rng = np.random.default_rng(0)
    arrays = []
    for index, tensor in enumerate(node.inputs):
        if not tensor.name:
            arrays.append(None)
        elif tensor.name in node.constants:
            arrays.append(cupy.asarray(node.constants[tensor.name], dtype=cupy.float32))
        else:
            shape = (images, *tensor.shape[1:]) if index == 0 else tensor.shape
            arrays.append(cupy.asarray(rng.standard_normal(shape, dtype=np.float32)))
    return arrays
