"""The Conv plugin: the numpy reference on the CPU device, a CUDA family on a GPU,
with the residual Add, activation and max pool that follow a Conv fused into its kernel."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ...core.number_formats import FP32, round_to
from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import ChannelLast, Kernel, NodeInfo, Plugin, PrecisionChoice
from ..reference_variants import REFERENCE, REFERENCE_VARIANTS, reference_variant
from ..specs import spec_of
from .. import activation
from . import reference
from .epilogue import NONE, RESIDUAL_INPUT, Epilogue, kernel_name
from .prologue import PROLOGUE_INPUT, from_nodes
from .spec import ConvSpec


class ReferenceConvKernel(Kernel):
    """The numpy reference, run as the Conv kernel of the CPU device (with its epilogue, if fused). With a
    `precision` ("fp16", "bf16"), the step a GPU would run in it: X (after the prologue) and W rounded to
    the format, as the half-precision families (PRECISION_FAMILIES) read them, then the sums, bias and epilogue in
    FP32, as theirs are."""

    def __init__(self, spec: ConvSpec, epilogue: Epilogue = NONE, precision: str | None = None):
        self.spec = spec
        self.epilogue = epilogue
        self.precision = None if precision == FP32 else precision
        self.name = kernel_name(reference_variant(self.precision), epilogue)
        # an emulation names itself, so that the exact path's rerun of a chunk emulates the same precision
        self.variant = None if self.precision is None else reference_variant(self.precision)
        self.nonfinite_exact = epilogue.pool is None  # see ConvKernel.nonfinite_exact

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        x, w = prologue_applied(inputs, self.epilogue), inputs[1]
        if self.precision is not None:
            x, w = round_to(x, self.precision), round_to(w, self.precision)
        b = inputs[2] if len(inputs) > 2 else None
        y = reference.conv(x, w, b, self.spec.strides, self.spec.pads, self.spec.dilations, self.spec.group)
        return [self.epilogue.apply(y.astype(np.float32, copy=False), residual_operand(inputs, self.epilogue))]


def unfused_name(conv_name: str, epilogue: Epilogue, kernel_epilogue: Epilogue = NONE) -> str:
    """The name of a kernel of `kernel_epilogue` run with the rest of `epilogue` in CuPy: a prologue
    it does not apply before it, an output part it does not fuse after it."""
    before = epilogue.prologue if kernel_epilogue.prologue is None else None
    name = f"cupy {before.prefix.rstrip('*')}, then {conv_name}" if before else conv_name
    unfused_after = epilogue.without_prologue() != kernel_epilogue.without_prologue()
    return f"{name}, then cupy{epilogue.suffix}" if unfused_after else name


class UnfusedEpilogueKernel(Kernel):
    """A CUDA variant without a fused epilogue, followed by the epilogue as CuPy
    array operations: what a chosen variant that cannot fuse still runs as. A
    prologue the variant does not apply goes before it the same way."""

    def __init__(self, conv_kernel: Kernel, epilogue: Epilogue, kernel_epilogue: Epilogue = NONE):
        """`kernel_epilogue`: the part of `epilogue` that `conv_kernel` applies itself."""
        self.conv = conv_kernel
        self.spec = conv_kernel.spec
        self.epilogue = epilogue
        self.prologue_before = epilogue.prologue if kernel_epilogue.prologue is None else None
        self.name = unfused_name(conv_kernel.name, epilogue, kernel_epilogue)
        # see ConvKernel.nonfinite_exact; the conv's own kernel may not promise it either (3xTF32)
        self.nonfinite_exact = epilogue.pool is None and conv_kernel.nonfinite_exact
        self.variant, self.device_work = conv_kernel.variant, conv_kernel.device_work
        # not those of the conv's kernel: its CuPy operations allocate the step's output, launch
        # kernels of CuPy's own and flag nothing
        self.out_view, self.replayable, self.flags_nonfinite = "", False, False

    def flops(self, batch: int) -> int:
        return self.conv.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.conv.bytes_moved(batch)

    def workspace_bytes(self, batch: int) -> int:
        return self.conv.workspace_bytes(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        from ...gpu import cuda

        import cupy

        with cuda.on_stream(stream):
            x = prologue_applied(inputs, Epilogue(prologue=self.prologue_before), cupy)
            conv_inputs = [x, *inputs[1:RESIDUAL_INPUT]]
            if not self.prologue_before and self.epilogue.prologue:  # the conv applies the prologue: give it its operand
                conv_inputs += [None] * (PROLOGUE_INPUT - RESIDUAL_INPUT) + list(inputs[PROLOGUE_INPUT:PROLOGUE_INPUT + 1])
        [y] = self.conv(conv_inputs, stream)
        with cuda.on_stream(stream):
            return [self.epilogue.without_prologue().apply_cupy(y, residual_operand(inputs, self.epilogue))]


# the families --precision runs a Conv in, tried in this order: for narrow groups (2 to 16 channels, 2 to 8 maps a group),
# which the GEMM declines or runs on tiles of a few maps, the grouped kernel (grouped_half.py); the implicit GEMM
# (wgmma.py); then for a depthwise Conv, which the GEMM declines (one map a group), the depthwise kernel
# (depthwise_half.py); under tf32 a Conv stays FP32-exact (3xTF32 on Hopper)
PRECISION_FAMILIES = {"fp16": ("gw_fp16", "wg_fp16", "dw_fp16"), "bf16": ("gw_bf16", "wg_bf16", "dw_bf16")}
# what a Conv's configurations can be benched and tuned in: fp32 (every exact family), and each precision above
CONV_PRECISIONS = (FP32, *PRECISION_FAMILIES)


class ConvPlugin(Plugin):
    """Runs ONNX Conv nodes: the numpy reference on the CPU device, a CUDA variant on a GPU.

    Without an explicit variant, the choice comes from `choose_config`: the tuning
    cache when `opplugin tune` has run for this GPU and shape, else a heuristic."""

    op_type = "Conv"

    def make_spec(self, node: NodeInfo) -> ConvSpec:
        return conv_spec_from(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        try:
            conv_spec(node)
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
        from . import families

        spec, weights = conv_spec(node), constant_weights(node)
        return {name: families.unsupported_reason(spec, family, weights) for name, family in families.FAMILIES.items()}

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        """A variant whose kernel keeps FP32's NaN and Inf, for the exact path's rerun of a
        chunk in which a kernel that does not (3xTF32) met them; none on the CPU device, whose
        reference keeps them."""
        if not device.is_cuda:
            return None
        from .choice import nonfinite_exact_config

        return nonfinite_exact_config(conv_spec(node), constant_weights(node)).name()

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """The precision's family that runs the step (precision_fit: gw_fp16 for narrow groups, wg_fp16, dw_fp16 for a
        depthwise Conv), with the part of its epilogue that family fuses (else the reason none can): on a GPU, the configuration `tune
        --precision` cached for it, else the family's own pick; on the CPU device, the reference emulating the
        precision wherever one of those families could run the step on its GPU (Hopper)."""
        if precision not in PRECISION_FAMILIES:
            return PrecisionChoice(None, f"no {precision} kernel picked for Conv; --variant Conv=tc_tf32 runs TF32 on mma.sync"
                                   if precision == "tf32" else f"no {precision} kernel for Conv")
        spec, weights = conv_spec(node), constant_weights(node)
        name, _, kernel_epilogue, reason = precision_fit(spec, weights, self._epilogue(node, fused, prologue), precision)
        if reason is not None:
            return PrecisionChoice(None, reason)
        if not device.is_cuda:
            return PrecisionChoice(reference_variant(precision))
        from .choice import cached_config

        tuned = cached_config(spec, weights, kernel_epilogue, device, precision)
        return PrecisionChoice(tuned.name() if tuned is not None and tuned.family == name else name)

    def channel_last(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = ()) -> ChannelLast | None:
        """Where `variant`'s kernel runs the whole step, the tensors its family can keep channel-last in its format
        (Family.channel_last_links: wg_fp16 and wg_bf16 where no prologue applies and a group's maps are whole
        16-byte runs, dw_fp16, dw_bf16, gw_fp16 and gw_bf16 always)."""
        from .families.channel_last import OUTPUT

        linkable = self._linkable(node, device, variant, fused, prologue)
        if linkable is None:
            return None
        family, _, links = linkable
        return ChannelLast(family.precision, _linked_inputs(links), bool(links & OUTPUT))

    def linked_variant(self, node: NodeInfo, device: Device, variant: str | None, inputs: frozenset[int], output: bool,
                       format: str, fused: Sequence[NodeInfo] = (), prologue: Sequence[NodeInfo] = ()) -> str:
        from .families.channel_last import INPUT, OUTPUT, RESIDUAL

        linkable = self._linkable(node, device, variant, fused, prologue)
        if linkable is None or not inputs <= _linked_inputs(linkable[2]):
            raise PluginError(f"Conv {node.name}: {variant} cannot keep inputs {sorted(inputs)} channel-last")
        family = linkable[0]
        if format != family.precision:
            raise PluginError(f"Conv {node.name}: {variant} keeps its tensors in {family.precision}, not {format}")
        links = (INPUT if 0 in inputs else 0) | (RESIDUAL if RESIDUAL_INPUT in inputs else 0) | (OUTPUT if output else 0)
        return replace(linkable[1], links=links).name()

    def _linkable(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo],
                  prologue: Sequence[NodeInfo]) -> tuple[Any, Any, int] | None:
        """(family, the Config `variant` stands for, the links it can make: INPUT | OUTPUT | RESIDUAL bits) where
        `variant`'s family can keep a tensor of this step channel-last in its format and its kernel runs the whole
        step; None elsewhere."""
        if not device.is_cuda or variant is None or variant in REFERENCE_VARIANTS:
            return None
        from . import families

        try:
            family, _ = families.parse(variant)
        except PluginError:
            return None
        spec, epilogue = conv_spec(node), self._epilogue(node, fused, prologue)
        links = family.channel_last_links(spec, epilogue)
        if not links:
            return None
        config, kernel_epilogue, reason = fitted(spec, variant, constant_weights(node), epilogue)
        return (family, config, links) if reason is None and kernel_epilogue == epilogue else None

    def variant_precision(self, node: NodeInfo, device: Device, variant: str | None) -> str:
        """fp32 but for the families that round their operands (Family.precision) and the reference's emulations
        of them; a name no family reads runs nothing (its build says why): fp32."""
        if variant is None or variant in REFERENCE_VARIANTS:
            return REFERENCE_VARIANTS.get(variant) or FP32
        from .families import parse

        try:
            family, _ = parse(variant)
        except PluginError:
            return "fp32"
        return family.precision

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """How many of `followers` (the nodes after this Conv, each the only reader
        of the one before) this plugin runs in the Conv's own kernel."""
        for count in range(len(followers), 0, -1):
            epilogue = epilogue_of(followers[:count])
            if epilogue is None:
                continue
            if not device.is_cuda:
                return count
            from . import families

            if families.usable_families(conv_spec(node), constant_weights(node), epilogue):
                return count
        return 0

    # where a fused prologue's operand comes in the step's inputs (prologue.py)
    prologue_input = PROLOGUE_INPUT

    def fuse_prologue(self, node: NodeInfo, chain: Sequence[NodeInfo], data: str, device: Device) -> bool:
        """Whether this plugin runs `chain` (pointwise nodes in graph order from the tensor `data`, the last
        one writing the Conv's X) inside the Conv's kernel: when the nodes make a Prologue and, on a GPU,
        the family the Conv would get without them applies it."""
        prologue = from_nodes(chain, data)
        if prologue is None:
            return False
        if not device.is_cuda:
            return True
        from . import families
        from .choice import choose_config

        spec, weights = conv_spec(node), constant_weights(node)
        plain = choose_config(spec, weights, NONE, device)
        return families.family_of(plain).takes_prologue and families.checked(spec, plain, weights, Epilogue(prologue=prologue))[1] is None

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        choice = self._choose(node, device, variant, fused, prologue, graphed)
        if choice.config is None:
            return kernel_name(choice.reference, choice.epilogue)
        if choice.kernel_epilogue == choice.epilogue:
            return kernel_name(choice.config.name(), choice.kernel_epilogue)
        return unfused_name(kernel_name(choice.config.name(), choice.kernel_epilogue), choice.epilogue, choice.kernel_epilogue)

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        choice = self._choose(node, device, variant, fused, prologue, graphed)
        if choice.config is None:
            return []
        from . import families

        return families.compile_jobs(choice.spec, choice.config, choice.weights, choice.kernel_epilogue, device.arch)

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        choice = self._choose(node, device, variant, fused, prologue, graphed)
        if choice.config is None:
            return ReferenceConvKernel(choice.spec, choice.epilogue, REFERENCE_VARIANTS[choice.reference])
        from . import families

        kernel = families.build_checked(choice.spec, choice.config, choice.weights, choice.kernel_epilogue)
        if choice.kernel_epilogue == choice.epilogue:
            return kernel
        return UnfusedEpilogueKernel(kernel, choice.epilogue, choice.kernel_epilogue)

    def _choose(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo],
                prologue: Sequence[NodeInfo], graphed: bool) -> "_Choice":
        """What `build` makes for the node, decided without compiling anything (see registry.Plugin
        for the arguments)."""
        spec = conv_spec(node)
        epilogue = self._epilogue(node, fused, prologue)
        if not device.is_cuda:
            if variant is not None and variant not in REFERENCE_VARIANTS:
                from .families import parse

                parse(variant)  # an unknown name says so before the missing device does
                raise PluginError(f"variant {variant!r} needs a CUDA device; the CPU device runs the numpy reference "
                                  f"({', '.join(REFERENCE_VARIANTS)})")
            return _Choice(spec, epilogue, reference=variant or REFERENCE)
        if variant in REFERENCE_VARIANTS:
            raise PluginError(f"variant {variant!r} is the CPU device's numpy reference; a GPU runs a CUDA family")
        from . import families
        from .choice import choose_config

        weights = constant_weights(node)
        if variant:
            family, config = families.parse(variant)  # an unknown name raises a PluginError listing the choices
            wanted = family if config is None else config
        else:
            wanted = choose_config(spec, weights, epilogue, device, graphed)
        config, kernel_epilogue, reason = fitted(spec, wanted, weights, epilogue)
        if reason is not None:
            raise PluginError(f"variant '{variant or wanted}' cannot run Conv {node.name}: {reason}")
        return _Choice(spec, epilogue, config, kernel_epilogue, weights)


    def _epilogue(self, node: NodeInfo, fused: Sequence[NodeInfo], prologue: Sequence[NodeInfo]) -> Epilogue:
        """What the step does around the Conv: `fused`'s epilogue, `prologue`'s prologue."""
        epilogue = epilogue_of(fused) if fused else NONE
        if epilogue is None:
            raise PluginError(f"Conv {node.name} cannot fuse {[n.op_type for n in fused]}")
        if prologue:
            taken = from_nodes(prologue, prologue[0].data_input())
            if taken is None:
                raise PluginError(f"Conv {node.name} cannot apply {[n.op_type for n in prologue]} to its input")
            epilogue = replace(epilogue, prologue=taken)
        return epilogue


