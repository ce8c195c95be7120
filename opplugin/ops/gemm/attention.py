"""Attention as exporters write it, one step: MatMul(Q, K^T) > [Mul or Div by a constant] > [Add of a
bias or mask] > Softmax over the keys > MatMul(P, V), fused by the MatMul plugin into a batched product
whose followers end in a second MatMul (plugin.py).

On a GPU, kernels/attention_tc.cu never writes the scores: a block walks the keys 64 at a time with an
online softmax, in 3xTF32 on the tensor cores (`attention.3xtf32`), or in plain TF32 (`attention.tf32`, one
MMA in place of three) for a run in a reduced precision. On the CPU device, the float64 reference below,
emulating plain TF32's roundings for the latter (`attention.reference.tf32`).
Q is (.., TQ, D), K^T (.., D, TK) as the graph has it, V (.., TK, DV), the bias (.., TQ, TK); every
leading axis broadcasts as numpy does, and the first one of an operand computed at run time is the batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...core.number_formats import FP32, round_to
from ...errors import PluginError
from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import Kernel
from ..activation import cuda_float
from ..layout.strides import contiguous_strides, element_strides
from ..layout.kernels import output_array
from ..operands import batched_input
from ..reference_variants import REFERENCE, reference_variant
from .matmul import BATCHED_3XTF32, GRID_Z_LIMIT, MAX_BATCH_RANK, matrix_strides

SOURCE = "attention_tc.cu"
QUERY_TILE = 64
MAX_HEAD = 64  # D and DV: a 64 x 64 tile of the kernel's
OPERANDS = ("q", "kt", "v", "bias")
TF32 = "tf32"
# what the kernel computes its two products in: FP32 (3xTF32, FP32's error), or TF32 (plain TF32: Q, K^T, the
# probabilities and V rounded once to TF32, unit roundoff 2^-11 as FP16's, with FP32's range)
PRECISIONS = (FP32, TF32)
# --variant MatMul=<name> for a fused attention -> the precision it runs in; the device picks the kernel for it
# (kernel_name): the tensor cores' on a GPU, the reference on the CPU
VARIANT_PRECISIONS = {REFERENCE: FP32, BATCHED_3XTF32: FP32, TF32: TF32, reference_variant(TF32): TF32}


def checked_precision(precision: str) -> str:
    """`precision` when the kernel computes in it (PRECISIONS), else a PluginError that says which it does."""
    if precision not in PRECISIONS:
        raise PluginError(f"attention: no kernel in {precision!r}; its precisions are {', '.join(PRECISIONS)}")
    return precision


def variant_for(precision: str, on_gpu: bool) -> str | None:
    """The variant that runs a fused attention in `precision`: None (the plugin's default) for FP32; for TF32,
    "tf32" on a GPU and "reference.tf32" on the CPU device (the reference emulating it)."""
    if checked_precision(precision) == FP32:
        return None
    return precision if on_gpu else reference_variant(precision)


def kernel_name(precision: str, on_gpu: bool) -> str:
    """"attention.3xtf32" or "attention.tf32" on a GPU; "attention.reference" or "attention.reference.tf32" on the CPU."""
    checked_precision(precision)
    if not on_gpu:
        return f"attention.{reference_variant(precision)}"
    return "attention.3xtf32" if precision == FP32 else f"attention.{precision}"


def shared_bytes(precision: str = FP32) -> int:
    """The kernel's dynamic shared memory: Q's tile (and in 3xTF32 its small parts), P, K and V tiles, three
    per-row values (attention_tc.cu's SHARED_FLOATS)."""
    q_parts = 2 if checked_precision(precision) == FP32 else 1
    return ((q_parts + 1) * 64 * 68 + 2 * 64 * 72 + 3 * 64) * 4


@dataclass(frozen=True)
class AttentionSpec:
    q_shape: tuple[int, ...]  # at the plan's batch
    kt_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    scale: float = 1.0
    bias_shape: tuple[int, ...] | None = None
    constants: frozenset[str] = frozenset()  # the operands among OPERANDS that are initializers
    # a Transpose of the output fused after the product (heads merged: (N, H, T, DV) -> (N, T, H, DV)):
    # the kernel writes through the transposed view, and the step's output is the transposed tensor
    out_perm: tuple[int, ...] | None = None
    # > 1 for Swin's shifted windows: the graph's tensors have N x `windows` matrices along their first
    # axis, which the spec's shapes (and the step's kernel) split into (N, windows), so that a mask per
    # window broadcasts over N as a constant of its own (the bias then holds the mask added in)
    windows: int = 1
    # the product's first-axis extent per image (after the windows' split): more than 1 where the graph folds
    # several matrices per image into it (Swin's unshifted windows); the costs take images and scale by it
    per_image: int = 1

    @property
    def tq(self) -> int:
        return self.q_shape[-2]

    @property
    def tk(self) -> int:
        return self.kt_shape[-1]

    @property
    def d(self) -> int:
        return self.q_shape[-1]

    @property
    def dv(self) -> int:
        return self.v_shape[-1]

    def shape_of(self, operand: str) -> tuple[int, ...] | None:
        return {"q": self.q_shape, "kt": self.kt_shape, "v": self.v_shape, "bias": self.bias_shape}[operand]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        shapes = [self.q_shape[:-2], self.kt_shape[:-2], self.v_shape[:-2]] + ([self.bias_shape[:-2]] if self.bias_shape else [])
        return tuple(np.broadcast_shapes(*shapes))

    def in_graph(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape of the spec's as the graph has it: (N, windows, ..) merged back into (N windows, ..)."""
        return shape if self.windows == 1 else (shape[0] * shape[1], *shape[2:])

    def product_shape(self, batch: int) -> tuple[int, ...]:
        """softmax(..) V's shape, before any fused Transpose."""
        return (batch, *(*self.batch_shape, self.tq, self.dv)[1:])

    def output_shape(self, batch: int) -> tuple[int, ...]:
        shape = self.product_shape(batch)
        return shape if self.out_perm is None else tuple(shape[p] for p in self.out_perm)

    def matrices(self, batch: int) -> int:
        return int(np.prod(self.product_shape(batch)[:-2], dtype=np.int64))

    def strides(self, operand: str) -> tuple[int, ...]:
        return matrix_strides(self.shape_of(operand), operand in self.constants, len(self.batch_shape))

    def flops(self, images: int) -> int:
        return 2 * self.matrices(images * self.per_image) * self.tq * self.tk * (self.d + self.dv)

    def bytes_moved(self, images: int) -> int:
        extent = images * self.per_image

        def size(operand):
            shape = self.shape_of(operand)
            if shape is None:
                return 0
            return int(np.prod(shape if operand in self.constants else (extent, *shape[1:]), dtype=np.int64))
        return 4 * (sum(size(o) for o in OPERANDS) + int(np.prod(self.output_shape(extent), dtype=np.int64)))

    def reason_against(self) -> str | None:
        """None when the pieces make one attention the kernel runs (shapes known that multiply, heads of at most
        MAX_HEAD, a bias over the scores), else why."""
        if min(len(self.q_shape), len(self.kt_shape), len(self.v_shape)) < 3:
            return "Q, K^T and V need a leading axis (the batch)"
        if min((*self.q_shape, *self.kt_shape, *self.v_shape)) < 1:
            return "a shape of Q, K^T or V is unknown at plan time, or empty"
        if self.d > MAX_HEAD or self.dv > MAX_HEAD:
            return f"heads of {self.d} and {self.dv} values: the kernel takes at most {MAX_HEAD}"
        if self.kt_shape[-2] != self.d or self.v_shape[-2] != self.tk:
            return f"Q {list(self.q_shape)}, K^T {list(self.kt_shape)} and V {list(self.v_shape)} do not multiply"
        if self.bias_shape is not None and (len(self.bias_shape) < 2 or tuple(self.bias_shape[-2:]) != (self.tq, self.tk)):
            return f"the Add's operand {list(self.bias_shape)} is not one value per score ({self.tq} x {self.tk})"
        try:
            lead = self.batch_shape
        except ValueError:
            return "the leading axes of Q, K^T, V and the bias do not broadcast"
        if len(lead) > MAX_BATCH_RANK:
            return f"more than {MAX_BATCH_RANK} leading axes are not implemented"
        for operand in OPERANDS:
            shape = self.shape_of(operand)
            if shape is not None and operand not in self.constants and len(shape) != len(lead) + 2:
                return f"{operand} is computed at run time with rank {len(shape)} below the output's: its first axis would not be the batch"
        if self.out_perm is not None and sorted(self.out_perm) != list(range(len(lead) + 2)):
            return f"the Transpose after it (perm {list(self.out_perm)}) is no permutation of the output's axes"
        return None


def reference(spec: AttentionSpec, q: Any, kt: Any, v: Any, bias: Any = None, precision: str = FP32) -> np.ndarray:
    """The nodes' meaning in the operands' dtype (float64 for the oracle): softmax(Q K^T * scale + bias) V. With
    `precision` TF32, as the plain-TF32 kernel computes it: Q, K^T, the probabilities and V rounded to TF32 before
    their products, everything else (the sums too) in the operands' dtype."""
    checked_precision(precision)
    scores = np.matmul(_rounded(q, precision), _rounded(kt, precision)) * spec.scale
    if bias is not None:
        scores = scores + bias
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    y = np.matmul(_rounded(e / e.sum(axis=-1, keepdims=True), precision), _rounded(v, precision))
    return y if spec.out_perm is None else np.ascontiguousarray(y.transpose(spec.out_perm))


def _rounded(x: Any, precision: str) -> Any:
    """An operand of a product as the kernel reads it in `precision`: as it is in FP32, else rounded to the format
    (round_to: the checks' own rounding) and held in its dtype. A float64 operand (the probabilities) passes
    through float32 first: a second rounding, of 2^-24 at most."""
    return x if precision == FP32 else round_to(np.asarray(x, np.float32), precision).astype(np.asarray(x).dtype)


class ReferenceAttentionKernel(Kernel):
    """The float64 reference as the CPU device's kernel, emulating TF32's roundings for `precision` TF32; called
    with the step's inputs [Q, K^T, (bias,) V]."""

    def __init__(self, spec: AttentionSpec, name: str, constants: dict[str, np.ndarray], precision: str = FP32):
        self.spec, self.name, self._constants, self.precision = spec, name, constants, checked_precision(precision)
        # an emulation names itself, so that the exact path's rerun of a chunk asks for the same precision
        self.variant = variant_for(precision, on_gpu=False)

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        operands = operands_of(self.spec, inputs, self._constants)
        q, kt, v, bias = (None if x is None else np.asarray(x, np.float64) for x in (operands[o] for o in OPERANDS))
        y = reference(self.spec, q, kt, v, bias, self.precision).astype(np.float32)
        return [y.reshape(self.spec.in_graph(y.shape))]


def split_windows(spec: AttentionSpec, x: Any) -> Any:
    """A run-time operand of the graph's (N windows, ..) as the spec's (N, windows, ..): a view."""
    return x if spec.windows == 1 else x.reshape(x.shape[0] // spec.windows, spec.windows, *x.shape[1:])


def operands_of(spec: AttentionSpec, inputs: Sequence[Any], constants: dict[str, Any]) -> dict[str, Any]:
    """The operands by name from the step's inputs (partition.step_inputs: the first MatMul's own two, Q and
    K^T, whatever they are, then what the followers read from outside the chain but initializers: the bias
    where it is computed at run time, then V); an initializer among them from `constants`, kept at build."""
    later = [o for o in ("bias", "v") if spec.shape_of(o) is not None and o not in spec.constants]
    if len(inputs) < 2 + len(later):
        raise PluginError(f"attention: {2 + len(later)} inputs expected (q, kt{''.join(', ' + o for o in later)}), {len(inputs)} given")
    given = {"q": inputs[0], "kt": inputs[1], **dict(zip(later, inputs[2:]))}
    return {o: constants[o] if o in constants else None if given.get(o) is None else split_windows(spec, given[o]) for o in OPERANDS}


# per operand (and the output): the strides of its leading axes under the output's (0 where it
# broadcasts), then of its rows and of its columns, in floats; then whether it starts on 16 bytes with
# its leading strides multiples of four floats, so that the kernel may copy its rows four floats at once
Layout = tuple[tuple[tuple[int, ...], int, int, bool], ...]


def contiguous_layout(spec: AttentionSpec) -> Layout:
    """Every operand as a C-contiguous tensor of its own: the layout `compile_job` compiles for."""
    rank = len(spec.batch_shape)
    layout = []
    for operand in OPERANDS:
        shape = spec.shape_of(operand)
        layout.append(((0,) * rank, 0, 0, False) if shape is None else (spec.strides(operand), shape[-1], 1, True))
    out_strides = contiguous_strides(spec.output_shape(1))
    if spec.out_perm is not None:  # the product's axes, as they lie in the transposed output
        out_strides = tuple(out_strides[spec.out_perm.index(axis)] for axis in range(len(out_strides)))
    layout.append((out_strides[:-2], out_strides[-2], out_strides[-1], True))
    return tuple(layout)


def layout_of(spec: AttentionSpec, operands: dict[str, Any], y: Any) -> Layout:
    """The strides of the arrays a call hands the kernel: views as they lie (`y`: the product's shape)."""
    rank = len(spec.batch_shape)
    default = contiguous_layout(spec)
    layout = []
    for operand, fixed in zip(OPERANDS, default):
        x = operands[operand]
        layout.append(fixed if x is None or operand in spec.constants else _strides_under(x, rank, spec.product_shape(x.shape[0])))
    return (*layout, _strides_under(y, rank, y.shape))


def _strides_under(x: Any, rank: int, output: tuple[int, ...]) -> tuple[tuple[int, ...], int, int, bool]:
    strides = element_strides(x)
    lead = tuple(0 if x.shape[axis] == 1 and output[axis] != 1 else strides[axis] for axis in range(rank))
    return lead, strides[-2], strides[-1], starts_aligned(x) and all(stride % 4 == 0 for stride in lead)


def starts_aligned(x: Any) -> bool:
    """Whether a device array (a view too) starts on a 16-byte boundary."""
    return x.data.ptr % 16 == 0


def defines(spec: AttentionSpec, layout: Layout | None = None, precision: str = FP32) -> dict[str, int | str]:
    """attention_tc.cu's macros for `spec`, its operands laid out as `layout` says (None: contiguous_layout), its
    products in `precision` (SPLIT 1: 3xTF32; 0: plain TF32)."""
    lead = spec.batch_shape
    macros: dict[str, int | str] = {"TQ": spec.tq, "TK": spec.tk, "D": spec.d, "DV": spec.dv, "SCALE": cuda_float(spec.scale),
                                    "HAS_BIAS": int(spec.bias_shape is not None), "BATCH_RANK": max(1, len(lead)),
                                    "SPLIT": int(checked_precision(precision) == FP32)}
    for axis in range(1, len(lead)):
        macros[f"OUT_DIM{axis}"] = lead[axis]
    for operand, (strides, row, col, aligned) in zip((*OPERANDS, "out"), layout or contiguous_layout(spec)):
        name = operand.upper()
        macros[f"{name}_ROW"], macros[f"{name}_COL"], macros[f"{name}_ALIGNED"] = f"{row}LL", f"{col}LL", int(aligned)
        for axis in range(MAX_BATCH_RANK):
            macros[f"{name}_STRIDE{axis}"] = f"{strides[axis] if axis < len(strides) else 0}LL"
    return macros


def compile_job(spec: AttentionSpec, arch: str, layout: Layout | None = None, precision: str = FP32) -> CompileJob:
    return cuda.module_job(SOURCE, defines(spec, layout, precision), arch)


class AttentionKernel(Kernel):
    """kernels/attention_tc.cu for one attention; called with the step's inputs [Q, K^T, (bias,) V], each a
    tensor of its own or a strided view of one (a slice of a QKV projection, a transposed K): the kernel
    reads them as they lie, compiled once per layout met; its products in `precision` (3xTF32 for FP32, or plain TF32)."""

    # the 3xTF32 split turns an infinity into NaN, and TF32's rounding takes a value near FP32's largest to
    # infinity: watched, and rerun node by node
    nonfinite_exact = False
    flags_nonfinite = True
    out_view = "strided"  # it writes through any view of its output's shape

    def __init__(self, spec: AttentionSpec, name: str, constants: dict[str, np.ndarray], precision: str = FP32):
        import cupy

        self.spec, self.name, self.precision = spec, name, checked_precision(precision)
        self.variant = variant_for(precision, on_gpu=True)
        self._shared_bytes = shared_bytes(precision)
        self._functions: dict[Layout, Any] = {}
        self._by_arrays: dict[tuple, Any] = {}  # the arrays' shapes, strides and alignment -> the function for their layout
        self._inverse_perm = None if spec.out_perm is None else tuple(int(a) for a in np.argsort(spec.out_perm))
        self._function(contiguous_layout(spec))  # compiled at build, from the job compile_jobs declared
        self._constants = {o: cupy.asarray(x, dtype=cupy.float32) for o, x in constants.items()}

    @property
    def functions(self) -> list[Any]:
        return list(self._functions.values())

    def _function(self, layout: Layout) -> Any:
        function = self._functions.get(layout)
        if function is None:
            function = cuda.load(compile_job(self.spec, cuda.device_arch(), layout, self.precision)).get_function("attention_tc")
            function.max_dynamic_shared_size_bytes = self._shared_bytes
            self._functions[layout] = function
        return function

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0) -> list[Any]:
        """[the attention's output]; written into `out` when given (a float32 array of the output's shape, any strides)."""
        import cupy

        with cuda.on_stream(stream):
            operands = operands_of(self.spec, inputs, self._constants)
            for operand in ("q", "kt", "v", "bias"):
                if operands[operand] is not None and operand not in self.spec.constants:
                    operands[operand] = batched_input(cupy, operands[operand], self.spec.shape_of(operand)[1:], operand, self.name)
            batch = int(next(operands[o] for o in OPERANDS if operands[o] is not None and o not in self.spec.constants).shape[0])
            shape = self.spec.output_shape(batch)
            y = output_array(out, self.spec.in_graph(shape), self.name)
            product = split_windows(self.spec, y)
            product = product if self.spec.out_perm is None else product.transpose(self._inverse_perm)
            arrays = [operands[o] for o in OPERANDS if o not in self.spec.constants and operands[o] is not None] + [product]
            key = tuple((x.shape, x.strides, starts_aligned(x)) for x in arrays)  # cheap to read: a call meets few layouts
            function = self._by_arrays.get(key)
            if function is None:
                function = self._by_arrays[key] = self._function(layout_of(self.spec, operands, product))
            matrices = self.spec.matrices(batch)
            bias = operands["bias"] if operands["bias"] is not None else np.uint64(0)
            for first in range(0, matrices, GRID_Z_LIMIT):
                grid = (-(-self.spec.tq // QUERY_TILE), min(GRID_Z_LIMIT, matrices - first), 1)
                function(grid, (256, 1, 1), (operands["q"], operands["kt"], operands["v"], bias, product, np.int32(first),
                                             np.uint64(nonfinite)), shared_mem=self._shared_bytes)
        return [y]
