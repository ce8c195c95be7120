"""The layout plugins: Concat, Transpose, Slice, Split, Gather (constant indices: a strided copy
where they step evenly, else a copy of the blocks a table names), Pad and Resize. Each makes its node's record once (spec.py), runs the numpy reference
on the CPU device (reference.py) and a CUDA kernel specialised to the node's shapes on a
GPU (kernels.py). Every kernel can write into a strided view of a larger buffer (`out=`),
so the runtime may hand a producer its slice of a Concat's output instead of copying it
there (runtime/buffers.py). A Concat between half-precision steps copies channel-last
16-bit tensors instead (channel_last.py, linked_concat.py)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import ChannelLast, Kernel, NodeInfo, Plugin, PrecisionChoice
from ..channel_last import check_offered, plain_offer
from ..specs import reason_against, spec_of
from ..view import ViewKernel
from . import reference, views
from .channel_last import PLAIN, linked, linked_config, links_reason, offered
from .kernels import ConcatKernel, GatherKernel, LayoutKernel, PadKernel, ResizeKernel, TableGatherKernel, TransposeTileKernel
from .linked_concat import LinkedConcatKernel
from .spec import ConcatSpec, GatherSpec, PadSpec, ResizeSpec, SliceSpec, SplitSpec, TransposeSpec
from .strides import contiguous_strides


def _bytes_per_image(node: NodeInfo) -> int:
    """Bytes read and written per image at the node's shapes (its first axis taken as the batch): the
    data inputs (every input of a Concat, the first of the others) and the outputs."""
    data = node.inputs if node.op_type == "Concat" else node.inputs[:1]
    tensors = [t for t in [*data, *node.outputs] if t.name]
    total = sum(4 * int(np.prod(t.shape, dtype=np.int64)) for t in tensors)
    rows = node.inputs[0].shape[0] if node.inputs[0].shape else 1
    return total // max(1, rows)


def _rank(node: NodeInfo) -> int:
    return len(node.inputs[0].shape)


class ReferenceLayoutKernel(LayoutKernel):
    """The numpy reference as the CPU device's kernel; with `out=`, it writes the result there."""

    in_views = True  # numpy reads any view (registry.Kernel)
    replayable = False  # numpy work: nothing to record

    def __init__(self, name: str, bytes_per_image: int, compute: Callable[[Sequence[np.ndarray]], list[np.ndarray]],
                 flops_per_image: int = 0):
        super().__init__(name, bytes_per_image)
        self._compute, self._flops = compute, flops_per_image

    def flops(self, batch: int) -> int:
        return batch * self._flops

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        results = self._compute([np.asarray(x) for x in inputs])
        if out is None:
            return results
        if len(results) != 1 or tuple(out.shape) != results[0].shape:
            raise PluginError(f"{self.name}: out has shape {tuple(out.shape)}, the result {[r.shape for r in results]}")
        out[...] = results[0]
        return [out]


class ReferenceConcatKernel(ReferenceLayoutKernel):
    """numpy's concatenate, with Concat's in-place protocol (`input_slices`, `copying`)."""

    def __init__(self, name: str, bytes_per_image: int, spec: ConcatSpec, skip: frozenset[int] = frozenset()):
        super().__init__(name, bytes_per_image, lambda xs: [reference.concat(spec, xs)])
        self.spec, self.skip = spec, skip
        self.input_slices = (spec.axis, tuple(zip(spec.starts, (s + w for s, w in zip(spec.starts, spec.widths)))))

    def copying(self, positions: frozenset[int]) -> "ReferenceConcatKernel | None":
        positions = frozenset(positions) | self.skip
        if len(positions) == len(self.spec.widths):
            return None
        return ReferenceConcatKernel(f"{self.name}(copies {len(self.spec.widths) - len(positions)} of {len(self.spec.widths)})",
                                     self._bytes_per_image, self.spec, positions)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        if not self.skip:
            return super().__call__(inputs, stream, out=out)
        if out is None:
            raise PluginError(f"{self.name}: copies only some inputs, so it needs the output buffer (out=)")
        axis = self.spec.axis
        for k, (start, stop) in enumerate(self.input_slices[1]):
            if k not in self.skip:
                out[(slice(None),) * axis + (slice(start, stop),)] = inputs[k]
        return [out]