def _linked_inputs(links: int) -> frozenset[int]:
    """The step's input positions that `links` (families/channel_last.py's bits) take channel-last: X, the residual."""
    from .families.channel_last import INPUT, RESIDUAL

    return frozenset(position for bit, position in ((INPUT, 0), (RESIDUAL, RESIDUAL_INPUT)) if links & bit)


def fitted(spec: ConvSpec, wanted: Any, weights: Any, epilogue: Epilogue) -> tuple[Any, Epilogue, str | None]:
    """(the Config `wanted` (a family or a Config) stands for, the part of `epilogue` it fuses, None) where it runs
    the Conv, else the reason it cannot with the smallest part. A family that fuses only part of the epilogue
    (tc_3xtf32: no max pool) runs the rest after the kernel, and one that applies no prologue runs that before it."""
    from . import families

    for kernel_epilogue in dict.fromkeys((epilogue, epilogue.prologue_only(), NONE)):
        config, reason = families.checked(spec, wanted, weights, kernel_epilogue)
        if reason is None:
            return config, kernel_epilogue, None
    return config, kernel_epilogue, reason


def precision_fit(spec: ConvSpec, weights: Any, epilogue: Epilogue, precision: str) -> tuple[str, Any, Epilogue, str | None]:
    """(the family of PRECISION_FAMILIES[precision] that runs this Conv, its Config, the part of `epilogue` it fuses,
    None): the first that can. Where none can, the reason is that of the family made for this kind of Conv: the
    depthwise kernel's for a depthwise one (a Conv of one channel a group, groups > 1), the grouped kernel's for one
    of narrow groups (grouped_half.narrow_groups), else the GEMM's."""
    from . import families
    from .families.grouped_half import narrow_groups

    found = []
    for name in PRECISION_FAMILIES[precision]:
        config, kernel_epilogue, reason = fitted(spec, families.FAMILIES[name], weights, epilogue)
        if reason is None:
            return name, config, kernel_epilogue, None
        found.append((name, config, kernel_epilogue, reason))
    grouped, gemm, depthwise = found
    if spec.group > 1 and spec.in_channels == spec.group:
        return depthwise
    return grouped if narrow_groups(spec) else gemm


