"""ONNX Conv: its semantics as one normalised shape record, and the Conv plugin.

`ConvSpec` resolves every attribute default and `auto_pad` once, so the numpy
reference, the CUDA variants and the cost model all read the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..registry import Device, Kernel, NodeInfo, PluginError
from . import reference
from .epilogue import ACTIVATIONS, NONE, Epilogue


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D (or N-D) convolution with every attribute resolved.

    Spatial tuples run over the spatial axes (H, W for 2-D). `pads` holds the
    begin pads then the end pads, as ONNX writes them.
    """

    batch: int
    in_channels: int
    out_channels: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    group: int
    has_bias: bool

    @property
    def rank(self) -> int:
        return len(self.in_size)

    @property
    def out_size(self) -> tuple[int, ...]:
        r = self.rank
        return tuple(
            (self.in_size[i] + self.pads[i] + self.pads[i + r] - self.dilations[i] * (self.kernel[i] - 1) - 1)
            // self.strides[i]
            + 1
            for i in range(r)
        )

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_channels // self.group, *self.kernel)

    def input_shape(self, batch: int | None = None) -> tuple[int, ...]:
        return (self.batch if batch is None else batch, self.in_channels, *self.in_size)

    def output_shape(self, batch: int | None = None) -> tuple[int, ...]:
        return (self.batch if batch is None else batch, self.out_channels, *self.out_size)

    def flops(self, batch: int | None = None, computed_size: tuple[int, ...] | None = None) -> int:
        """Multiply-adds counted as two FLOPs, plus one add per output for the bias;
        `computed_size` is the part of the output a kernel computes (all of it by default)."""
        n = self.batch if batch is None else batch
        outputs = n * self.out_channels * int(np.prod(computed_size or self.out_size))
        per_output = 2 * (self.in_channels // self.group) * int(np.prod(self.kernel))
        return outputs * per_output + (outputs if self.has_bias else 0)

    def bytes_moved(self, batch: int | None = None) -> int:
        """Fewest bytes a kernel must move: input and weights read once, output written once (FP32)."""
        n = self.batch if batch is None else batch
        elements = (
            int(np.prod(self.input_shape(n)))
            + int(np.prod(self.output_shape(n)))
            + int(np.prod(self.weight_shape))
            + (self.out_channels if self.has_bias else 0)
        )
        return 4 * elements

    @classmethod
    def from_node(cls, node: NodeInfo) -> "ConvSpec":
        x, w = node.inputs[0], node.inputs[1]
        if len(x.shape) < 3 or len(w.shape) != len(x.shape):
            raise PluginError(f"Conv {node.name}: input rank {len(x.shape)} and weight rank {len(w.shape)} do not fit")
        return cls.from_shapes(x.shape, w.shape, node.attributes, has_bias=len(node.inputs) > 2 and bool(node.inputs[2].name))

    @classmethod
    def from_shapes(
        cls, x_shape: Sequence[int], w_shape: Sequence[int], attributes: dict[str, Any], has_bias: bool
    ) -> "ConvSpec":
        rank = len(x_shape) - 2
        kernel = tuple(int(k) for k in attributes.get("kernel_shape", w_shape[2:]))
        strides = tuple(int(s) for s in attributes.get("strides", [1] * rank))
        dilations = tuple(int(d) for d in attributes.get("dilations", [1] * rank))
        group = int(attributes.get("group", 1))
        in_size = tuple(int(s) for s in x_shape[2:])
        auto_pad = attributes.get("auto_pad", "NOTSET")
        if isinstance(auto_pad, bytes):
            auto_pad = auto_pad.decode()
        if auto_pad in ("NOTSET", ""):
            pads = tuple(int(p) for p in attributes.get("pads", [0] * (2 * rank)))
        elif auto_pad == "VALID":
            pads = (0,) * (2 * rank)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = [], []
            for i in range(rank):
                out = -(-in_size[i] // strides[i])
                total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - in_size[i])
                small, large = total // 2, total - total // 2
                begin.append(small if auto_pad == "SAME_UPPER" else large)
                end.append(large if auto_pad == "SAME_UPPER" else small)
            pads = tuple(begin + end)
        else:
            raise PluginError(f"Conv: unknown auto_pad {auto_pad!r}")
        spec = cls(
            batch=int(x_shape[0]),
            in_channels=int(x_shape[1]),
            out_channels=int(w_shape[0]),
            in_size=in_size,
            kernel=kernel,
            strides=strides,
            dilations=dilations,
            pads=pads,
            group=group,
            has_bias=has_bias,
        )
        if spec.in_channels != w_shape[1] * group or spec.out_channels % group:
            raise PluginError(
                f"Conv: {spec.in_channels} input channels, weights {tuple(w_shape)} and group {group} do not fit"
            )
        if any(o < 1 for o in spec.out_size):
            raise PluginError(f"Conv: output size {spec.out_size} is empty for input {in_size} and kernel {kernel}")
        return spec


class ReferenceConvKernel:
    """The numpy reference, run as the Conv kernel of the CPU device (with its epilogue, if fused)."""

    def __init__(self, spec: ConvSpec, epilogue: Epilogue = NONE):
        self.spec = spec
        self.epilogue = epilogue
        self.name = f"conv.reference{epilogue.suffix}"

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        y = reference.conv(x, w, b, self.spec.strides, self.spec.pads, self.spec.dilations, self.spec.group)
        return [self.epilogue.apply(y.astype(np.float32, copy=False))]


class UnfusedEpilogueKernel:
    """A CUDA variant without a fused epilogue, followed by the epilogue as CuPy
    array operations: what a chosen variant that cannot fuse still runs as."""

    def __init__(self, conv_kernel: Kernel, epilogue: Epilogue):
        self.conv = conv_kernel
        self.spec = conv_kernel.spec
        self.epilogue = epilogue
        self.name = f"{conv_kernel.name}, then cupy{epilogue.suffix}"

    def flops(self, batch: int) -> int:
        return self.conv.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.conv.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        from .. import cuda

        [y] = self.conv(inputs, stream)
        with cuda.on_stream(stream):
            return [self.epilogue.apply_cupy(y)]


class ConvPlugin:
    """Runs ONNX Conv nodes: the numpy reference on the CPU device, a CUDA variant on a GPU.

    Without an explicit variant, the choice comes from `choose_variant`: the tuning
    cache when `opplugin tune` has run for this GPU and shape, else a heuristic."""

    op_type = "Conv"

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        if any(t.dtype != np.float32 for t in node.inputs if t.name):
            return "only float32 tensors are supported"
        try:
            ConvSpec.from_node(node)  # attributes and shapes a Conv kernel can take
        except PluginError as err:
            return str(err)
        if not device.is_cuda:
            return None
        notes = self.variant_notes(node, device)
        if all(notes.values()):
            return "; ".join(f"{v}: {r}" for v, r in notes.items())
        return None

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        """Per CUDA variant family, why it is not offered for this node (None = offered)."""
        if not device.is_cuda:
            return {}
        from . import conv_cuda

        spec = ConvSpec.from_node(node)
        return {v: conv_cuda.unsupported_reason(spec, v, constant_weights(node)) for v in conv_cuda.FAMILIES}

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """How many of `followers` (the nodes after this Conv, each the only reader
        of the one before) this plugin runs in the Conv's own kernel."""
        for count in range(min(2, len(followers)), 0, -1):
            epilogue = epilogue_of(followers[:count])
            if epilogue is None:
                continue
            if not device.is_cuda:
                return count
            from . import conv_cuda

            spec = ConvSpec.from_node(node)
            if conv_cuda.usable_families(spec, constant_weights(node), epilogue):
                return count
        return 0

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = ()) -> Kernel:
        spec = ConvSpec.from_node(node)
        epilogue = epilogue_of(fused) if fused else NONE
        if epilogue is None:
            raise PluginError(f"Conv {node.name} cannot fuse {[n.op_type for n in fused]}")
        if not device.is_cuda:
            if variant not in (None, "reference"):
                from .conv_cuda import family_of

                family_of(variant)  # an unknown name says so before the missing device does
                raise PluginError(f"variant {variant!r} needs a CUDA device; the CPU device runs the numpy reference")
            return ReferenceConvKernel(spec, epilogue)
        from . import conv_cuda
        from .choice import choose_variant

        weights = constant_weights(node)
        if variant is None:
            variant = choose_variant(spec, weights, epilogue, device)
        family = conv_cuda.family_of(variant)  # an unknown name raises a PluginError listing the choices
        if epilogue != NONE and not family.fuses:
            reason = conv_cuda.unsupported_reason(spec, variant, weights)
            if reason:
                raise PluginError(f"variant {variant!r} cannot run Conv {node.name}: {reason}")
            return _tagged(UnfusedEpilogueKernel(conv_cuda.build_kernel(spec, variant, weights), epilogue), variant)
        reason = conv_cuda.unsupported_reason(spec, variant, weights, epilogue)
        if reason:
            raise PluginError(f"variant {variant!r} cannot run Conv {node.name}{epilogue.suffix}: {reason}")
        return _tagged(conv_cuda.build_kernel(spec, variant, weights, epilogue), variant)


