"""ONNX Gemm's semantics as one normalised shape record: Y = alpha * A' B' + beta * C.

MatMul on 2-D operands is the same record with alpha = 1 and no C. The rows of
Y (M, the rows of A') are the batch; B' is the weight matrix, K x N.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import PluginError
from ...registry import NodeInfo

# How C reaches Y: not at all, one value per column (shapes (), (1,), (N,), (1, N): the
# usual bias), or per element ((M, 1), (M, N), broadcast to Y's shape at call time).
BIAS_NONE, BIAS_COLUMN, BIAS_FULL = "none", "column", "full"


@dataclass(frozen=True)
class GemmSpec:
    m: int  # rows of Y: the batch at plan time
    n: int  # columns of Y: outputs per row
    k: int  # the reduction
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    bias: str = BIAS_NONE
    bias_shape: tuple[int, ...] = ()

    def a_shape(self, batch: int | None = None) -> tuple[int, int]:
        m = self.m if batch is None else batch
        return (self.k, m) if self.trans_a else (m, self.k)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.n, self.k) if self.trans_b else (self.k, self.n)

    def output_shape(self, batch: int | None = None) -> tuple[int, int]:
        return (self.m if batch is None else batch, self.n)

    def flops(self, batch: int | None = None) -> int:
        """Multiply-adds as two FLOPs, plus one add per output for C."""
        m = self.m if batch is None else batch
        return 2 * m * self.n * self.k + (m * self.n if self.bias != BIAS_NONE else 0)

    def bytes_moved(self, batch: int | None = None) -> int:
        """Fewest bytes: A, B and C read once, Y written once (FP32)."""
        m = self.m if batch is None else batch
        c = {BIAS_NONE: 0, BIAS_COLUMN: self.n, BIAS_FULL: m * self.n}[self.bias]
        return 4 * (m * self.k + self.k * self.n + c + m * self.n)

    @classmethod
    def from_node(cls, node: NodeInfo) -> "GemmSpec":
        a, b = node.inputs[0], node.inputs[1]
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise PluginError(f"{node.op_type} {node.name}: only 2-D operands are implemented (A {list(a.shape)}, B {list(b.shape)})")
        attributes = node.attributes if node.op_type == "Gemm" else {}
        trans_a, trans_b = bool(attributes.get("transA", 0)), bool(attributes.get("transB", 0))
        m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
        kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
        if k != kb:
            raise PluginError(f"{node.op_type} {node.name}: A' is {m}x{k} but B' is {kb}x{n}")
        c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
        bias, bias_shape = BIAS_NONE, ()
        if c is not None:
            bias_shape = tuple(int(d) for d in c.shape)
            bias = bias_kind(bias_shape, m, n, f"{node.op_type} {node.name}")
        return cls(int(m), int(n), int(k), trans_a, trans_b, float(attributes.get("alpha", 1.0)),
                   float(attributes.get("beta", 1.0)), bias, bias_shape)


def bias_kind(shape: tuple[int, ...], m: int, n: int, where: str) -> str:
    """How a C of `shape` broadcasts to Y's (m, n), as ONNX's unidirectional broadcast allows."""
    padded = (1,) * (2 - len(shape)) + tuple(shape) if len(shape) <= 2 else None
    if padded is None or padded[1] not in (1, n) or padded[0] not in (1, m):
        raise PluginError(f"{where}: C of shape {list(shape)} does not broadcast to Y's [{m}, {n}]")
    return BIAS_COLUMN if padded[0] == 1 else BIAS_FULL