@dataclass(frozen=True)
class _Choice:
    """A Conv step's kernel, decided: the Config (None: the CPU's numpy reference) and the part of
    the epilogue it fuses (the rest follows as CuPy array operations)."""

    spec: ConvSpec
    epilogue: Epilogue
    config: Any = None
    kernel_epilogue: Epilogue = NONE
    weights: Any = None
    reference: str = REFERENCE  # the CPU device's variant (reference_variants.py), where config is None


def conv_spec_from(node: NodeInfo) -> ConvSpec:
    """The node's ConvSpec (attributes and shapes a Conv kernel can take); a PluginError when it has none."""
    if any(t.dtype != np.float32 for t in node.inputs if t.name):
        raise PluginError("only float32 tensors are supported")
    return ConvSpec.from_node(node)


def conv_spec(node: NodeInfo) -> ConvSpec:
    """The node's ConvSpec: the plan's record of it, or (for a NodeInfo made by hand) made now."""
    return spec_of(node, conv_spec_from)


def prologue_applied(inputs: Sequence[Any], epilogue: Epilogue, xp: Any = np) -> Any:
    """The Conv's X: the step's first input with the epilogue's prologue applied (as it is without one)."""
    x = inputs[0]
    if epilogue.prologue is None:
        return x
    scale = None
    if epilogue.prologue.takes_operand:
        if len(inputs) <= PROLOGUE_INPUT or inputs[PROLOGUE_INPUT] is None:
            raise PluginError(f"the prologue {epilogue.prologue.prefix} needs its scale operand, input {PROLOGUE_INPUT} of the step")
        scale = inputs[PROLOGUE_INPUT]
    return epilogue.prologue.apply(x, scale, xp)


