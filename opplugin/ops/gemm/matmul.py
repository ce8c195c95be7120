"""ONNX MatMul of any rank (numpy's matmul, operands of rank 2 or more) on the Gemm plugin.

Two forms, decided per node at plan time:
- flat: A (batch, ..., M, K) times a constant 2-D B (K, N), as a ConvNeXt MLP's (N, H, W, C) x
  (C, 4C). A's leading axes merge into the Gemm's rows (a view of a contiguous A), so every
  Gemm family, its heuristic and its epilogue (activation, row Softmax) run it unchanged.
- batched: anything else (B computed at run time, a constant B of rank 3 or more, a constant
  A): one (M, K) x (K, N) product per output matrix, the leading axes broadcast as numpy does,
  an activation fused: `batched_3xtf32` on the tensor cores (kernels/gemm_batched_tc.cu, the GPU's
  default), or `batched` on FP32 FMAs (kernels/gemm_batched.cu).

The batch is the first axis of the output, and every operand computed at run time has the
output's rank, so its first axis is that batch; a constant may broadcast along it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import Kernel, NodeInfo
from ..activation import Activation
from ..operands import batched_input
from .row_prologue import RowPrologue
from .spec import GemmSpec

BATCHED = "batched"  # the variants of a batched product on a GPU: FP32 FMAs ...
BATCHED_3XTF32 = "batched_3xtf32"  # ... and the tensor cores (the default)
BATCHED_SOURCES = {BATCHED: ("gemm_batched.cu", "matmul_batched"), BATCHED_3XTF32: ("gemm_batched_tc.cu", "matmul_batched_tc")}
BATCHED_TILE = (64, 64)  # BM x BN of both kernels: 256 threads
TC_STAGES = 3
TC_SHARED_BYTES = TC_STAGES * (64 * 36 + 32 * 72) * 4  # the A and B slices of kernels/gemm_batched_tc.cu's stages
MAX_BATCH_RANK = 4
GRID_Z_LIMIT = 65535


def extent_per_image(extent: int, images: int) -> int:
    """A first axis's extent per image, where it is a whole multiple of the images (else 1)."""
    return extent // images if images > 0 and extent >= images and extent % images == 0 else 1


