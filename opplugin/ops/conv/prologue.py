"""What a Conv kernel may apply to each input value as it loads it (a prologue), so that a
pointwise step before the Conv needs no pass of its own:

- `scale`: x * s[n, c], a per-(image, channel) scale, the extra operand s of shape (N, C, 1, 1)
  (a squeeze-and-excitation block's Mul feeding the block's 1x1 projection);
- `affine`: f(a[c] * x + b[c]), a per-channel affine with the constants a, b and an activation f
  of ops/activation.py's table or none (an inference BatchNormalization, then a Relu: DenseNet's
  pre-activation).

The prologue applies to the values inside the image only: a padded position stays zero, as it
is in the Conv of the transformed tensor. This description drives both the numpy reference
(`apply`) and the CUDA code (`defines`, read by kernels/conv_implicit_tiles.cuh), as the
epilogue's does (epilogue.py). A plan fuses a pointwise step into its Conv this way only when
the Conv is its one reader (opplugin/plan/prologue.py); `from_nodes` reads the nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...registry import NodeInfo
from .. import activation

# where a fused step's kernel finds the scale operand s: after X, W, B and the residual (any may be empty)
PROLOGUE_INPUT = 4
SCALE, AFFINE = "scale", "affine"


@dataclass(frozen=True)
class Prologue:
    """`kind` SCALE (its operand s comes with the inputs) or AFFINE (a, b per input channel, held here
    as float32 values, and `activation`, None for none)."""

    kind: str
    a: tuple[float, ...] = ()
    b: tuple[float, ...] = ()
    activation: activation.Activation | None = None

    def __post_init__(self):
        if self.kind not in (SCALE, AFFINE):
            raise ValueError(f"unknown prologue kind {self.kind!r}")

    @property
    def takes_operand(self) -> bool:
        return self.kind == SCALE

    @property
    def prefix(self) -> str:
        """For kernel names, before the variant: "scale*", "bn_relu*" (an affine then a Relu), "bn*"."""
        if self.kind == SCALE:
            return "scale*"
        return "bn" + (self.activation.suffix.replace("+", "_") if self.activation else "") + "*"

    def defines(self) -> dict[str, int | str]:
        """The -D macros kernels/conv_implicit_tiles.cuh reads: PROLOGUE 1 (scale) or 2 (affine) and,
        for an affine with an activation, PROLOGUE_ACTIVATION(v)."""
        if self.kind == SCALE:
            return {"PROLOGUE": 1}
        expression = self.activation.cuda_expression() if self.activation else "(v)"
        return {"PROLOGUE": 2, "PROLOGUE_ACTIVATION(v)": expression}

    def constants(self) -> np.ndarray:
        """What an affine kernel reads through its prologue pointer: a then b, float32 (2C values)."""
        return np.asarray(self.a + self.b, dtype=np.float32)

    def apply(self, x: Any, scale: Any = None, xp: Any = np) -> Any:
        """The meaning on an (N, C, H, W) input, in its dtype; `scale` (N, C, 1, 1) for SCALE."""
        if self.kind == SCALE:
            if scale is None:
                raise ValueError("the prologue scale* needs its scale operand")
            return x * xp.asarray(scale, dtype=x.dtype)
        shape = (1, len(self.a), 1, 1)
        a = xp.asarray(np.asarray(self.a, np.float32).reshape(shape), dtype=x.dtype)
        b = xp.asarray(np.asarray(self.b, np.float32).reshape(shape), dtype=x.dtype)
        y = x * a + b
        return self.activation.apply(y, xp) if self.activation else y


def from_nodes(chain: Sequence[NodeInfo], data: str) -> Prologue | None:
    """The Prologue the nodes compute on the tensor `data` (the first node's input), in graph order,
    the last one's output being the Conv's X; None when no prologue kind fits them."""
    if len(chain) == 1 and chain[0].op_type == "Mul":
        return _scale(chain[0], data)
    if not chain or chain[0].op_type != "BatchNormalization" or len(chain) > 2:
        return None
    affine = _batch_norm(chain[0])
    if affine is None or len(chain) == 1:
        return affine
    act = activation.from_node(chain[1])
    return Prologue(AFFINE, affine.a, affine.b, act) if act is not None else None


def _scale(node: NodeInfo, data: str) -> Prologue | None:
    """A Mul of `data` (N, C, H, W) by a run-time float32 s of shape (N, C, 1, 1)."""
    names = list(node.node.input)
    if len(names) != 2 or data not in names or names[0] == names[1] or node.node.domain not in ("", "ai.onnx"):
        return None
    x, s = (node.inputs[names.index(data)], node.inputs[1 - names.index(data)])
    if s.name in node.constants or len(x.shape) != 4 or x.dtype != np.float32 or s.dtype != np.float32:
        return None
    n, c = x.shape[:2]
    if tuple(s.shape) != (n, c, 1, 1) or tuple(node.outputs[0].shape) != tuple(x.shape):
        return None
    return Prologue(SCALE)


def _batch_norm(node: NodeInfo) -> Prologue | None:
    """An inference BatchNormalization with constant parameters on a float32 (N, C, H, W) X:
    a = scale / sqrt(var + epsilon), b = B - mean * a, in float64 and then rounded to float32
    (as the pointwise plugin derives them)."""
    names = list(node.node.input)
    if int(node.attributes.get("training_mode", 0)) or len(names) != 5 or len([o for o in node.node.output if o]) != 1:
        return None
    if any(n not in node.constants for n in names[1:]) or len(node.inputs[0].shape) != 4 or node.inputs[0].dtype != np.float32:
        return None
    scale, bias, mean, var = (np.asarray(node.constants[n], np.float64).reshape(-1) for n in names[1:])
    channels = node.inputs[0].shape[1]
    if any(p.size != channels for p in (scale, bias, mean, var)):
        return None
    a = scale / np.sqrt(var + float(node.attributes.get("epsilon", 1e-5)))
    b = bias - mean * a
    as_floats = lambda v: tuple(float(f) for f in v.astype(np.float32))  # noqa: E731
    return Prologue(AFFINE, as_floats(a), as_floats(b))
