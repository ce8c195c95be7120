"""The pointwise plugin: one per op type of group.NODE_OPS, all of the group kind "pointwise", so
that the plan gives each connected group of their nodes to one kernel (registry.NodeGroup). The
CPU device runs the group's numpy reference; a CUDA device the kernel codegen.py writes for it."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import GroupPlugin, Kernel, NodeGroup, NodeInfo
from . import codegen
from .group import PointwiseGroup

GROUP_KIND = "pointwise"
MAX_VALUES = 24  # a group's values: bounds the generated source and its registers
BLOCK = 256
BLOCKS_PER_SM = 16  # the grid-stride loop's grid: enough blocks to fill the device, no more


def kernel_name(group: PointwiseGroup, on_device: bool) -> str:
    return f"pointwise.{'cuda' if on_device else 'reference'}.{group.suffix}"


def compile_job(group: PointwiseGroup, arch: str) -> CompileJob:
    """What CudaPointwiseKernel compiles for the group on a GPU of `arch`: its generated source."""
    name = kernel_name(group, on_device=True)
    return cuda.source_job(codegen.source(group, name)[0], cuda.BASE_OPTIONS, name, arch)


class ReferencePointwiseKernel(Kernel):
    """The group's numpy reference, run as the kernel of the CPU device: float64 arithmetic, each output in its type."""

    nonfinite_exact = True  # IEEE arithmetic and NaN-keeping ops: NaN and Inf as onnxruntime has them
    # numpy reads any view; the generated kernel reads an input whose rows lie apart (a channel slice of
    # a Concat's buffer) in place, with its row stride as an argument, and copies other views first
    in_views = True

    def __init__(self, group: PointwiseGroup):
        self.group = group
        self.name = kernel_name(group, on_device=False)

    def flops(self, batch: int) -> int:
        return self.group.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.group.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        results = self.group.evaluate(inputs)
        return [np.asarray(r, t.dtype) for r, (_, t) in zip(results, self.group.outputs)]


