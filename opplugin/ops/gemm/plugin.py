"""The Gemm and MatMul plugins: the numpy reference on the CPU device, a CUDA family on a GPU,
with the activation and row Softmax that follow fused into the kernel where they can be."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ...gpu.device import Device
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...core.number_formats import FP32
from ...registry import Kernel, NodeInfo, Plugin, PrecisionChoice, TensorInfo
from .. import config_grammar
from ..specs import reason_against, spec_of
from .. import activation
from . import families
from .epilogue import NONE, GemmEpilogue
from ..reference_variants import REFERENCE, REFERENCE_VARIANTS, is_reference, reference_variant
from .kernel import GemmKernel, ReferenceGemmKernel, compile_job, kernel_name
from . import attention, row_prologue
from .row_prologue import RowPrologue
from .matmul import BATCHED, BATCHED_3XTF32, BatchedMatMulKernel, FlatMatMulKernel, MatMulSpec, ReferenceMatMulKernel, batched_job, extent_per_image
from .spec import BIAS_COLUMN, BIAS_FULL, GemmSpec


class GemmPlugin(Plugin):
    """Runs ONNX Gemm nodes (float32, any transA/transB/alpha/beta, C broadcast as ONNX allows).

    Without an explicit variant the heuristic of `families.heuristic_config` picks one."""

    op_type = "Gemm"

    def make_spec(self, node: NodeInfo) -> GemmSpec:
        """The node's GemmSpec; a PluginError when it has none."""
        if any(t.dtype != np.float32 for t in node.inputs if t.name):
            raise PluginError("only float32 tensors are supported")
        return GemmSpec.from_node(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        try:
            spec = spec_of(node, self.make_spec)
        except PluginError as err:
            return str(err)
        if spec.bias == BIAS_FULL and spec.beta != 0.0 and _constant(node, 2) is not None:
            return "a constant C with one row per batch row does not follow the batch through chunked runs"
        return None

    def gemm_spec(self, node: NodeInfo) -> GemmSpec:
        """The GemmSpec the families run for this node."""
        return spec_of(node, self.make_spec)

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        if not device.is_cuda:
            return {}
        spec = self.gemm_spec(node)
        return {name: families.unsupported_reason(spec, default(spec)) for name, default in families.DEFAULTS.items()}

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        """FP32 FMAs (the tiled family) for the exact path's rerun of a chunk in which the tensor cores'
        3xTF32 met NaN or Inf; none on the CPU device, whose reference keeps them."""
        return families.tiled_default(self.gemm_spec(node)).name() if device.is_cuda else None

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """An activation, then a Softmax over the rows; or a Softmax alone. On a GPU the Softmax
        fuses only where a family can run it (N <= 32); the activation always can."""
        spec = self.gemm_spec(node)
        for count in range(min(2, len(followers)), 0, -1):
            epilogue = epilogue_of(followers[:count])
            if epilogue is None:
                continue
            if not device.is_cuda or families.unsupported_reason(spec, families.heuristic_config(spec, epilogue), epilogue) is None:
                return count
        return 0

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """The configuration the heuristic's shape rule gives the precision's family (families.PRECISION_FAMILIES:
        tc_tf32, wg_fp16, wg_bf16) where that family runs the step's shape and epilogue (else its reason); on the
        CPU device, the reference emulating the precision wherever that family could run the step on its GPU."""
        family = families.PRECISION_FAMILIES.get(precision)
        if family is None:
            return PrecisionChoice(None, f"no {precision} kernel for {node.op_type}")
        spec, epilogue = self._spec_and_epilogue(node, fused)
        config = families.DEFAULTS[family](spec)
        reason = families.unsupported_reason(spec, config, epilogue, this_gpu=device.is_cuda)
        if reason is not None:
            return PrecisionChoice(None, reason)
        return PrecisionChoice(config.name() if device.is_cuda else reference_variant(precision))

    def variant_precision(self, node: NodeInfo, device: Device, variant: str | None) -> str:
        """fp32 but for the reduced-precision families (tc_tf32, wg_fp16, wg_bf16) and the reference's emulations of them;
        a name no Gemm family reads runs nothing (its build says why): fp32."""
        if is_reference(variant):
            return REFERENCE_VARIANTS.get(variant) or FP32
        try:
            family, _ = config_grammar.parse(variant, families.CONFIGS, "Gemm")
        except PluginError:
            return FP32
        return families.FAMILY_PRECISIONS.get(family, FP32)

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        spec, epilogue, config = self._choose(node, device, variant, fused)
        return kernel_name(node.op_type.lower(), (variant or REFERENCE) if config is None else config.name(), epilogue,
                           self._prologue(node, prologue))

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        spec, epilogue, config = self._choose(node, device, variant, fused)
        if config is None:
            return []
        before = self._prologue(node, prologue)
        return [compile_job(spec, config, epilogue, device.arch)] + ([before.compile_job(device.arch)] if before is not None else [])

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec, epilogue, config = self._choose(node, device, variant, fused)
        bias = self._parts(node, fused)[2]
        op, before = node.op_type.lower(), self._prologue(node, prologue)
        if config is None:
            return ReferenceGemmKernel(spec, epilogue, op, bias, before, REFERENCE_VARIANTS[variant or REFERENCE])
        return GemmKernel(spec, config, epilogue, _constant(node, 1), _constant(node, 2) if bias is None else bias, op, before)

    def _prologue(self, node: NodeInfo, prologue: Sequence[NodeInfo]) -> RowPrologue | None:
        """What `prologue` (as fuse_prologue agreed) does to A's rows (row_prologue.py); None for none."""
        if not prologue:
            return None
        made = row_prologue.from_nodes(prologue, self.gemm_spec(node).k)
        if made is None:
            raise PluginError(f"{node.op_type} {node.name} cannot apply {[n.op_type for n in prologue]} to its input")
        return made

    def _parts(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> tuple[GemmSpec, Sequence[NodeInfo], np.ndarray | None]:
        """(the GemmSpec the families run, the followers its epilogue computes, a constant bias a fused
        node brings): a Gemm's C is its own input, so no follower brings one here."""
        return self.gemm_spec(node), fused, None

    def _residual(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> bool:
        """Whether the last of `fused` is an Add of a residual the epilogue adds (MatMul's)."""
        return False

    def _spec_and_epilogue(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> tuple[GemmSpec, GemmEpilogue]:
        """(the GemmSpec the families run, the epilogue its kernel applies) for the node with `fused`."""
        residual = self._residual(node, fused)
        spec, rest, _ = self._parts(node, fused)
        epilogue = epilogue_of(rest) if rest else NONE
        if epilogue is None:
            raise PluginError(f"{node.op_type} {node.name} cannot fuse {[n.op_type for n in fused]}")
        return spec, dataclasses.replace(epilogue, residual=True) if residual else epilogue

    def _choose(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo]):
        """(spec, epilogue, Config) of what `build` makes, decided without compiling; the Config is
        None on the CPU device (the numpy reference, `variant` saying which: kernel.REFERENCE_VARIANTS)."""
        spec, epilogue = self._spec_and_epilogue(node, fused)
        if not device.is_cuda:
            if not is_reference(variant):
                families.configure(spec, variant)  # an unknown name says so before the missing device does
                raise PluginError(f"variant {variant!r} needs a CUDA device; the CPU device runs the numpy reference "
                                  f"({', '.join(REFERENCE_VARIANTS)})")
            return spec, epilogue, None
        config = families.configure(spec, variant) if variant else families.heuristic_config(spec, epilogue)
        reason = families.unsupported_reason(spec, config, epilogue)
        if reason:
            raise PluginError(f"variant '{config}' cannot run {node.op_type} {node.name}{epilogue.suffix}: {reason}")
        return spec, epilogue, config


class MatMulPlugin(GemmPlugin):
    """ONNX MatMul of any rank (see matmul.py): with a constant 2-D B, a Gemm on A's rows (every
    family, heuristic and epilogue of Gemm); otherwise a batched product with the leading axes
    broadcast, an activation fused."""

    op_type = "MatMul"
    # an attention's chain: scale, bias, a mask added between Reshapes to (N, windows, ..) and back
    # (Swin's shifted windows), Softmax, the product with V, the heads merged
    max_followers = 8
    # a flat product's prologue (row_prologue.py) takes its LayerNorm's scale and bias and its row table as constants, so
    # it brings the step no operand: nothing is ever read from here
    prologue_input = 2

    def make_spec(self, node: NodeInfo) -> MatMulSpec:
        if any(t.dtype != np.float32 for t in node.inputs[:2]):
            raise PluginError("only float32 tensors are supported")
        return MatMulSpec.from_node(node)

    def supports(self, node: NodeInfo, device: Device) -> str | None:
        return reason_against(node, self.make_spec)

    def gemm_spec(self, node: NodeInfo) -> GemmSpec:
        spec = spec_of(node, self.make_spec)
        if not spec.is_flat:
            raise PluginError(f"MatMul {node.name} is a batched product, not a Gemm")
        return spec.gemm

    def variant_notes(self, node: NodeInfo, device: Device) -> dict[str, str | None]:
        return super().variant_notes(node, device) if spec_of(node, self.make_spec).is_flat else {}

    def nonfinite_exact_variant(self, node: NodeInfo, device: Device) -> str | None:
        if spec_of(node, self.make_spec).is_flat:
            return super().nonfinite_exact_variant(node, device)
        return BATCHED if device.is_cuda else None

    def fuse(self, node: NodeInfo, followers: Sequence[NodeInfo], device: Device) -> int:
        """Flat: a bias Add (a constant along the last axis), then what a Gemm fuses, then the Add of a residual
        where the family the heuristic picks adds one (wg_3xtf32: a transformer's x + Linear(..) at 17 rows or
        more on Hopper); batched: the rest of an attention (attention.py: scale, bias, Softmax, the product with
        V), or an activation."""
        if spec_of(node, self.make_spec).is_flat:
            bias = _bias_add(node, followers)
            count = super().fuse(node, followers, device) if bias is None else 1 + super().fuse(node, followers[1:], device)
            if count < len(followers) and _residual_add(node, followers, count) and self._adds_residual(node, followers[:count + 1], device):
                count += 1
            return count
        for count in range(len(followers), 1, -1):
            if attention_of(node, followers[:count]) is not None:
                return count
        return 1 if followers and activation.from_node(followers[0]) else 0

    def fuse_prologue(self, node: NodeInfo, chain: Sequence[NodeInfo], data: str, device: Device) -> bool:
        """Before a flat product (row_prologue.py): a row gather, always (its pass over A replaces the Gather's
        step); a LayerNorm over the last axis, on a GPU where the heuristic picks wg_3xtf32, whose pass over A
        for its small parts then normalises A's rows as well."""
        spec = spec_of(node, self.make_spec)
        made = row_prologue.from_nodes(chain, spec.k) if spec.is_flat else None
        if made is None:
            return False
        return made.norm is None or not device.is_cuda or isinstance(families.heuristic_config(spec.gemm, NONE), families.WgmmaConfig)

    def precision_variant(self, node: NodeInfo, device: Device, precision: str, fused: Sequence[NodeInfo] = (),
                          prologue: Sequence[NodeInfo] = ()) -> PrecisionChoice:
        """A flat product's, as Gemm's. A fused attention runs in plain TF32 under any reduced precision: it has no
        FP16 or BF16 kernel, and TF32 rounds as finely as FP16 with FP32's range. A batched product has FP32
        kernels alone (3xTF32)."""
        if spec_of(node, self.make_spec).is_flat:
            return super().precision_variant(node, device, precision, fused, prologue)
        if len(fused) > 1 and attention_of(node, fused) is not None:
            variant = attention.variant_for(attention.TF32, device.is_cuda)
            return PrecisionChoice(variant, None if precision == attention.TF32 else
                                   f"no {precision} kernel for a fused attention; plain TF32 instead")
        return PrecisionChoice(None, f"no {precision} kernel for a batched product")

    def variant_precision(self, node: NodeInfo, device: Device, variant: str | None) -> str:
        """A flat product's, as Gemm's; a batched product's FP32 but for a fused attention's plain-TF32 variants
        (attention.VARIANT_PRECISIONS), which a batched product alone does not run (its build says why)."""
        if spec_of(node, self.make_spec).is_flat:
            return super().variant_precision(node, device, variant)
        return attention.VARIANT_PRECISIONS.get(variant, FP32)

    def reads_views(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> bool:
        """A fused attention's kernel reads Q, K^T and V as they lie: slices of one QKV projection, K transposed."""
        return not spec_of(node, self.make_spec).is_flat and len(fused) > 1 and attention_of(node, fused) is not None

    def _residual(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> bool:
        return bool(fused) and spec_of(node, self.make_spec).is_flat and _residual_add(node, fused, len(fused) - 1)

    def _adds_residual(self, node: NodeInfo, fused: Sequence[NodeInfo], device: Device) -> bool:
        """Whether the kernel for `fused` (ending in a residual Add) can add it: the reference can; on a GPU,
        the family the heuristic picks for that epilogue must."""
        if not device.is_cuda:
            return True
        spec, rest, _ = self._parts(node, fused)
        epilogue = epilogue_of(rest) if rest else NONE
        if epilogue is None:
            return False
        epilogue = dataclasses.replace(epilogue, residual=True)
        return families.unsupported_reason(spec, families.heuristic_config(spec, epilogue), epilogue) is None

    def _parts(self, node: NodeInfo, fused: Sequence[NodeInfo]) -> tuple[GemmSpec, Sequence[NodeInfo], np.ndarray | None]:
        spec = self.gemm_spec(node)
        if self._residual(node, fused):  # the residual's Add is the epilogue's last step, not a follower it computes
            fused = fused[:-1]
        bias = _bias_add(node, fused)
        if bias is None:
            return spec, fused, None
        return dataclasses.replace(spec, bias=BIAS_COLUMN, bias_shape=(spec.n,)), fused[1:], bias

    def kernel_name(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                    prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> str:
        if spec_of(node, self.make_spec).is_flat:
            return super().kernel_name(node, device, variant, fused, prologue)
        if self._attention(node, device, variant, fused) is not None:
            return attention.kernel_name(self.variant_precision(node, device, variant), device.is_cuda)
        return kernel_name("matmul", self._batched_variant(node, device, variant), self._batched_epilogue(node, fused))

    def compile_jobs(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
                     prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> list[CompileJob]:
        spec = spec_of(node, self.make_spec)
        if spec.is_flat:
            return super().compile_jobs(node, device, variant, fused, prologue)
        fused_attention = self._attention(node, device, variant, fused)
        if fused_attention is not None:
            precision = self.variant_precision(node, device, variant)
            return [attention.compile_job(fused_attention, device.arch, precision=precision)] if device.is_cuda else []
        epilogue, chosen = self._batched_epilogue(node, fused), self._batched_variant(node, device, variant)
        return [batched_job(spec, epilogue.activation, device.arch, chosen)] if device.is_cuda else []

    def build(self, node: NodeInfo, device: Device, variant: str | None = None, fused: Sequence[NodeInfo] = (),
              prologue: Sequence[NodeInfo] = (), graphed: bool = True) -> Kernel:
        spec = spec_of(node, self.make_spec)
        if spec.is_flat:
            return FlatMatMulKernel(spec, super().build(node, device, variant, fused, prologue), residual=self._residual(node, fused),
                                    prologue=self._prologue(node, prologue))
        fused_attention = self._attention(node, device, variant, fused)
        if fused_attention is not None:
            name, precision = self.kernel_name(node, device, variant, fused), self.variant_precision(node, device, variant)
            constants = attention_constants(node, fused, fused_attention)
            if not device.is_cuda:
                return attention.ReferenceAttentionKernel(fused_attention, name, constants, precision)
            return attention.AttentionKernel(fused_attention, name, constants, precision)
        epilogue, chosen = self._batched_epilogue(node, fused), self._batched_variant(node, device, variant)
        name = self.kernel_name(node, device, variant, fused)
        if not device.is_cuda:
            return ReferenceMatMulKernel(spec, epilogue.activation, name)
        return BatchedMatMulKernel(spec, epilogue.activation, name, _constant(node, 0), _constant(node, 1), chosen)

    def _attention(self, node: NodeInfo, device: Device, variant: str | None, fused: Sequence[NodeInfo]) -> "attention.AttentionSpec | None":
        """The attention `fused` completes (None: they are an activation, or nothing); the variant asked for
        checked: a fused attention runs in 3xTF32 (the default) or plain TF32 (attention.VARIANT_PRECISIONS)."""
        spec = attention_of(node, fused) if len(fused) > 1 else None
        if spec is not None and variant is not None and variant not in attention.VARIANT_PRECISIONS:
            raise PluginError(f"MatMul {node.name} starts a fused attention, whose kernels are the tensor cores' in 3xTF32 or plain "
                              f"TF32 ({', '.join(map(repr, attention.VARIANT_PRECISIONS))}); '{variant}' runs the product alone")
        return spec

    @staticmethod
    def _batched_variant(node: NodeInfo, device: Device, variant: str | None) -> str:
        """The kernel a batched product's build makes for the variant asked for: on a GPU the tensor cores
        unless `batched` (FP32 FMAs) is asked for; on the CPU device the reference."""
        offered = (BATCHED_3XTF32, BATCHED) if device.is_cuda else ("reference",)
        if variant is None:
            return offered[0]
        if variant not in offered:
            raise PluginError(f"MatMul {node.name} is a batched product; its kernels are {', '.join(map(repr, offered))}"
                              f"{'' if device.is_cuda else ' on the CPU device'}")
        return variant

    @staticmethod
    def _batched_epilogue(node: NodeInfo, fused: Sequence[NodeInfo]) -> GemmEpilogue:
        epilogue = epilogue_of(fused) if fused else NONE
        if epilogue is None or epilogue.softmax:
            raise PluginError(f"a batched MatMul {node.name} fuses an activation only, not {[n.op_type for n in fused]}")
        return epilogue


def epilogue_of(followers: Sequence[NodeInfo]) -> GemmEpilogue | None:
    """The GemmEpilogue that `followers` (an activation of ops/activation.py's table, then a row
    Softmax; either may be absent) compute, or None when a Gemm kernel cannot run them."""
    rest = list(followers)
    act = activation.from_node(rest[0]) if rest else None
    if act:
        rest = rest[1:]
    if not rest:
        return GemmEpilogue(act) if act else None
    if len(rest) != 1 or not _row_softmax(rest[0]):
        return None
    return GemmEpilogue(act, softmax=True)


def attention_of(node: NodeInfo, followers: Sequence[NodeInfo]) -> attention.AttentionSpec | None:
    """The attention a batched MatMul(Q, K^T) and `followers` compute, every follower used: [Mul or Div by
    one constant], [Add], a Softmax over the keys, a MatMul whose first operand is its output, [a Transpose
    that keeps the batch axis first]."""
    rest, scale, bias = list(followers), 1.0, None
    if rest and rest[0].op_type in ("Mul", "Div"):
        factor = _scalar_constant(rest[0])
        if factor is None or factor == 0.0:
            return None
        scale = factor if rest[0].op_type == "Mul" else 1.0 / factor
        rest = rest[1:]
    if rest and rest[0].op_type == "Add":
        scores = rest[0].node.input[0] if rest[0].node.input[0] in _outputs(followers, node, rest[0]) else rest[0].node.input[1]
        other = next((t for t in rest[0].inputs if t.name != scores), None)
        if other is None:
            return None
        bias = other
        rest = rest[1:]
    windows, mask = 1, None
    if len(rest) > 3 and [n.op_type for n in rest[:3]] == ["Reshape", "Add", "Reshape"]:  # Swin's shifted windows
        windows, mask = _window_mask(*rest[:3])
        if windows == 1:
            return None
        rest = rest[3:]
    out_perm = None
    if len(rest) == 3 and rest[2].op_type == "Transpose":  # the heads merged: written through a transposed view
        rank = len(rest[2].inputs[0].shape)
        out_perm = tuple(int(p) for p in rest[2].attributes.get("perm", range(rank - 1, -1, -1)))
        rest = rest[:2]
    if len(rest) != 2 or not _row_softmax(rest[0]) or rest[1].op_type != "MatMul" or rest[1].node.input[0] != rest[0].node.output[0]:
        return None
    product, v = rest[1], rest[1].inputs[1]
    if any(t.dtype != np.float32 for t in (*node.inputs[:2], v, *([bias] if bias is not None else []))):
        return None
    constants = frozenset(name for name, tensor, owner in (("q", node.inputs[0], node), ("kt", node.inputs[1], node), ("v", v, product),
                                                            ("bias", bias, followers[0]))
                          if tensor is not None and tensor.name in {**owner.constants, **_all_constants(followers)})
    if windows > 1:
        return _windowed(node, v, scale, bias, mask, constants, out_perm, windows)
    spec = attention.AttentionSpec(tuple(map(int, node.inputs[0].shape)), tuple(map(int, node.inputs[1].shape)), tuple(map(int, v.shape)),
                                   scale, None if bias is None else tuple(map(int, bias.shape)), constants, out_perm,
                                   per_image=extent_per_image(int(node.outputs[0].shape[0]), node.batch))
    return spec if spec.reason_against() is None else None


def _window_mask(split: NodeInfo, add: NodeInfo, merge: NodeInfo) -> tuple[int, TensorInfo | None]:
    """(windows, the mask) where Reshape `split` takes the scores (N windows, H, T, T) to (N, windows, H, T, T),
    `add` adds a constant mask there whose first axis is 1 (the same for every image), and Reshape `merge`
    takes them back; else (1, None)."""
    scores, split_shape = tuple(map(int, split.inputs[0].shape)), tuple(map(int, split.outputs[0].shape))
    if len(split_shape) != len(scores) + 1 or split_shape[2:] != scores[1:] or split_shape[0] * split_shape[1] != scores[0]:
        return 1, None
    if tuple(map(int, merge.outputs[0].shape)) != scores or merge.node.input[0] != add.node.output[0] or split.node.output[0] not in add.node.input:
        return 1, None
    mask = next((t for t in add.inputs if t.name != split.node.output[0]), None)
    if mask is None or mask.name not in add.constants or len(mask.shape) > len(split_shape) or mask.dtype != np.float32:
        return 1, None
    padded = (1,) * (len(split_shape) - len(mask.shape)) + tuple(map(int, mask.shape))
    return (split_shape[1], mask) if padded[0] == 1 else (1, None)


def _windowed(node: NodeInfo, v: TensorInfo, scale: float, bias: TensorInfo | None, mask: TensorInfo, constants: frozenset[str],
              out_perm: tuple[int, ...] | None, windows: int) -> attention.AttentionSpec | None:
    """The spec of a shifted-window attention, its shapes split into (N, windows, ..) (attention.py), the bias
    (with the mask added in) a constant of its own. None where the bias is computed at run time, or the
    Transpose after it moves the first axis."""
    if (bias is not None and "bias" not in constants) or any(name in constants for name in ("q", "kt", "v")):
        return None
    if out_perm is not None and out_perm[0] != 0:
        return None

    def split(shape) -> tuple[int, ...]:
        shape = tuple(map(int, shape))
        return (shape[0] // windows, windows, *shape[1:])

    lead = len(node.inputs[0].shape) - 2
    bias_shape = (1, 1, *tuple(map(int, bias.shape))[-lead - 1:]) if bias is not None else ()
    combined = tuple(np.broadcast_shapes(bias_shape, tuple(map(int, mask.shape))))
    spec = attention.AttentionSpec(split(node.inputs[0].shape), split(node.inputs[1].shape), split(v.shape), scale, combined,
                                   frozenset({"bias"}), None if out_perm is None else (0, 1, *(p + 1 for p in out_perm[1:])), windows,
                                   extent_per_image(int(node.outputs[0].shape[0]) // windows, node.batch))
    return spec if spec.reason_against() is None else None


def attention_constants(node: NodeInfo, fused: Sequence[NodeInfo], spec: attention.AttentionSpec) -> dict[str, np.ndarray]:
    """The operands of a fused attention that are initializers, as arrays (the build keeps them); for shifted
    windows, the bias is the Adds' two constants summed, in the spec's (N, windows, ..) axes."""
    values = {**node.constants, **_all_constants(fused)}
    product = next(f for f in reversed(fused) if f.op_type == "MatMul")
    names = {"q": node.inputs[0].name, "kt": node.inputs[1].name, "v": product.inputs[1].name}
    written = {o for f in (node, *fused) for o in f.node.output}
    adds = [next(t.name for t in f.inputs if t.name not in written) for f in fused if f.op_type == "Add"]
    if spec.windows > 1:
        parts = [np.asarray(values[name], np.float32) for name in adds]
        in_windows = [p.reshape((1,) * (len(spec.bias_shape) - p.ndim) + p.shape) for p in parts]
        return {"bias": np.ascontiguousarray(sum(np.broadcast_to(p, spec.bias_shape) for p in in_windows), np.float32)}
    if adds:
        names["bias"] = adds[0]
    return {operand: np.asarray(values[names[operand]], np.float32) for operand in spec.constants}


def _all_constants(nodes: Sequence[NodeInfo]) -> dict[str, Any]:
    return {name: value for n in nodes for name, value in n.constants.items()}


def _outputs(followers: Sequence[NodeInfo], node: NodeInfo, before: NodeInfo) -> set[str]:
    """The tensors the chain writes before `before`: the scores an Add reads."""
    chain = [node, *followers]
    return {o for n in chain[: chain.index(before)] for o in n.node.output}


def _scalar_constant(node: NodeInfo) -> float | None:
    """The one constant value a Mul or Div multiplies or divides its first input by; None for anything else."""
    if len(node.node.input) != 2:
        return None
    value = node.constants.get(node.node.input[1])
    if value is None or np.asarray(value).size != 1 or np.asarray(value).dtype != np.float32:
        return None
    return float(np.asarray(value).reshape(()))


def _row_softmax(node: NodeInfo) -> bool:
    """A Softmax over the last axis: of a 2-D tensor whatever the opset, or of any rank from opset 13
    (one axis; before, the axes from `axis` on), as after a MatMul whose leading axes are Gemm rows."""
    rank = len(node.inputs[0].shape)
    if node.op_type != "Softmax" or rank < 2 or (rank > 2 and node.opset < 13):
        return False
    # the default axis, 1 before opset 13 and -1 since, is the row either way for 2-D
    return int(node.attributes.get("axis", -1)) in (rank - 1, -1)


def _bias_add(node: NodeInfo, followers: Sequence[NodeInfo]) -> np.ndarray | None:
    """The float32 bias of N values that the first follower, an Add of a constant along the product's last
    axis ([N], [1, N], ... of no higher rank), adds to a MatMul's output (a Linear layer's); else None."""
    if not followers or followers[0].op_type != "Add" or len(followers[0].node.input) != 2:
        return None
    add, product = followers[0], node.node.output[0]
    if list(add.node.input).count(product) != 1:
        return None
    other = add.node.input[1] if add.node.input[0] == product else add.node.input[0]
    value = add.constants.get(other)
    if value is None:
        return None
    value = np.asarray(value)
    n, rank = int(node.outputs[0].shape[-1]), len(node.outputs[0].shape)
    if value.dtype != np.float32 or value.ndim > rank or not value.ndim or value.shape[-1] != n or value.size != n:
        return None
    return value.reshape(n)


def _residual_add(node: NodeInfo, followers: Sequence[NodeInfo], at: int) -> bool:
    """Whether followers[at] adds, to the chain's tensor (the product's, or the follower's before it), a
    float32 tensor computed before the product, of the output's very shape (no broadcast): a residual."""
    if not 0 <= at < len(followers):
        return False
    add = followers[at]
    if add.op_type != "Add" or len(add.node.input) != 2:
        return False
    entering = followers[at - 1].node.output[0] if at else node.node.output[0]
    if list(add.node.input).count(entering) != 1:
        return False
    other = next(t for t in add.inputs if t.name != entering)
    return (other.name not in add.constants and other.dtype == np.float32
            and tuple(other.shape) == tuple(add.outputs[0].shape) == tuple(node.outputs[0].shape))


def _constant(node: NodeInfo, index: int) -> np.ndarray | None:
    """The input at `index` when it is an initializer, else None (absent or computed at run time)."""
    if len(node.inputs) <= index or not node.inputs[index].name:
        return None
    return node.constants.get(node.inputs[index].name)
