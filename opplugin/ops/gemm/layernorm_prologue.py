"""A LayerNormalization before a flat MatMul, applied by the MatMul's step to the rows of A on their way
into the product (a prologue, plan/prologue.py): a transformer's LN > Linear, where the LayerNorm's output
has no other reader.

On a GPU, kernels/layernorm_rows.cu normalises each row of A as the LayerNorm would, and for wg_3xtf32
writes each value's TF32 small part beside it: the pass that kernel makes over A before every product
anyway (gemm_small_parts), so the LayerNorm costs neither a step nor a pass of its own. On the CPU device
the reference normalises the rows as the LayerNormalization plugin's reference does.

Taken for a LayerNormalization over the last axis alone (the product's K), its scale and bias constants,
its Mean and InvStdDev outputs unused (reduction/spec.py reads the node).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...errors import PluginError
from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import NodeInfo
from ..reduction.reference import normalize
from ..reduction.rows import Rows
from ..reduction.spec import LAYER, NormSpec, affine

SOURCE = "layernorm_rows.cu"
ROWS_PER_BLOCK = 8  # a warp a row, blocks of 256


class LayerNormPrologue:
    """The LayerNorm a Gemm kernel applies to A's (rows, k) first: `reference` on the host, `launch` on a GPU."""

    prefix = "ln*"  # before the variant in kernel names: "matmul.ln*wg_3xtf32_b64x64x32_s3+gelu"

    def __init__(self, k: int, epsilon: float, scale: np.ndarray, bias: np.ndarray):
        self.k, self.epsilon = k, epsilon
        self.scale, self.bias = np.asarray(scale, np.float32), np.asarray(bias, np.float32)
        self._rows = NormSpec(LAYER, (1, k), Rows.of((1, k), 1, 2), epsilon, channels=k)  # A's rows as one normalised axis each
        self._device_constants: tuple[Any, Any] | None = None
        self._function = None

    def reference(self, a: Any) -> np.ndarray:
        x = np.asarray(a, np.float32)
        return normalize(self._rows, x.reshape(-1, self.k), self.scale, self.bias).reshape(x.shape)

    @staticmethod
    def compile_job(arch: str) -> CompileJob:
        return cuda.module_job(SOURCE, {}, arch)

    def load(self) -> Any:
        """The CUDA function, compiled (or found in the cache) for this device; kept for the calls."""
        import cupy

        if self._function is None:
            self._function = cuda.load(self.compile_job(cuda.device_arch())).get_function("layernorm_parts")
            self._device_constants = (cupy.asarray(self.scale), cupy.asarray(self.bias))
        return self._function

    def launch(self, cupy: Any, x: Any, small: Any) -> Any:
        """A's rows normalised, a new (rows, k) array; with `small` (an array of x's shape) its values' TF32
        small parts written there too. x: C-contiguous (rows, k) float32, on the current stream."""
        function = self.load()
        rows = int(x.shape[0])
        a = cupy.empty_like(x)
        if rows:
            scale, bias = self._device_constants
            function((-(-rows // ROWS_PER_BLOCK), 1, 1), (32 * ROWS_PER_BLOCK, 1, 1),
                     (x, scale, bias, a, small if small is not None else np.uint64(0), np.int32(rows), np.int32(self.k),
                      np.float32(self.epsilon)))
        return a


def from_nodes(chain: Sequence[NodeInfo], k: int) -> LayerNormPrologue | None:
    """The prologue `chain` makes for a product over `k`, or None: one LayerNormalization over the last
    axis, of k values, with constant scale and bias."""
    if len(chain) != 1 or chain[0].op_type != "LayerNormalization" or chain[0].node.domain not in ("", "ai.onnx"):
        return None
    node = chain[0]
    try:
        spec = NormSpec.from_node(node)
        scale, bias = affine(spec, node)
    except PluginError:
        return None
    if spec.first != len(spec.input_shape) - 1 or spec.rows.extent != k or spec.rows.inner != 1:
        return None
    return LayerNormPrologue(k, spec.epsilon, scale, bias)
