"""ONNX Conv's semantics as one normalised shape record.

`ConvSpec` resolves every attribute default and `auto_pad` once, so the numpy
reference, the CUDA families and the cost model all read the same numbers.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...errors import PluginError
from ...registry import NodeInfo


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

    @functools.cached_property  # read on every kernel call: computed once per spec (frozen, so never stale)
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
        outputs = n * self.out_channels * math.prod(computed_size or self.out_size)
        per_output = 2 * (self.in_channels // self.group) * math.prod(self.kernel)
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