class LayoutPlugin(Plugin):
    """What the layout plugins share: a spec made once (`make_spec`), its reason when it cannot."""

    op_type = ""
    suffix = ""  # the kernel name's last part
    empty_tensors = True  # an empty slice, pad or concat part is an index plan like any other

    def op_spec(self, node: NodeInfo) -> Any:
        """The op's own spec of a node whose shapes are known."""
        raise NotImplementedError

    def make_spec(self, node: NodeInfo) -> Any:
        if not node.inputs or not node.inputs[0].shape:
            raise PluginError("its input's shape is unknown")
        if any(-1 in t.shape for t in [*node.inputs, *node.outputs] if t.name):
            raise PluginError("a shape is unknown at plan time")
        return self.op_spec(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return reason_against(node, self.make_spec)

    def view_of(self, node: NodeInfo, output: str) -> Callable[[Any], Any] | None:
        if self.supports(node, None) is not None:
            return None
        return views.view_of(self.op_type, spec_of(node, self.make_spec), [o.name for o in node.outputs].index(output))

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        return f"{self.op_type.lower()}.{'cuda' if device.is_cuda else 'reference'}.{self.suffix_of(spec_of(node, self.make_spec))}"

    def suffix_of(self, spec: Any) -> str:
        return self.suffix or "copy"

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        """None: a build compiles nothing. A layout kernel compiles at its first call, for the strides
        of the arrays it is given then (its own output, or a slice of a Concat's buffer: kernels.py)."""
        return []

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        if fused:
            raise PluginError(f"{self.op_type} fuses nothing")
        if variant not in (None, "reference", "cuda"):
            raise PluginError(f"{self.op_type} has no variant {variant!r}; its kernel is 'cuda' (on the CPU device: 'reference')")
        spec = spec_of(node, self.make_spec)
        name = self.kernel_name(node, device)
        if not device.is_cuda:
            return self.reference_kernel(node, spec, name)
        return self.cuda_kernel(node, spec, name)

    def reference_kernel(self, node: NodeInfo, spec: Any, name: str) -> Kernel:
        raise NotImplementedError

    def cuda_kernel(self, node: NodeInfo, spec: Any, name: str) -> Kernel:
        raise NotImplementedError


class ConcatPlugin(LayoutPlugin):
    """Concat: a copy into slices of its output (kernels.ConcatKernel), which the runtime may let producers write in
    place (runtime/buffers.py); between half-precision steps, a copy of channel-last tensors (channel_last.py)."""

    op_type = "Concat"

    def channel_last(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = ()) -> ChannelLast | None:
        """Every input and the output, all or none, in any 16-bit format with the plain kernel, in its own with a
        linked variant (whose links the plan makes again); along the channels of NCHW tensors only."""
        spec = spec_of(node, self.make_spec)
        if fused or prologue:
            return None
        config = None if variant in (None, PLAIN) else linked_config(spec, _rank(node), device, variant)
        return plain_offer(offered(spec, _rank(node), device), variant, config)

    def linked_variant(self, node: NodeInfo, device: Device, variant: str | None, inputs: frozenset[int], output: bool,
                       format: str, fused: Sequence[NodeInfo] = (), prologue: Sequence[NodeInfo] = ()) -> str:
        check_offered(self.channel_last(node, device, variant, fused, prologue), output, format, f"Concat {node.name}", variant)
        return linked(spec_of(node, self.make_spec), format, inputs, output).name()

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """None: a Concat has no kernel of its own in a precision. It copies exactly in any 16-bit format, and the plan
        runs it in one where it links it with its producers and readers (plan/channel_last.py), FP32 elsewhere."""
        why = links_reason(spec_of(node, self.make_spec), _rank(node))
        return PrecisionChoice(None, why or f"a Concat runs in {precision} only linked channel-last with its producers and readers")

    def kernel_name(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        """concat.cuda.axis1x4, or linked: concat.cuda_fp16_h3.axis1x4."""
        spec = spec_of(node, self.make_spec)
        config = linked_config(spec, _rank(node), device, variant)
        if config is None:
            return super().kernel_name(node, device, variant, fused, prologue, graphed)
        return f"concat.{config.name()}.{self.suffix_of(spec)}"

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = spec_of(node, self.make_spec)
        config = linked_config(spec, _rank(node), device, variant)
        if config is None:
            return super().build(node, device, variant, fused, prologue, graphed)
        if fused:
            raise PluginError("Concat fuses nothing")
        return LinkedConcatKernel(self.kernel_name(node, device, variant), _bytes_per_image(node), spec,
                                  tuple(node.inputs[0].shape[2:]), config.name())

    def reads_views(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> bool:
        """The Concat kernels read strided inputs (in place where each is rows of contiguous runs, else
        through a contiguous copy): a roll's or a patch merge's Slices need no steps of their own."""
        return True

    def op_spec(self, node: NodeInfo) -> ConcatSpec:
        return ConcatSpec.from_node(node)

    def suffix_of(self, spec: ConcatSpec) -> str:
        return f"axis{spec.axis}x{len(spec.widths)}"

    def reference_kernel(self, node, spec, name):
        return ReferenceConcatKernel(name, _bytes_per_image(node), spec)

    def cuda_kernel(self, node, spec, name):
        return ConcatKernel(name, _bytes_per_image(node), spec)


def transpose_pieces(spec: TransposeSpec) -> Callable[[tuple[int, ...]], list]:
    def pieces(shape: tuple[int, ...]) -> list:
        strides = contiguous_strides(shape)
        return [(spec.output_shape(shape), 0, tuple(strides[p] for p in spec.perm))]

    return pieces


def moves_innermost(spec: TransposeSpec, shape: tuple[int, ...]) -> bool:
    """Whether the input's innermost axis moves (with more than one element on both tiled axes):
    then a tiled kernel keeps reads and writes coalesced."""
    rank = len(spec.perm)
    return spec.perm[-1] != rank - 1 and shape[-1] > 1 and shape[spec.perm[-1]] > 1


def keeps_memory_order(spec: TransposeSpec, shape: tuple[int, ...]) -> bool:
    """Whether the axes with more than one element keep their order (only axes of extent 1 move):
    then the transpose is a reshape, a view."""
    moved = [axis for axis in spec.perm if shape[axis] != 1]
    return moved == sorted(moved)


class TransposePlugin(LayoutPlugin):
    op_type = "Transpose"

    def op_spec(self, node: NodeInfo) -> TransposeSpec:
        return TransposeSpec.from_node(node)

    def suffix_of(self, spec: TransposeSpec) -> str:
        return "perm" + "".join(map(str, spec.perm))

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = spec_of(node, self.make_spec)
        if keeps_memory_order(spec, node.inputs[0].shape) and not fused and variant in (None, "reference", "cuda"):
            return ViewKernel(self.kernel_name(node, device), spec.output_shape)
        return super().build(node, device, variant, fused)

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: [reference.transpose(spec, xs[0])])

    def cuda_kernel(self, node, spec, name):
        if moves_innermost(spec, node.inputs[0].shape):
            return TransposeTileKernel(name, _bytes_per_image(node), spec.perm)
        return GatherKernel(name, _bytes_per_image(node), transpose_pieces(spec), views=False)

    def kernel_name(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        """transpose.cuda.tiled.perm0231 (through shared memory) or transpose.cuda.perm0213 (a strided copy)."""
        spec = spec_of(node, self.make_spec)
        if keeps_memory_order(spec, node.inputs[0].shape):
            return "view.transpose"
        tiled = "tiled." if device.is_cuda and moves_innermost(spec, node.inputs[0].shape) else ""
        return f"transpose.{'cuda' if device.is_cuda else 'reference'}.{tiled}{self.suffix_of(spec)}"


def slice_pieces(index_of: Callable[[tuple[int, ...]], list[tuple[slice, ...]]]) -> Callable[[tuple[int, ...]], list]:
    """(shape, offset, strides) of each numpy index of a C-contiguous input, in elements."""

    def pieces(shape: tuple[int, ...]) -> list:
        strides = contiguous_strides(shape)
        result = []
        for index in index_of(shape):
            index = tuple(index) + (slice(None),) * (len(shape) - len(index))  # the axes after the last one named
            bounds = [s.indices(d) for s, d in zip(index, shape)]
            out_shape = tuple(len(range(*b)) for b in bounds)
            base = sum(b[0] * s for b, s, n in zip(bounds, strides, out_shape) if n)
            result.append((out_shape, int(base), tuple(b[2] * s for b, s in zip(bounds, strides))))
        return result

    return pieces


class SlicePlugin(LayoutPlugin):
    op_type = "Slice"

    def op_spec(self, node: NodeInfo) -> SliceSpec:
        return SliceSpec.from_node(node)

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: [reference.slice_(spec, xs[0])])

    def cuda_kernel(self, node, spec, name):
        return GatherKernel(name, _bytes_per_image(node), slice_pieces(lambda shape: [spec.slices(shape)]))


class SplitPlugin(LayoutPlugin):
    op_type = "Split"

    def op_spec(self, node: NodeInfo) -> SplitSpec:
        return SplitSpec.from_node(node)

    def suffix_of(self, spec: SplitSpec) -> str:
        return f"axis{spec.axis}x{len(spec.sizes)}"

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: reference.split(spec, xs[0]))

    def cuda_kernel(self, node, spec, name):
        return GatherKernel(name, _bytes_per_image(node), slice_pieces(spec.slices))


def gather_pieces(spec: GatherSpec) -> Callable[[tuple[int, ...]], list]:
    """The one (shape, offset, strides) of a Gather of a C-contiguous input: the index axes step
    `step` positions of the gathered axis each, the inner ones first."""

    def pieces(shape: tuple[int, ...]) -> list:
        strides = contiguous_strides(shape)
        index_strides = contiguous_strides(spec.index_shape) if spec.index_shape else ()
        along = tuple(spec.step * strides[spec.axis] * s for s in index_strides)
        out_strides = (*strides[: spec.axis], *along, *strides[spec.axis + 1:])
        return [(spec.output_shape(shape), spec.first * strides[spec.axis], out_strides)]

    return pieces


class GatherPlugin(LayoutPlugin):
    op_type = "Gather"

    def op_spec(self, node: NodeInfo) -> GatherSpec:
        return GatherSpec.from_node(node)

    def suffix_of(self, spec: GatherSpec) -> str:
        return f"axis{spec.axis}" + (".table" if spec.table is not None else "")

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: [reference.gather(spec, xs[0])])

    def cuda_kernel(self, node, spec, name):
        if spec.table is not None:
            return TableGatherKernel(name, _bytes_per_image(node), spec.axis, spec.table, spec.index_shape)
        return GatherKernel(name, _bytes_per_image(node), gather_pieces(spec))


