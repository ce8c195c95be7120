"""Hypothesis strategies for 2-D Conv configurations, shared by the CPU and GPU Conv tests.

The ranges are issue 4's: kernel 1-7 per axis, stride 1-3, dilation 1-3, pads
0..k-1 per side drawn independently (so begin != end is common), dense, grouped
and depthwise convolutions (group == in_channels, out = k * in), 1-64 input and
output channels, any spatial size the output needs (odd ones included), batch
1-64, with and without bias. A work budget keeps each example cheap to check:
the batch is drawn last and capped so the multiply-adds stay under it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from opplugin.ops.conv.spec import ConvSpec

MAX_CHANNELS = 64
MAX_BATCH = 64
MAX_KERNEL = 7
MAX_STRIDE = 3
MAX_DILATION = 3
# output rows/columns: keeps images small, so the budget leaves room for large
# batches and channel counts
MAX_OUT_SIZE = 15
# multiply-adds per example: float64 reference, onnxruntime and the GPU stay fast
WORK_BUDGET = 1 << 24


@dataclass(frozen=True)
class ConvConfig:
    """One Conv as ONNX writes it: input and weight shapes, attributes, bias or not."""

    x_shape: tuple[int, int, int, int]
    w_shape: tuple[int, int, int, int]
    attributes: dict[str, Any]
    bias: bool

    @property
    def spec(self) -> ConvSpec:
        return ConvSpec.from_shapes(self.x_shape, self.w_shape, self.attributes, has_bias=self.bias)

    def random_arrays(self, rng: np.random.Generator):
        """(x, w, b) standard-normal float32; b is None without bias."""
        x = rng.standard_normal(self.x_shape, dtype=np.float32)
        w = rng.standard_normal(self.w_shape, dtype=np.float32)
        b = rng.standard_normal(self.w_shape[0], dtype=np.float32) if self.bias else None
        return x, w, b

    def __str__(self) -> str:
        s = self.spec
        return (
            f"x{list(self.x_shape)} w{list(self.w_shape)} stride{list(s.strides)} pads{list(s.pads)} "
            f"dil{list(s.dilations)} group {s.group}{' +bias' if self.bias else ''}"
            + (f" auto_pad {self.attributes['auto_pad']}" if "auto_pad" in self.attributes else "")
        )


def macs(spec: ConvSpec) -> int:
    """Multiply-adds of the whole batch."""
    return spec.batch * spec.out_channels * int(np.prod(spec.out_size)) * (spec.in_channels // spec.group) * int(np.prod(spec.kernel))


LAYOUTS = ("dense", "grouped", "depthwise")


def layout_of(spec: ConvSpec) -> str:
    if spec.group == 1:
        return "dense"
    return "depthwise" if spec.in_channels == spec.group else "grouped"


@st.composite
def channel_layouts(draw, layouts=("dense", "dense", "grouped", "depthwise")) -> tuple[int, int, int]:
    """(in_channels, out_channels, group) of one of `layouts`, all within 1..64.
    Depthwise has group == in_channels >= 2 and out = k * in; grouped has 2..32
    groups of at least 2 input channels."""
    kind = draw(st.sampled_from(layouts))
    if kind == "dense":
        return draw(st.integers(1, MAX_CHANNELS)), draw(st.integers(1, MAX_CHANNELS)), 1
    if kind == "depthwise":
        c = draw(st.integers(2, MAX_CHANNELS))
        return c, c * draw(st.integers(1, MAX_CHANNELS // c)), c
    group = draw(st.integers(2, MAX_CHANNELS // 2))
    per_group = MAX_CHANNELS // group
    # at least 2 input channels a group: one would be depthwise
    return group * draw(st.integers(2, per_group)), group * draw(st.integers(1, per_group)), group


@st.composite
def conv_configs(draw, auto_pad: bool = False, layouts=None, max_batch: int = MAX_BATCH, work_budget: int = WORK_BUDGET) -> ConvConfig:
    """A ConvConfig in the issue's ranges; `layouts` narrows the channel layouts
    (default: half dense, a quarter each grouped and depthwise). With auto_pad,
    some examples say VALID / SAME_UPPER / SAME_LOWER instead of explicit pads."""
    c, m, group = draw(channel_layouts(layouts) if layouts else channel_layouts())
    kernel = [draw(st.integers(1, MAX_KERNEL)) for _ in range(2)]
    strides = [draw(st.integers(1, MAX_STRIDE)) for _ in range(2)]
    dilations = [draw(st.integers(1, MAX_DILATION)) for _ in range(2)]
    begin = [draw(st.integers(0, k - 1)) for k in kernel]
    end = [draw(st.integers(0, k - 1)) for k in kernel]
    span = [d * (k - 1) + 1 for d, k in zip(dilations, kernel)]
    # draw the output size within the budget, then an input size that gives it
    # (plus up to stride-1 rows the last window does not reach)
    per_pixel = m * (c // group) * kernel[0] * kernel[1]
    pixels = max(1, work_budget // per_pixel)
    out_h = draw(st.integers(1, min(MAX_OUT_SIZE, pixels)))
    out_w = draw(st.integers(1, min(MAX_OUT_SIZE, max(1, pixels // out_h))))
    size = [
        max(1, (out - 1) * strides[i] + span[i] - begin[i] - end[i] + draw(st.integers(0, strides[i] - 1)))
        for i, out in enumerate((out_h, out_w))
    ]
    bias = draw(st.booleans())
    attributes: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    mode = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"])) if auto_pad else "NOTSET"
    if mode == "VALID" and any(size[i] < span[i] for i in range(2)):
        mode = "SAME_UPPER"
    if mode == "NOTSET":
        attributes["pads"] = begin + end
    else:
        attributes["auto_pad"] = mode
        if mode != "VALID":
            attributes["dilations"] = [1, 1]  # onnxruntime refuses dilation with SAME_*
    w_shape = (m, c // group, *kernel)
    one_image = ConvConfig((1, c, *size), w_shape, attributes, bias)
    batch = draw(st.integers(1, max(1, min(max_batch, work_budget // max(1, macs(one_image.spec))))))
    return ConvConfig((batch, c, *size), w_shape, attributes, bias)


# ---- real-model shapes: most have filters past the 64 KiB of __constant__ memory ----


def _real(batch, c, m, size, kernel, stride=1, pad=0, group=1, bias=True) -> ConvConfig:
    attributes = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": [pad] * 4, "group": group}
    return ConvConfig((batch, c, size, size), (m, c // group, kernel, kernel), attributes, bias)


REAL_MODEL_CONFIGS = {
    "resnet18.layer1 64->64 3x3 56x56": _real(2, 64, 64, 56, 3, pad=1, bias=False),  # 147 KiB of filters
    "resnet18.layer2 128->128 3x3 28x28": _real(1, 128, 128, 28, 3, pad=1),  # 576 KiB
    "resnet18.layer3 256->256 3x3 14x14": _real(1, 256, 256, 14, 3, pad=1),  # 2.25 MiB
    "256->256 3x3 stride 2 14x14": _real(3, 256, 256, 14, 3, stride=2, pad=1, bias=False),
    "resnet50 bottleneck 1x1 512->2048 7x7": _real(2, 512, 2048, 7, 1),  # 4 MiB
    "efficientnet-b0 depthwise 5x5 on 1152 7x7": _real(4, 1152, 1152, 7, 5, pad=2, group=1152),  # 117 KiB with bias
    # MobileNet-v1's widest depthwise 3x3 (512 maps) needs only 20 KiB: it fits, and stays as a real shape
    "mobilenet-v1 depthwise 3x3 on 512 14x14": _real(4, 512, 512, 14, 3, pad=1, group=512),
}


def exceeds_constant_memory(config: ConvConfig) -> bool:
    from opplugin.ops.conv.families import CONSTANT_MEMORY_BYTES, constant_bytes

    return constant_bytes(config.spec) > CONSTANT_MEMORY_BYTES


# ---- comparing two FP32 computations of one Conv ----

FP32_EPS = float(np.finfo(np.float32).eps)
# Rounding error of an FP32 sum of K terms grows with the partial sums, which are
# bounded by the sum of |terms|; 16 eps of that sum is a worst-case bound for
# K <= 16 and, for random signs, dozens of standard deviations for any K. A
# missing or doubled tap (about |x w| = sum/K) or bias stays far outside it.
ERROR_BOUND_EPS = 16


def error_bound(spec: ConvSpec, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Per output element: how far two correct FP32 results may lie apart, from
    the float64 sum of absolute terms |x| * |w| (+ |b|)."""
    from opplugin.ops.conv.reference import conv

    magnitude = conv(
        np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), None if b is None else np.abs(b.astype(np.float64)),
        spec.strides, spec.pads, spec.dilations, spec.group,
    )
    return ERROR_BOUND_EPS * FP32_EPS * magnitude


def assert_within_bound(got: np.ndarray, expected: np.ndarray, bound: np.ndarray, context: str) -> None:
    """Every element of `got` written (no NaN left from poisoning) and within `bound` of `expected`."""
    assert got.shape == expected.shape, f"{context}: shape {got.shape}, expected {expected.shape}"
    unwritten = int(np.isnan(got).sum())
    assert unwritten == 0, f"{context}: {unwritten} of {got.size} output elements are NaN (never written?)"
    excess = np.abs(got.astype(np.float64) - expected) - bound
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[worst] <= 0, (
        f"{context}: {int((excess > 0).sum())} of {got.size} elements off; worst at {tuple(map(int, worst))}: "
        f"got {got[worst]!r}, expected {expected[worst]!r}, bound {bound[worst]:.3g}"
    )