def residual_operand(inputs: Sequence[Any], epilogue: Epilogue) -> Any:
    """The tensor a fused residual Add reads, from a step's inputs (None without one)."""
    if not epilogue.residual:
        return None
    if len(inputs) <= RESIDUAL_INPUT or inputs[RESIDUAL_INPUT] is None:
        raise PluginError(f"the fused epilogue {epilogue.suffix} needs its residual operand, input {RESIDUAL_INPUT} of the step")
    return inputs[RESIDUAL_INPUT]


def epilogue_of(followers: Sequence[NodeInfo]) -> Epilogue | None:
    """The Epilogue that `followers` compute (a residual Add or two-input Sum, an
    activation of the shared table or x * Sigmoid(x), a max pool; any may be absent,
    the order may not change), or None when a Conv kernel cannot run them."""
    rest = list(followers)
    residual = bool(rest) and _residual_add(rest[0])
    if residual:
        rest = rest[1:]
    act = None
    if len(rest) >= 2 and activation.silu_pair(rest[0], rest[1]):
        act, rest = activation.Activation(activation.SILU), rest[2:]
    elif rest and (act := activation.from_node(rest[0])) is not None:
        rest = rest[1:]
    pool = None
    if rest:
        pool = _fusable_pool(rest[0]) if len(rest) == 1 and rest[0].op_type == "MaxPool" else None
        if pool is None:
            return None
    return Epilogue(act, pool, residual) if residual or act or pool else None


def _residual_add(node: NodeInfo) -> bool:
    """An Add (or a Sum of two) of two float32 tensors of one shape, neither a constant:
    the conv output and a tensor read in the epilogue, with no broadcasting."""
    names = [n for n in node.node.input if n]
    if node.op_type not in ("Add", "Sum") or len(names) != 2 or len(node.node.input) != 2 or node.node.domain not in ("", "ai.onnx"):
        return False
    shapes = {tuple(t.shape) for t in node.inputs} | {tuple(t.shape) for t in node.outputs}
    same = len(shapes) == 1 and all(d > 0 for d in next(iter(shapes)))
    return same and all(t.dtype == np.float32 for t in node.inputs) and not any(n in node.constants for n in names)


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
