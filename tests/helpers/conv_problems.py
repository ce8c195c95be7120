"""Conv problems the CUDA family tests share: the cases, fresh random operands, the float64 expectation, device arrays, a poisoned output and the closeness check."""
from __future__ import annotations

import numpy as np
from opplugin.ops.conv import reference
from onnx_builders import conv_spec as conv
from opplugin.ops.conv.spec import ConvSpec
from opplugin.ops.conv.epilogue import NONE, Epilogue


MAX_RELATIVE_L2 = 1e-5


CASES = {
    "lenet86.conv1": conv(2, 1, 4, (86, 86), (7, 7)),
    "lenet86.conv2": conv(3, 4, 16, (40, 40), (7, 7)),
    "ece408_high.conv": conv(4, 1, 50, (28, 28), (5, 5)),
    "stride2_asym_pads_odd": conv(5, 3, 8, (17, 23), (3, 3), strides=(2, 2), pads=(1, 0, 2, 1)),
    "stride3_no_bias_batch33": conv(33, 2, 5, (15, 16), (3, 5), strides=(3, 2), pads=(0, 1, 1, 2), bias=False),
    "dilation2_m64": conv(4, 8, 64, (19, 21), (3, 3), pads=(1, 1, 1, 1), dilations=(2, 2)),
    "m1_mixed_no_bias": conv(7, 5, 1, (12, 9), (2, 4), strides=(1, 3), pads=(2, 0, 0, 3), dilations=(2, 1), bias=False),
    "kernel_as_big_as_image": conv(1, 6, 12, (9, 9), (9, 9), pads=(4, 4, 4, 4)),
    "pointwise": conv(3, 7, 3, (5, 5), (1, 1)),
    "group2_stride2": conv(3, 6, 4, (11, 13), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=2),
    "depthwise_dilation2": conv(2, 8, 8, (14, 15), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=8),
    # a depth multiplier of 3, stride 2 and asymmetric pads; groups of 4 and 16 maps (ResNeXt, RegNet)
    "depthwise_x3_stride2_5x5": conv(3, 6, 18, (13, 17), (5, 5), strides=(2, 2), pads=(2, 1, 1, 2), group=6),
    "group8_width4": conv(2, 32, 32, (10, 9), (3, 3), pads=(1, 1, 1, 1), group=8),
    "group3_width16_stride2": conv(2, 48, 48, (15, 15), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=3),
    # the tensor-core GEMM's paths: 16-byte weight rows (K % 4 == 0) and pixel groups (1x1, P % 4 == 0),
    # a K that ends inside a slice, maps and pixels that end inside a tile, and split K
    "pointwise_vectors_k16": conv(3, 16, 40, (8, 12), (1, 1)),
    "k333_m70_tile_tails": conv(2, 37, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)),
    "deep_k_small_output": conv(1, 160, 96, (7, 7), (3, 3), pads=(1, 1, 1, 1)),
    # groups of 32 channels (wg_3xtf32): maps and pixels that end inside a tile, odd pads, dilation, groups
    "c32_stride2_odd_pads_m70": conv(3, 32, 70, (17, 23), (3, 3), strides=(2, 2), pads=(1, 0, 2, 1)),
    "c64_group2_dilation2": conv(2, 64, 40, (13, 11), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=2),
    "c64_pointwise_odd_pixels": conv(3, 64, 48, (7, 9), (1, 1)),
    # a window past 3x3, whose taps wg_3xtf32's copies test one by one (and past tc_3xtf32's bit a tap), odd pads
    "c32_11x11_stride2_odd_pads_m70": conv(2, 32, 70, (17, 19), (11, 11), strides=(2, 1), pads=(5, 4, 3, 5)),
}


def random_problem(spec: ConvSpec):
    """(seed, x, w, b) drawn fresh from numpy's default_rng; float32, never all zeros."""
    seed = np.random.SeedSequence().entropy
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape(), dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    b = rng.standard_normal(spec.out_channels, dtype=np.float32) if spec.has_bias else None
    return seed, x, w, b


def expected_output(spec: ConvSpec, x, w, b, epilogue: Epilogue = NONE) -> np.ndarray:
    """The float64 oracle's answer."""
    return reference.expected(spec, epilogue, x, w, b)


def device_inputs(x, w, b) -> list:
    import cupy

    return [cupy.asarray(a) for a in (x, w, b) if a is not None]


def poisoned_output(spec: ConvSpec, batch: int | None = None):
    import cupy

    return cupy.full(spec.output_shape(batch), cupy.nan, dtype=cupy.float32)


def assert_close(got, expected: np.ndarray, context: str) -> None:
    import cupy

    got = cupy.asnumpy(got)
    unwritten = int(np.isnan(got).sum())
    assert unwritten == 0, f"{context}: {unwritten} of {got.size} output elements were never written"
    error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert error <= MAX_RELATIVE_L2, f"{context}: relative L2 error {error:.3g} > {MAX_RELATIVE_L2}"