class CudaPointwiseKernel(ReferencePointwiseKernel):
    """The group's generated kernel; call it with the step's inputs (CuPy arrays; those of constants
    the kernel holds may be anything), `out` to give the outputs' arrays (one array for a group of one output)."""

    # it writes an output whose rows lie apart (a channel slice of a Concat's buffer) in place, with its row
    # stride as an argument, and any other view through a contiguous array of its own (registry.Kernel)
    out_view = "strided"
    replayable = True  # see registry.Kernel

    def __init__(self, group: PointwiseGroup):
        import cupy

        super().__init__(group)
        self.name = kernel_name(group, on_device=True)
        self.source, self.width = codegen.source(group, self.name)
        self.functions = {v: self._module().get_function(codegen.FUNCTIONS[v]) for v in sorted({1, self.width})}
        self.constants = [cupy.asarray(c if c.dtype == np.bool_ else c.astype(np.float32)) for c in group.constants]
        self._batch_argument = group.batch_argument()
        self._row_strided, self._rows_apart_outputs = codegen.row_strided_positions(group)

    def _module(self):
        return cuda.load(compile_job(self.group, cuda.device_arch()))

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Sequence[Any] | None = None) -> list[Any]:
        import cupy

        group = self.group
        if len(inputs) != len(group.arguments):
            raise PluginError(f"{self.name}: {len(inputs)} inputs given, {len(group.arguments)} expected")
        rows = (int(inputs[self._batch_argument].shape[0]) if self._batch_argument is not None
                else (group.shape[0] if group.shape else 1))
        with cuda.on_stream(stream):
            arrays = [self._checked(x, t, rows) for x, t in zip(inputs, group.arguments) if t is not None]
            shapes = [(group.shape_at(t.shape, rows), t.dtype) for _, t in group.outputs]
            if out is None:
                outputs = [cupy.empty(shape, dtype) for shape, dtype in shapes]
            else:
                outputs = [out] if isinstance(out, cupy.ndarray) else list(out)
                if len(outputs) != len(shapes) or any(not isinstance(y, cupy.ndarray) or (tuple(y.shape), y.dtype) != s
                                                      for y, s in zip(outputs, shapes)):
                    raise PluginError(f"{self.name}: out must be CuPy arrays of {[(list(s), str(d)) for s, d in shapes]}")
            # what the kernel writes: each output itself where it can, else a contiguous array copied over after
            targets = [y if rows_of_contiguous_runs(y) else cupy.empty(y.shape, y.dtype) for y in outputs]
            elements = group.elements(rows)
            if elements >= codegen.INDEX_LIMIT and codegen.index_bits(group) == 32:
                raise PluginError(f"{self.name}: built with 32-bit indices for {group.shape[0]} rows, called with {rows}")
            if elements:
                operands = [*arrays, *targets, *self.constants]
                row_strides = ([arrays[k].strides[0] // arrays[k].itemsize for k in self._row_strided]
                               + [targets[k].strides[0] // targets[k].itemsize for k in self._rows_apart_outputs])
                aligned = all(a.data.ptr % 16 == 0 for a in operands) and all(r % 4 == 0 for r in row_strides)
                width = self.width if aligned else 1
                vectors = elements // width
                grid = max(1, min(-(-vectors // BLOCK), BLOCKS_PER_SM * cuda.multiprocessor_count()))
                self.functions[width]((grid,), (BLOCK,), (*operands, np.int64(rows), *map(np.int64, row_strides)))
            for y, target in zip(outputs, targets):
                if target is not y:
                    y[...] = target
        return outputs

    def _checked(self, x: Any, tensor, rows: int) -> Any:
        import cupy

        shape = self.group.shape_at(tensor.shape, rows)
        if not isinstance(x, cupy.ndarray) or x.dtype != tensor.dtype or tuple(x.shape) != shape:
            got = f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}"
            raise PluginError(f"{self.name}: {tensor.name} must be a {tensor.dtype} CuPy array of shape {shape}, not {got}")
        return x if rows_of_contiguous_runs(x) else cupy.ascontiguousarray(x)


class PointwisePlugin(GroupPlugin):
    """Runs one pointwise op type alone, or a group of pointwise nodes the plan gives it."""

    op_type = ""
    group_kind = GROUP_KIND

    def make_spec(self, node: NodeInfo) -> PointwiseGroup:
        """The node as a group of its own (its every input an argument): what `supports` judges it by."""
        return PointwiseGroup.of([node], list(node.node.input), [o for o in node.node.output if o][:1])

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        if node.spec is not None:  # the plan made its record
            return None
        try:
            self.make_spec(node)
        except PluginError as err:
            return str(err)
        return None

    def admits(self, group: NodeGroup, device: Device) -> str | None:
        if len(group.nodes) > MAX_VALUES:
            return f"a group has at most {MAX_VALUES} nodes"
        try:
            _group_of(group)
        except PluginError as err:
            return str(err)
        return None

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        """The name from the nodes alone (a group's name says its ops, not its inputs and outputs)."""
        nodes = [node, *fused]
        written = {o for n in nodes for o in n.node.output if o}
        arguments = list(dict.fromkeys(i for n in nodes for i in n.node.input if i and i not in written))
        return kernel_name(PointwiseGroup.of(nodes, arguments, [o for o in nodes[-1].node.output if o]), device.is_cuda)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        return _jobs(self._alone(node, fused), device, variant)

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        return _kernel(self._alone(node, fused), device, variant)

    def group_compile_jobs(self, group: NodeGroup, device: Device, variant: str | None = None,
                           graphed: bool = True) -> list[CompileJob]:
        return _jobs(_group_of(group), device, variant)

    def build_group(self, group: NodeGroup, device: Device, variant: str | None = None, graphed: bool = True) -> Kernel:
        return _kernel(_group_of(group), device, variant)

    def _alone(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> PointwiseGroup:
        """The node alone (its every input an argument, constants among them ignored); a group comes through build_group."""
        if fused:
            raise PluginError(f"{node.op_type} {node.name}: the pointwise plugin fuses through groups (build_group), not followers")
        return self.make_spec(node)


def _group_of(group: NodeGroup) -> PointwiseGroup:
    return PointwiseGroup.of(list(group.nodes), list(group.inputs), list(group.outputs))


def _checked_variant(variant: str | None) -> None:
    if variant not in (None, "reference", "cuda"):
        raise PluginError(f"the pointwise plugin has no variant {variant!r}; its kernel is 'cuda' (on the CPU device: 'reference')")


def _jobs(group: PointwiseGroup, device: Device, variant: str | None) -> list[CompileJob]:
    """What _kernel compiles: the group's generated kernel, on a GPU."""
    _checked_variant(variant)
    return [compile_job(group, device.arch)] if device.is_cuda else []


def _kernel(group: PointwiseGroup, device: Device, variant: str | None) -> Kernel:
    _checked_variant(variant)
    return CudaPointwiseKernel(group) if device.is_cuda else ReferencePointwiseKernel(group)


def rows_of_contiguous_runs(x: Any) -> bool:
    """Whether every axis of x but the first is laid out as in a C-contiguous array (only the rows may
    lie further apart, as in a channel slice of a larger NCHW buffer): the kernel reads it in place."""
    expected = x.itemsize
    for extent, stride in zip(reversed(x.shape[1:]), reversed(x.strides[1:])):
        if extent > 1 and stride != expected:
            return False
        expected *= extent
    return x.ndim == 0 or x.shape[0] <= 1 or x.strides[0] >= expected