@dataclass(frozen=True)
class MatMulSpec:
    a_shape: tuple[int, ...]  # at the plan's batch
    b_shape: tuple[int, ...]
    a_constant: bool
    b_constant: bool
    # the output's first-axis extent per image: more than 1 where the graph folds several matrices per image
    # into the first axis (Swin's N x 64 windows); the costs (flops, bytes_moved) take images and scale by it
    per_image: int = 1

    @property
    def m(self) -> int:
        return self.a_shape[-2]

    @property
    def k(self) -> int:
        return self.a_shape[-1]

    @property
    def n(self) -> int:
        return self.b_shape[-1]

    @property
    def is_flat(self) -> bool:
        return not self.a_constant and self.b_constant and len(self.b_shape) == 2

    @property
    def rows_per_image(self) -> int:
        """The flat form's Gemm rows per image: A's axes but K, per image."""
        return self.per_image * int(np.prod(self.a_shape[1:-1], dtype=np.int64))

    @property
    def gemm(self) -> GemmSpec:
        """The flat form's Gemm: rows = every axis of A but K, at the plan's batch."""
        return GemmSpec(int(np.prod(self.a_shape[:-1], dtype=np.int64)), self.n, self.k)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The output's leading (matrix-indexing) axes at the plan's batch."""
        return tuple(np.broadcast_shapes(self.a_shape[:-2], self.b_shape[:-2]))

    def output_shape(self, batch: int) -> tuple[int, ...]:
        planned = (*self.batch_shape, self.m, self.n)
        return (batch, *planned[1:])

    def matrices(self, batch: int) -> int:
        return int(np.prod(self.output_shape(batch)[:-2], dtype=np.int64))

    def strides(self, operand: str) -> tuple[int, ...]:
        """Per output batch axis, how far `operand`'s matrix moves (in floats) when that index grows by one (0: broadcast)."""
        shape, constant = (self.a_shape, self.a_constant) if operand == "a" else (self.b_shape, self.b_constant)
        return matrix_strides(shape, constant, len(self.batch_shape))

    def flops(self, images: int) -> int:
        return 2 * self.matrices(images * self.per_image) * self.m * self.n * self.k

    def bytes_moved(self, images: int) -> int:
        extent = images * self.per_image

        def size(shape, constant):
            return int(np.prod(shape if constant else (extent, *shape[1:]), dtype=np.int64))
        return 4 * (size(self.a_shape, self.a_constant) + size(self.b_shape, self.b_constant) + int(np.prod(self.output_shape(extent))))

    @classmethod
    def from_node(cls, node: NodeInfo) -> "MatMulSpec":
        where = f"MatMul {node.name}"
        a, b = node.inputs[0], node.inputs[1]
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise PluginError(f"{where}: a 1-D operand is not implemented (A {list(a.shape)}, B {list(b.shape)})")
        if min(*a.shape, *b.shape) < 0:
            raise PluginError(f"{where}: the operands' shapes are not known at plan time (A {list(a.shape)}, B {list(b.shape)})")
        if a.shape[-1] != b.shape[-2]:
            raise PluginError(f"{where}: A {list(a.shape)} and B {list(b.shape)} do not multiply")
        spec = cls(tuple(map(int, a.shape)), tuple(map(int, b.shape)), a.name in node.constants, b.name in node.constants,
                   extent_per_image(int(node.outputs[0].shape[0]) if node.outputs[0].shape else 0, node.batch))
        if spec.a_constant and spec.b_constant:
            raise PluginError(f"{where}: both operands are constants (simplification folds such a node)")
        try:
            lead = spec.batch_shape
        except ValueError:
            raise PluginError(f"{where}: the leading axes of A {list(a.shape)} and B {list(b.shape)} do not broadcast") from None
        if not spec.is_flat:
            rank = len(lead) + 2
            if rank == 2:
                raise PluginError(f"{where}: a 2-D product whose B is computed at run time (or whose A is a constant) is not "
                                  "implemented: its batch would be A's rows, which the batched kernel compiles in")
            for name, shape, constant in (("A", spec.a_shape, spec.a_constant), ("B", spec.b_shape, spec.b_constant)):
                if not constant and len(shape) != rank:
                    raise PluginError(f"{where}: {name} is computed at run time with rank {len(shape)} below the output's {rank}: "
                                      "its first axis would not be the batch")
            if len(lead) > MAX_BATCH_RANK:
                raise PluginError(f"{where}: more than {MAX_BATCH_RANK} leading axes are not implemented")
        return spec


def matrix_strides(shape: tuple[int, ...], constant: bool, rank: int) -> tuple[int, ...]:
    """For an operand of `shape` (its last two axes a matrix) under an output with `rank` leading axes:
    per leading axis, how far its matrix moves (in floats) when that index grows by one (0: broadcast)."""
    lead = shape[:-2]
    padded = (1,) * (rank - len(lead)) + tuple(lead)
    strides, step = [0] * rank, shape[-2] * shape[-1]
    for axis in range(rank - 1, -1, -1):
        # the batch axis moves a run-time operand whatever its extent at the plan's batch (1, say)
        moves = padded[axis] > 1 or (axis == 0 and not constant and len(lead) == rank)
        strides[axis] = step if moves else 0
        step *= padded[axis]
    return tuple(strides)


def reference(spec: MatMulSpec, a: Any, b: Any, activation: Activation | None = None) -> np.ndarray:
    """numpy's matmul in the operands' dtype (float64 for the oracle), then the activation."""
    y = np.matmul(a, b)
    return activation.apply(y) if activation else y


class ReferenceMatMulKernel(Kernel):
    """The batched form's numpy reference, run as the CPU device's kernel: float64 arithmetic, float32 out."""

    def __init__(self, spec: MatMulSpec, activation: Activation | None, name: str):
        self.spec, self.activation, self.name = spec, activation, name

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        a, b = (np.asarray(x, np.float64) for x in inputs[:2])
        return [reference(self.spec, a, b, self.activation).astype(np.float32)]