class PadPlugin(LayoutPlugin):
    op_type = "Pad"

    def op_spec(self, node: NodeInfo) -> PadSpec:
        return PadSpec.from_node(node)

    def suffix_of(self, spec: PadSpec) -> str:
        return spec.mode

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: [reference.pad(spec, xs[0])])

    def cuda_kernel(self, node, spec, name):
        return PadKernel(name, _bytes_per_image(node), spec)


class ResizePlugin(LayoutPlugin):
    op_type = "Resize"

    def op_spec(self, node: NodeInfo) -> ResizeSpec:
        if len(node.inputs[0].shape) < 2:
            raise PluginError("the kernel resizes tensors of rank 2 or more")
        return ResizeSpec.from_node(node)

    def suffix_of(self, spec: ResizeSpec) -> str:
        return f"{spec.mode}.{spec.coordinates}" + (f".{spec.nearest}" if spec.mode == "nearest" else "")

    def _flops_per_image(self, node: NodeInfo, spec: ResizeSpec) -> int:
        rows = max(1, node.outputs[0].shape[0])
        return 0 if spec.mode == "nearest" else 6 * int(np.prod(node.outputs[0].shape, dtype=np.int64)) // rows

    def reference_kernel(self, node, spec, name):
        return ReferenceLayoutKernel(name, _bytes_per_image(node), lambda xs: [reference.resize(spec, xs[0])],
                                     self._flops_per_image(node, spec))

    def cuda_kernel(self, node, spec, name):
        return ResizeKernel(name, _bytes_per_image(node), spec, self._flops_per_image(node, spec))