def _tagged(kernel: Kernel, variant: str) -> Kernel:
    """The kernel, carrying the variant name it was built from: the runner's exact path
    (for NaN and Inf) builds the same variant again without the fused epilogue."""
    kernel.variant = variant
    return kernel


def epilogue_of(followers: Sequence[NodeInfo]) -> Epilogue | None:
    """The Epilogue that `followers` (activation, then max pool; either may be
    absent) compute, or None when a Conv kernel cannot run them."""
    ops = [n.op_type for n in followers]
    activation = ops[0] if ops and ops[0] in ACTIVATIONS else None
    rest = list(followers[1:] if activation else followers)
    if not rest:
        return Epilogue(activation) if activation else None
    if len(rest) != 1 or rest[0].op_type != "MaxPool":
        return None
    pool = _fusable_pool(rest[0])
    return Epilogue(activation, pool) if pool else None


def _fusable_pool(node: NodeInfo) -> tuple[int, int] | None:
    """(kh, kw) for a 2-D MaxPool whose stride is its window, without pads,
    dilation, ceil mode or an Indices output; else None."""
    a = node.attributes
    kernel = tuple(int(k) for k in a.get("kernel_shape", ()))
    if len(kernel) != 2 or len([o for o in node.node.output if o]) != 1:
        return None
    auto_pad = a.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    plain = (
        tuple(int(s) for s in a.get("strides", (1, 1))) == kernel
        and not any(int(p) for p in a.get("pads", ()))
        and auto_pad in ("NOTSET", "VALID", "")
        and all(int(d) == 1 for d in a.get("dilations", ()))
        and int(a.get("ceil_mode", 0)) == 0
    )
    return kernel if plain else None


def constant_weights(node: NodeInfo) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(W, B) when the weights (and bias, if any) are initializers, else None."""
    w = node.constants.get(node.inputs[1].name)
    if w is None:
        return None
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2].name)
    b = node.constants.get(node.inputs[2].name) if has_bias else None
    if has_bias and b is None:
        return None
    return w, b