class FlatMatMulKernel(Kernel):
    """A Gemm kernel run on A with its leading axes merged into rows: (batch, ..., K) -> (rows, K) -> (batch, ..., N).
    With `residual`, the last input is a tensor of the output's shape that the Gemm's epilogue adds."""

    def __init__(self, spec: MatMulSpec, gemm: Kernel, residual: bool = False, prologue: RowPrologue | None = None):
        """`prologue`: what the Gemm kernel does to A's rows first (row_prologue.py): the step reads its chain's
        input, whose rows (gathered, where the chain gathers) become A's."""
        self.spec, self.gemm, self.residual, self.prologue = spec, gemm, residual, prologue
        self._rows_per_lead = int(np.prod(spec.a_shape[1:-1], dtype=np.int64))  # A's rows per unit of its first axis
        self.name, self.variant = gemm.name, gemm.variant
        self.nonfinite_exact, self.device_work = gemm.nonfinite_exact, gemm.device_work
        # a call reshapes its arrays and calls the Gemm kernel: what that launches and flags is all it does
        self.replayable, self.flags_nonfinite = gemm.replayable, gemm.flags_nonfinite
        # a reshaped `out` stays a view of the one given only where that is contiguous
        self.out_view = "contiguous" if gemm.out_view else ""

    def flops(self, batch: int) -> int:
        return self.gemm.flops(batch * self.spec.rows_per_image)

    def bytes_moved(self, batch: int) -> int:
        rows = batch * self.spec.rows_per_image
        return self.gemm.bytes_moved(rows) + (4 * rows * self.spec.n if self.residual else 0)

    def workspace_bytes(self, batch: int) -> int:
        return self.gemm.workspace_bytes(batch * self.spec.rows_per_image)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, **out: Any) -> list[Any]:
        a = inputs[0]
        if self.prologue is not None:  # its chain's input (Reshapes, a gather): A's leading extent from the rows it makes
            rows = self.prologue.rows_after(a.size // self.spec.k) if a.size % self.spec.k == 0 else -1
            if rows < 0 or rows % self._rows_per_lead:
                raise PluginError(f"{self.name}: its input has shape {tuple(a.shape)}, no whole rows of A's {self.spec.a_shape[1:]}")
            lead = rows // self._rows_per_lead
        elif tuple(a.shape[1:]) != self.spec.a_shape[1:]:
            raise PluginError(f"{self.name}: A has shape {tuple(a.shape)}, expected (batch, {', '.join(map(str, self.spec.a_shape[1:]))})")
        else:
            lead = int(a.shape[0])
        shape = self.spec.output_shape(lead)
        if out.get("out") is not None:
            out = {**out, "out": out["out"].reshape(-1, self.spec.n)}
        operands = list(inputs[1:])
        if self.residual:
            residual = operands.pop()
            if tuple(residual.shape) != shape:
                raise PluginError(f"{self.name}: the residual has shape {tuple(residual.shape)}, expected {shape}")
            out = {**out, "residual": residual.reshape(-1, self.spec.n)}
        [y] = self.gemm([a.reshape(-1, self.spec.k), *operands], stream, **out)
        return [y.reshape(shape)]


def batched_defines(spec: MatMulSpec, activation: Activation | None, variant: str = BATCHED_3XTF32) -> dict[str, int | str]:
    lead = spec.batch_shape
    macros: dict[str, int | str] = {"M": spec.m, "N": spec.n, "K": spec.k, "BATCH_RANK": max(1, len(lead))}
    a_strides, b_strides = (spec.strides("a"), spec.strides("b")) if lead else ((0,), (0,))
    for axis in range(max(1, len(lead))):
        macros[f"A_STRIDE{axis}"], macros[f"B_STRIDE{axis}"] = a_strides[axis], b_strides[axis]
        if axis:
            macros[f"OUT_DIM{axis}"] = lead[axis]
    if variant == BATCHED_3XTF32:
        macros["STAGES"] = TC_STAGES
    return macros | (activation.define() if activation else {})


def batched_job(spec: MatMulSpec, activation: Activation | None, arch: str, variant: str = BATCHED_3XTF32) -> CompileJob:
    """What BatchedMatMulKernel compiles for this node on a GPU of `arch`."""
    return cuda.module_job(BATCHED_SOURCES[variant][0], batched_defines(spec, activation, variant), arch)


class BatchedMatMulKernel(Kernel):
    """The batched product for one node (`variant`: BATCHED or BATCHED_3XTF32); call it with [A, B]
    (CuPy arrays; a constant given at build is ignored)."""

    def __init__(self, spec: MatMulSpec, activation: Activation | None, name: str, a: np.ndarray | None, b: np.ndarray | None,
                 variant: str = BATCHED_3XTF32):
        import cupy

        self.spec, self.activation, self.name, self.variant = spec, activation, name, variant
        self.function = cuda.load(batched_job(spec, activation, cuda.device_arch(), variant)).get_function(BATCHED_SOURCES[variant][1])
        self.functions = [self.function]
        tensor = variant == BATCHED_3XTF32
        # FP32 FMAs carry NaN and Inf as onnxruntime's do; the tensor cores' split operands turn an infinity
        # into NaN, so the runner watches that kernel (it raises its own flag) and reruns on BATCHED
        self.nonfinite_exact, self.flags_nonfinite = not tensor, tensor
        self._shared = TC_SHARED_BYTES if tensor else 0
        if self._shared > 48 * 1024:  # past the default, a kernel must ask for its dynamic shared memory
            self.function.max_dynamic_shared_size_bytes = self._shared
        self._constants = [None if x is None else cupy.asarray(x, dtype=cupy.float32) for x in (a, b)]

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def _operand(self, cupy: Any, inputs: Sequence[Any], index: int) -> Any:
        if self._constants[index] is not None:
            return self._constants[index]
        x = inputs[index] if len(inputs) > index else None
        expected = (self.spec.a_shape, self.spec.b_shape)[index][1:]
        x = cupy.ascontiguousarray(batched_input(cupy, x, expected, "AB"[index], self.name))
        return x if x.data.ptr % 16 == 0 else x.copy()  # 16-byte copies need 16-byte rows; a fresh array has them

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0) -> list[Any]:
        """[C] for the node's inputs; `nonfinite` as GemmKernel's (for the tensor-core kernel)."""
        import cupy

        if nonfinite and not self.flags_nonfinite:
            raise PluginError(f"{self.name}: this kernel does not flag NaN and Inf itself")
        with cuda.on_stream(stream):
            a, b = self._operand(cupy, inputs, 0), self._operand(cupy, inputs, 1)
            batch = int((b if self._constants[0] is not None else a).shape[0])
            if self._constants[0] is None and self._constants[1] is None and a.shape[0] != b.shape[0]:
                raise PluginError(f"{self.name}: A and B have different batches, {a.shape[0]} and {b.shape[0]}")
            shape = self.spec.output_shape(batch)
            if out is not None and (not isinstance(out, cupy.ndarray) or out.dtype != np.float32 or tuple(out.shape) != shape
                                    or not out.flags.c_contiguous):
                raise PluginError(f"{self.name}: out must be a C-contiguous float32 CuPy array of shape {shape}")
            y = cupy.empty(shape, dtype=cupy.float32) if out is None else out
            matrices = self.spec.matrices(batch)
            bm, bn = BATCHED_TILE
            for first in range(0, matrices, GRID_Z_LIMIT):
                grid = (-(-self.spec.n // bn), -(-self.spec.m // bm), min(GRID_Z_LIMIT, matrices - first))
                if self.flags_nonfinite:
                    self.function(grid, (256,), (a, b, y, np.int32(first), np.uint64(nonfinite)), shared_mem=self._shared)
                else:
                    self.function(grid, (256,), (a, b, y, np.int32(first)))
        return [y]
