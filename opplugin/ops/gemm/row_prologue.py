"""What a flat product's step does to the rows of A on their way into the product (a prologue,
plan/prologue.py), so that nodes whose output only the product reads need no step of their own:
- a LayerNormalization over the last axis (a transformer's LN > Linear);
- a Gather of each image's rows by a table (graph/passes/row_gather.py: Swin's cyclic shift, padding and
  window partition before a projection, or the reverse moved before the next one), between Reshapes, which
  move nothing in a contiguous tensor, after a Pad of one zero row where the table takes rows of zeros;
- both, in that order (the LayerNorm before a shifted window block's QKV projection).

On a GPU, kernels/row_prologue.cu reads each row of A where the table says, normalises it, and for
wg_3xtf32 writes each value's TF32 small part beside it, for wg_fp16 and wg_bf16 the value in that format
alone: the pass those kernels make over A before every product anyway (gemm_small_parts, gemm_to_half),
so the prologue costs neither a step nor a pass of its own. On the CPU
device the reference normalises the rows as the LayerNormalization plugin's reference does, then takes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import PluginError
from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import NodeInfo
from ..reduction.reference import normalize
from ..reduction.rows import Rows
from ..reduction.spec import LAYER, NormSpec, affine

SOURCE = "row_prologue.cu"
ROWS_PER_BLOCK = 8  # a warp a row, blocks of 256
RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")  # views of a contiguous tensor: no element moves


@dataclass(frozen=True)
class RowTable:
    """Each image's rows gathered: output row i of an image is its input row table[i] (rows_in rows an
    image), or zeros where table[i] is -1."""

    rows_in: int
    table: tuple[int, ...]

    def rows_after(self, rows: int) -> int:
        """Rows out for `rows` rows in (whole images of rows_in)."""
        if rows % self.rows_in:
            raise PluginError(f"{rows} rows are no whole number of images of {self.rows_in} rows")
        return rows // self.rows_in * len(self.table)

    def take(self, x: np.ndarray) -> np.ndarray:
        k = x.shape[-1]
        images = x.reshape(-1, self.rows_in, k)
        with_zero_row = np.concatenate([images, np.zeros((images.shape[0], 1, k), images.dtype)], axis=1)
        return with_zero_row[:, [self.rows_in if i < 0 else i for i in self.table]].reshape(-1, k)


class RowPrologue:
    """A LayerNorm (`epsilon`, `scale`, `bias`; None: none) and a RowTable (None: none) over A's (rows, k):
    `reference` on the host, `launch` on a GPU."""

    def __init__(self, k: int, norm: tuple[float, np.ndarray, np.ndarray] | None = None, rows: RowTable | None = None):
        self.k, self.rows = k, rows
        self.norm = None if norm is None else (float(norm[0]), np.asarray(norm[1], np.float32), np.asarray(norm[2], np.float32))
        # before the variant in kernel names: "matmul.ln*wg_3xtf32_b64x64x32_s3+gelu", "matmul.ln*rows*wg_3xtf32..."
        self.prefix = ("ln*" if norm is not None else "") + ("rows*" if rows is not None else "")
        self._device: tuple[Any, Any, Any] | None = None  # scale, bias, table on the device
        self._functions: dict[int, Any] = {}  # by the format the rows are written in (0: FP32, else HALF_OUT)

    def rows_after(self, rows: int) -> int:
        return rows if self.rows is None else self.rows.rows_after(rows)

    def reference(self, a: Any) -> np.ndarray:
        x = np.asarray(a, np.float32).reshape(-1, self.k)
        if self.norm is not None:
            epsilon, scale, bias = self.norm
            x = normalize(NormSpec(LAYER, (1, self.k), Rows.of((1, self.k), 1, 2), epsilon, channels=self.k), x, scale, bias)
        return x if self.rows is None else self.rows.take(x)

    def compile_job(self, arch: str, half: int = 0) -> CompileJob:
        """`half`: the rows written in FP16's (1) or BF16's (2) bits, as wg_fp16 and wg_bf16 read A; 0: FP32."""
        return cuda.module_job(SOURCE, {"NORMALISE": int(self.norm is not None)} | ({"HALF_OUT": half} if half else {}), arch)

    def load(self, half: int = 0) -> Any:
        """The CUDA function, compiled (or found in the cache) for this device; kept for the calls."""
        import cupy

        if half not in self._functions:
            self._functions[half] = cuda.load(self.compile_job(cuda.device_arch(), half)).get_function("row_prologue")
        if self._device is None:
            scale, bias = (cupy.asarray(v) for v in self.norm[1:]) if self.norm is not None else (None, None)
            table = cupy.asarray(np.asarray(self.rows.table, np.int32)) if self.rows is not None else None
            self._device = (scale, bias, table)
        return self._functions[half]

    def launch(self, cupy: Any, x: Any, small: Any, half: int = 0) -> Any:
        """A's rows as the product reads them, a new (rows out, k) array: FP32, or with `half` the bits of FP16
        (1) or BF16 (2) in uint16; with `small` (an FP32 array of that shape) their TF32 small parts written
        there too. x: C-contiguous (rows, k) float32, on the current stream."""
        function = self.load(half)
        rows = self.rows_after(int(x.shape[0]))
        a = cupy.empty((rows, self.k), dtype=cupy.uint16 if half else cupy.float32)
        if rows:
            scale, bias, table = self._device
            null = np.uint64(0)
            rows_in, rows_out = (self.rows.rows_in, len(self.rows.table)) if self.rows is not None else (0, 0)
            epsilon = self.norm[0] if self.norm is not None else 0.0
            function((-(-rows // ROWS_PER_BLOCK), 1, 1), (32 * ROWS_PER_BLOCK, 1, 1),
                     (x, null if table is None else table, np.int32(rows_in), np.int32(rows_out), null if scale is None else scale,
                      null if bias is None else bias, a, small if small is not None else null, np.int32(rows), np.int32(self.k),
                      np.float32(epsilon)))
        return a


def from_nodes(chain: Sequence[NodeInfo], k: int) -> RowPrologue | None:
    """The prologue `chain` makes for a product over `k`, or None: an optional LayerNormalization over the last
    axis of k values with constant scale and bias, then Reshapes, around one Gather along axis 1 of (images,
    rows, k) by constant indices where the chain has one (after a Pad of one zero row where it takes zeros)."""
    chain = list(chain)
    norm = None
    if chain and chain[0].op_type == "LayerNormalization":
        norm = _layernorm(chain.pop(0), k)
        if norm is None:
            return None
    if any(n.node.domain not in ("", "ai.onnx") for n in chain):
        return None
    gathers = [n for n in chain if n.op_type == "Gather"]
    pads = [n for n in chain if n.op_type == "Pad"]
    if len(gathers) > 1 or any(n.op_type not in (*RESHAPES, "Pad", "Gather") for n in chain):
        return None
    if pads and (len(pads) > 1 or not gathers or chain.index(pads[0]) + 1 != chain.index(gathers[0]) or not _one_zero_row(pads[0], k)):
        return None
    rows = _row_table(gathers[0], k, zero_row=bool(pads)) if gathers else None
    if (gathers and rows is None) or (norm is None and rows is None):
        return None
    return RowPrologue(k, norm, rows)


def _layernorm(node: NodeInfo, k: int) -> tuple[float, np.ndarray, np.ndarray] | None:
    if node.node.domain not in ("", "ai.onnx"):
        return None
    try:
        spec = NormSpec.from_node(node)
        scale, bias = affine(spec, node)
    except PluginError:
        return None
    if spec.first != len(spec.input_shape) - 1 or spec.rows.extent != k or spec.rows.inner != 1:
        return None
    return spec.epsilon, scale, bias


def _one_zero_row(pad: NodeInfo, k: int) -> bool:
    """A Pad of (images, rows, k) that adds one row of zeros after each image's rows, as row_gather.py writes it."""
    shape = tuple(pad.inputs[0].shape)
    pads = pad.constants.get(pad.inputs[1].name) if len(pad.inputs) > 1 and pad.inputs[1].name else pad.attributes.get("pads")
    value = pad.constants.get(pad.inputs[2].name) if len(pad.inputs) > 2 and pad.inputs[2].name else None
    mode = pad.attributes.get("mode", b"constant")
    return (len(shape) == 3 and shape[2] == k and pads is not None and [int(p) for p in np.asarray(pads).reshape(-1)] == [0, 0, 0, 0, 1, 0]
            and (mode.decode() if isinstance(mode, bytes) else mode) == "constant" and (value is None or not np.any(value)))


def _row_table(gather: NodeInfo, k: int, zero_row: bool = False) -> RowTable | None:
    """A Gather along axis 1 of (images, rows, k) by constant 1-D indices, as graph/passes/row_gather.py writes it;
    with `zero_row`, the data's last row of each image is the zero row a Pad added (its index becomes -1)."""
    shape = tuple(gather.inputs[0].shape)
    indices = gather.constants.get(gather.inputs[1].name) if len(gather.inputs) > 1 else None
    if len(shape) != 3 or shape[2] != k or int(gather.attributes.get("axis", 0)) != 1 or indices is None or np.ndim(indices) != 1:
        return None
    table = np.asarray(indices, np.int64)
    table = np.where(table < 0, table + shape[1], table)
    if not table.size or table.min() < 0 or table.max() >= shape[1]:
        return None
    rows_in = shape[1] - 1 if zero_row else shape[1]
    return RowTable(rows_in, tuple(-1 if i == rows_in else int(i) for i in table))
