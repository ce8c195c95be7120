"""Built Gemm kernels: the numpy reference (CPU device) and a compiled CUDA family.

The CUDA families all read A as batch x K and W as N x K, both K-contiguous, with
W's rows and columns padded with zeros to what the family's tiles need, and C as
beta * C in one value per column or one per element. The kernel object puts the
node's operands in that form: constant weights (and C) once, at build, so a call
only launches; operands computed at run time on every call, on the call's stream
(transA/transB then cost a transposing copy).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...core.number_formats import FP32, round_to
from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...errors import PluginError
from ...registry import Kernel
from ..operands import checked_array
from ..reference_variants import reference_variant
from . import reference
from .epilogue import NONE, GemmEpilogue
from .families import HALF_FORMATS, GemmConfig, TensorConfig, WgmmaConfig, defines, effective_bias
from .row_prologue import RowPrologue
from .spec import BIAS_COLUMN, BIAS_FULL, BIAS_NONE, GemmSpec


def kernel_name(op: str, variant: str, epilogue: GemmEpilogue = NONE, prologue: RowPrologue | None = None) -> str:
    """A Gemm or MatMul kernel's name in reports: "<op>.<prologue><configured name><epilogue>", e.g.
    "gemm.rowwarp_r2+softmax", "matmul.ln*wg_3xtf32_b64x64x32_s3+gelu", "matmul.reference.fp16+relu"."""
    return f"{op}.{prologue.prefix if prologue else ''}{variant}{epilogue.suffix}"


class ReferenceGemmKernel(Kernel):
    """The numpy reference, run as the Gemm kernel of the CPU device (with its epilogue, if fused). With a
    `precision`, the step a GPU would run in it: A (after the prologue) and W rounded to the format, as the
    kernel converts them, then the product, C, the epilogue and the residual in FP32, as its sums are."""

    def __init__(self, spec: GemmSpec, epilogue: GemmEpilogue = NONE, op: str = "gemm", bias: np.ndarray | None = None,
                 prologue: RowPrologue | None = None, precision: str | None = None):
        """`bias`: a constant C that the inputs do not carry (a MatMul's fused bias Add); `prologue`: a
        LayerNorm and a row gather applied to A's rows first (row_prologue.py); `precision`: "tf32", "fp16"
        or "bf16" to emulate (None: FP32)."""
        self.spec, self.epilogue, self.bias, self.prologue = spec, epilogue, bias, prologue
        self.precision = None if precision == FP32 else precision
        self.name = kernel_name(op, reference_variant(self.precision), epilogue, prologue)
        # an emulation names itself, so that the exact path's rerun of a chunk emulates the same precision
        self.variant = None if self.precision is None else reference_variant(self.precision)

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def _rounded(self, operand: Any) -> Any:
        """An operand as the emulated kernel reads it: in its format (round_to: the checks' own rounding), held as float32."""
        return operand if self.precision is None else round_to(np.asarray(operand, np.float32), self.precision)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, residual: Any = None) -> list[Any]:
        c = inputs[2] if len(inputs) > 2 and inputs[2] is not None else self.bias
        a = inputs[0] if self.prologue is None else self.prologue.reference(inputs[0])
        y = reference.run(self.spec, self.epilogue, self._rounded(a), self._rounded(inputs[1]), c)
        if self.epilogue.residual:
            y = np.asarray(y, np.float32) + np.asarray(_residual_of(residual, self.name), np.float32)
        return [np.asarray(y, np.float32)]


def _residual_of(residual: Any, name: str) -> Any:
    """The residual a kernel whose epilogue adds one was handed; PluginError where it was not."""
    if residual is None:
        raise PluginError(f"{name}: its epilogue adds a residual, and none was given")
    return residual


def padded_weights(xp: Any, b: Any, spec: GemmSpec, config: GemmConfig) -> Any:
    """B' as N x K rows (B transposed unless transB), padded with zeros to the family's multiples."""
    w = b if spec.trans_b else b.T
    rows, cols = -(-spec.n // config.row_pad) * config.row_pad, -(-spec.k // config.col_pad) * config.col_pad
    out = xp.zeros((rows, cols), dtype=np.float32)
    out[: spec.n, : spec.k] = w
    return out


def column_bias(xp: Any, c: Any, spec: GemmSpec) -> Any:
    """beta * C as N floats (C of shape (), (1,), (N,) or (1, N)), rounded to float32 as onnxruntime forms it."""
    scaled = xp.asarray(c, dtype=np.float32) * np.float32(spec.beta) if spec.beta != 1.0 else xp.asarray(c, dtype=np.float32)
    return xp.ascontiguousarray(xp.broadcast_to(scaled.reshape(-1) if scaled.size > 1 else scaled.reshape(()), (spec.n,)))


def compile_job(spec: GemmSpec, config: GemmConfig, epilogue: GemmEpilogue, arch: str) -> CompileJob:
    """What GemmKernel compiles for this configuration on a GPU of `arch`."""
    return cuda.module_job(config.source, defines(spec, config, epilogue), arch, arch_specific=config.arch_specific)


TF32_KEPT = np.uint32(0xFFFFE000)  # the bits of an FP32 value that a TF32 operand keeps
SPLIT_BLOCK = 256  # gemm_small_parts' block
REDUCE_BLOCK = 256  # gemm_split_reduce's


def half_bits(cupy: Any, values: Any, family: str) -> Any:
    """FP32 `values` rounded to FP16 (wg_fp16) or BF16 (wg_bf16), nearest with ties to even, as their uint16 bits."""
    if family == "wg_fp16":
        return values.astype(cupy.float16).view(cupy.uint16)
    bits = values.view(cupy.uint32)
    rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) >> 16
    return cupy.where(cupy.isnan(values), cupy.uint32(0x7FC0), rounded).astype(cupy.uint16)  # a NaN stays one


def small_parts(cupy: Any, values: Any) -> Any:
    """Each value less its TF32 bits (exact in FP32): the small parts wgmma's 3xTF32 multiplies."""
    return values - (values.view(cupy.uint32) & TF32_KEPT).view(cupy.float32)


class GemmKernel(Kernel):
    """A compiled family for one node. Call it with the node's inputs [A, B, C?] (CuPy arrays);
    B and C are ignored when they were constants at build."""

    def __init__(self, spec: GemmSpec, config: GemmConfig, epilogue: GemmEpilogue, b: np.ndarray | None, c: np.ndarray | None,
                 op: str = "gemm", prologue: RowPrologue | None = None):
        """`prologue`: a LayerNorm and a row gather applied to A's rows before the product (row_prologue.py)."""
        import cupy

        self.spec, self.config, self.epilogue, self.prologue = spec, config, epilogue, prologue
        self.variant = config.name()
        self.name = kernel_name(op, self.variant, epilogue, prologue)
        module = cuda.load(compile_job(spec, config, epilogue, cuda.device_arch()))
        tensor = isinstance(config, (TensorConfig, WgmmaConfig))
        self.function = module.get_function(config.function)
        # wgmma reads A's small parts beside A: gemm_small_parts makes them before each product; the
        # half-precision families read A in their format, which gemm_to_half makes instead
        self._half = isinstance(config, WgmmaConfig) and config.half
        wgmma = isinstance(config, WgmmaConfig)
        self._small_parts = module.get_function("gemm_to_half" if self._half else "gemm_small_parts") if wgmma else None
        # a K split's runs store partial sums, which gemm_split_reduce adds in order through the epilogue
        self._splits = config.splits if isinstance(config, WgmmaConfig) else 1  # gemv's `splits` are warps of one block
        self._reduce = module.get_function("gemm_split_reduce") if self._splits > 1 else None
        self.functions = [self.function] + [f for f in (self._small_parts, self._reduce) if f is not None]
        # a prologue writes A's rows in the half-precision families' format itself, sparing gemm_to_half's pass
        self._half_format = HALF_FORMATS[config.family] if self._half else 0
        # then the calls get A's rows as the prologue writes them: the format's bits, not FP32
        self._a_in_format = bool(self._half_format) and prologue is not None
        if prologue is not None:
            self.functions.append(prologue.load(self._half_format))
        # FP32 FMAs carry NaN and Inf as onnxruntime's do, but the tensor cores' split operands turn an
        # infinity into NaN (tf32_mma.cuh): the runner watches such a kernel, which raises its own flag
        # as it stores (registry.Kernel); a fused row Softmax is split off on the exact path
        self.nonfinite_exact = not tensor and not epilogue.softmax
        self.flags_nonfinite = tensor
        self._shared = config.shared_bytes() if tensor else 0
        if self._shared > 48 * 1024:  # past the default, a kernel must ask for its dynamic shared memory
            self.function.max_dynamic_shared_size_bytes = self._shared
        self.bias_mode = effective_bias(spec)
        self._w = None if b is None else self._weights(cupy, cupy.asarray(b, dtype=cupy.float32))
        self._w_small = small_parts(cupy, self._w) if self._small_parts is not None and not self._half and self._w is not None else None
        self._c = None
        if self.bias_mode == BIAS_COLUMN and c is not None:
            self._c = column_bias(cupy, cupy.asarray(c), spec)
        # the common call (constant operands, a plain contiguous A) skips the general path's
        # checks and copies: at batch 1 the host's time per call is what the layer costs
        self._ready = self._w is not None and (self.bias_mode == BIAS_NONE or self._c is not None) and not spec.trans_a
        self._c_arg = self._c if self._c is not None else np.uint64(0)
        self._block = (config.threads, 1, 1)
        self._grids: dict[int, tuple[int, int, int]] = {}

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def _weights(self, cupy: Any, b: Any) -> Any:
        """W as the family reads it: padded N x K rows, in FP32, or in FP16's or BF16's bits."""
        w = padded_weights(cupy, b, self.spec, self.config)
        return half_bits(cupy, w, self.config.family) if self._half else w

    def _operand_a(self, cupy: Any, a: Any) -> Any:
        a = a.T if self.spec.trans_a else a
        if a.ndim != 2 or a.shape[1] != self.spec.k:
            raise PluginError(f"{self.name}: A' has shape {tuple(a.shape)}, expected (batch, {self.spec.k})")
        a = cupy.ascontiguousarray(a)
        return a if a.data.ptr % 16 == 0 else a.copy()  # float4 loads need 16-byte rows; a fresh array has them

    def _operand_c(self, cupy: Any, inputs: Sequence[Any], batch: int) -> Any:
        if self.bias_mode == BIAS_NONE:
            return np.uint64(0)  # a null pointer the kernel never reads
        if self._c is not None:
            return self._c
        if len(inputs) < 3 or inputs[2] is None:
            raise PluginError(f"{self.name}: the bias C is missing from the inputs")
        c = checked_array(cupy, inputs[2], "C", self.name)
        if self.bias_mode == BIAS_COLUMN:
            return column_bias(cupy, c, self.spec)
        scaled = c * np.float32(self.spec.beta) if self.spec.beta != 1.0 else c
        return cupy.ascontiguousarray(cupy.broadcast_to(scaled, (batch, self.spec.n)))

    def workspace_bytes(self, batch: int) -> int:
        """A's small parts, for wgmma, and a K split's partial sums."""
        small = 4 * batch * self.spec.k if self._small_parts is not None else 0
        normalised = 4 * batch * self.spec.k if self.prologue is not None else 0
        return small + normalised + (4 * self._splits * batch * self.spec.n if self._reduce is not None else 0)

    def _launch(self, grid: tuple[int, int, int], a: Any, w: Any, c: Any, y: Any, batch: int, nonfinite: int, residual: Any,
                a_small: Any = None) -> None:
        """One product over `batch` rows; `a_small`: A's small parts where the prologue made them already."""
        args = (a, w, c, y, np.int32(batch))
        if self._small_parts is not None:
            import cupy

            if a_small is None and a.dtype != cupy.uint16:  # the pass over A: its small parts (3xTF32), or A in FP16 or BF16
                a_small = cupy.empty(a.shape, dtype=cupy.uint16) if self._half else cupy.empty_like(a)
                blocks = min(-(-a.size // (4 * SPLIT_BLOCK)), 65535)
                self._small_parts((blocks, 1, 1), (SPLIT_BLOCK, 1, 1), (a, a_small, np.uint64(a.size)))
            if self._half:  # A in the format (converted above, or by the prologue), and no small parts: a null pointer
                a, a_small = (a if a_small is None else a_small), np.uint64(0)
            w_small = None if self._half else self._w_small if w is self._w else small_parts(cupy, w)
            partial = cupy.empty(self._splits * batch * self.spec.n, dtype=cupy.float32) if self._reduce is not None else None
            added = residual if residual is not None else np.uint64(0)  # a null pointer where none is added
            args = (a, a_small, w, np.uint64(0) if w_small is None else w_small, c, added, y if partial is None else partial, np.int32(batch))
        if self.flags_nonfinite:
            self.function(grid, self._block, (*args, np.uint64(nonfinite)), shared_mem=self._shared)
        else:
            self.function(grid, self._block, args)
        if self._reduce is not None:
            pairs = batch * -(-self.spec.n // 2)
            self._reduce((-(-pairs // REDUCE_BLOCK), 1, 1), (REDUCE_BLOCK, 1, 1), (partial, c, added, y, np.int32(batch), np.uint64(nonfinite)))

    def _prologue_pass(self, cupy: Any, a: Any) -> tuple[Any, Any]:
        """(A's rows as the product reads them, after the prologue: in FP32, or in the half-precision families'
        format; their small parts for wgmma's 3xTF32, made in the same pass, else None)."""
        x = checked_array(cupy, a, "A", self.name)
        if self.spec.trans_a or x.ndim != 2 or x.shape[1] != self.spec.k:
            raise PluginError(f"{self.name}: A has shape {tuple(x.shape)}, expected (rows, {self.spec.k})")
        x = cupy.ascontiguousarray(x)
        small = cupy.empty((self.prologue.rows_after(int(x.shape[0])), self.spec.k), dtype=cupy.float32) \
            if self._small_parts is not None and not self._half else None
        return self.prologue.launch(cupy, x, small, self._half_format), small

    def _residual_rows(self, cupy: Any, residual: Any, batch: int) -> Any:
        """The residual as the kernel reads it, C-contiguous (batch, N); None where the epilogue adds none."""
        if not self.epilogue.residual:
            return None
        r = checked_array(cupy, _residual_of(residual, self.name), "the residual", self.name)
        if tuple(r.shape) != (batch, self.spec.n):
            raise PluginError(f"{self.name}: the residual has shape {tuple(r.shape)}, expected {(batch, self.spec.n)}")
        return cupy.ascontiguousarray(r)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0, residual: Any = None) -> list[Any]:
        """[Y] for the node's inputs; Y is `out` when given (a C-contiguous float32 array, written in full).
        `nonfinite`: for a kernel that `flags_nonfinite`, the device address of a zeroed byte it sets if Y
        holds a NaN or an Inf. `residual`: the (batch, N) tensor an epilogue that adds one adds."""
        if nonfinite and not self.flags_nonfinite:
            raise PluginError(f"{self.name}: this kernel does not flag NaN and Inf itself")
        import cupy

        if not inputs:
            raise PluginError(f"{self.name}: no inputs given")
        a, a_small = inputs[0], None
        if self.prologue is not None:
            with cuda.on_stream(stream):
                a, a_small = self._prologue_pass(cupy, a)
        if self._ready and out is None and type(a) is cupy.ndarray and a.dtype == (np.uint16 if self._a_in_format else np.float32) and a.ndim == 2 \
                and a.shape[1] == self.spec.k and a.flags.c_contiguous and a.data.ptr % 16 == 0 and 0 < a.shape[0] <= self.config.max_batch():
            batch = a.shape[0]
            grid = self._grids.get(batch) or self._grids.setdefault(batch, self.config.grid(self.spec, batch))
            with cuda.on_stream(stream):
                y = cupy.empty((batch, self.spec.n), dtype=cupy.float32)
                self._launch(grid, a, self._w, self._c_arg, y, batch, nonfinite, self._residual_rows(cupy, residual, batch), a_small)
            return [y]
        with cuda.on_stream(stream):
            a = a if self._a_in_format else self._operand_a(cupy, checked_array(cupy, a, "A", self.name))
            batch = int(a.shape[0])
            if self._w is not None:
                w = self._w
            elif len(inputs) < 2 or inputs[1] is None:
                raise PluginError(f"{self.name}: the weights B are missing from the inputs")
            else:
                b = checked_array(cupy, inputs[1], "B", self.name)
                if tuple(b.shape) != self.spec.b_shape:
                    raise PluginError(f"{self.name}: B has shape {tuple(b.shape)}, expected {self.spec.b_shape}")
                w = self._weights(cupy, b)
            c = self._operand_c(cupy, inputs, batch)
            if out is not None and (not isinstance(out, cupy.ndarray) or out.dtype != cupy.float32 or tuple(out.shape) != (batch, self.spec.n)
                                    or not out.flags.c_contiguous):
                raise PluginError(f"{self.name}: out must be a C-contiguous float32 CuPy array of shape {(batch, self.spec.n)}")
            # the tensor-core kernel stores two neighbouring outputs as one 8-byte float2
            y = out if out is not None and out.data.ptr % 8 == 0 else cupy.empty((batch, self.spec.n), dtype=cupy.float32)
            added = self._residual_rows(cupy, residual, batch)
            if batch:
                for start in range(0, batch, self.config.max_batch()):  # a grid's y extent is limited
                    rows = min(self.config.max_batch(), batch - start)
                    c_rows = c[start:start + rows] if self.bias_mode == BIAS_FULL else c
                    self._launch(self.config.grid(self.spec, rows), a[start:start + rows], w, c_rows, y[start:start + rows], rows, nonfinite,
                                 None if added is None else added[start:start + rows], None if a_small is None else a_small[start:start + rows])
            if out is not None and y is not out:
                out[...] = y
                y = out
        return [y]
