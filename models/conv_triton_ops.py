"""A user's own 2-D Conv in Triton, for any model's Conv nodes (the standard ONNX op, not a custom one):

    opplugin check resnet50.onnx --ops models/conv_triton_ops.py

The kernel is an implicit GEMM in NCHW: each program computes a BLOCK_M x BLOCK_N tile of
output pixels (rows: image, y, x) by output channels (columns), reducing over the input channels
and filter taps of its group BLOCK_K at a time with tl.dot in 3xTF32, which keeps FP32 accuracy on
the tensor cores. Shapes and attributes arrive as plain integers named as a CUDA source's macros
(X_DIM1 is the input's channels, ATTR_STRIDES_0 the vertical stride). The float64 reference is
all the CPU needs, and what `check` holds every tile configuration to.
"""
import numpy as np

from opplugin.custom import CustomOp, Triton

conv = CustomOp("", "Conv", attributes={"auto_pad": "NOTSET", "dilations": [1, 1], "group": 1, "kernel_shape": None,
                                        "pads": [0, 0, 0, 0], "strides": [1, 1]})


@conv.reference
def conv_reference(x, w, b=None, auto_pad="NOTSET", dilations=(1, 1), group=1, kernel_shape=None, pads=(0, 0, 0, 0), strides=(1, 1)):
    if x.ndim != 4 or auto_pad != "NOTSET":
        raise ValueError("this Conv takes 2-D images with explicit pads only")
    top, left, bottom, right = pads
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    out_channels, per_group, taps_y, taps_x = w.shape
    reach_y, reach_x = dilations[0] * (taps_y - 1) + 1, dilations[1] * (taps_x - 1) + 1
    windows = np.lib.stride_tricks.sliding_window_view(padded, (reach_y, reach_x), axis=(2, 3))
    windows = windows[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]  # n, c, y, x, r, s
    groups = []
    for g in range(group):
        taken = windows[:, g * per_group:(g + 1) * per_group]
        filters = w[g * (out_channels // group):(g + 1) * (out_channels // group)]
        groups.append(np.einsum("ncyxrs,kcrs->nkyx", taken, filters, optimize=True))
    y = np.concatenate(groups, axis=1)
    return y if b is None else y + b[None, :, None, None]


try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton here: the reference serves
    triton = None

if triton is not None:
    @triton.autotune(configs=[triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=3),
                              triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4, num_stages=3),
                              triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}, num_warps=2, num_stages=2)],
                     key=["X_DIM1", "W_DIM0"])
    @triton.jit
    def conv_triton(x_ptr, w_ptr, b_ptr, y_ptr, batch, X_DIM1, X_DIM2, X_DIM3, W_DIM0, W_DIM1, W_DIM2, W_DIM3, Y_DIM2, Y_DIM3,
                    ATTR_STRIDES_0, ATTR_STRIDES_1, ATTR_PADS_0, ATTR_PADS_1, ATTR_DILATIONS_0, ATTR_DILATIONS_1, ATTR_GROUP,
                    HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        group = tl.program_id(2)
        pixels = Y_DIM2 * Y_DIM3
        channels_out = W_DIM0 // ATTR_GROUP  # of this group
        taps = W_DIM2 * W_DIM3
        depth = W_DIM1 * taps  # the reduction: the group's input channels by the filter's taps
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        image, pixel = rows // pixels, rows % pixels
        top = (pixel // Y_DIM3) * ATTR_STRIDES_0 - ATTR_PADS_0
        left = (pixel % Y_DIM3) * ATTR_STRIDES_1 - ATTR_PADS_1
        out_channel = group * channels_out + cols
        row_ok, col_ok = rows < batch * pixels, cols < channels_out
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, depth, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            channel, tap = k // taps, k % taps
            y = top[:, None] + (tap // W_DIM3)[None, :] * ATTR_DILATIONS_0
            x = left[:, None] + (tap % W_DIM3)[None, :] * ATTR_DILATIONS_1
            inside = row_ok[:, None] & (k < depth)[None, :] & (y >= 0) & (y < X_DIM2) & (x >= 0) & (x < X_DIM3)
            plane = image[:, None] * X_DIM1 + group * W_DIM1 + channel[None, :]
            a = tl.load(x_ptr + (plane * X_DIM2 + y) * X_DIM3 + x, mask=inside, other=0.0)
            b = tl.load(w_ptr + out_channel[None, :] * depth + k[:, None], mask=(k < depth)[:, None] & col_ok[None, :], other=0.0)
            total += tl.dot(a, b, input_precision="tf32x3")
        if HAS_B:
            total += tl.load(b_ptr + out_channel, mask=col_ok, other=0.0)[None, :]
        at = (image[:, None] * W_DIM0 + out_channel[None, :]) * pixels + pixel[:, None]
        tl.store(y_ptr + at, total, mask=row_ok[:, None] & col_ok[None, :])

    conv.implement(Triton(conv_triton, grid=lambda meta: (triton.cdiv(meta["batch"] * meta["Y_DIM2"] * meta["Y_DIM3"], meta["BLOCK_M"]),
                                                          triton.cdiv(meta["W_DIM0"] // meta["ATTR_GROUP"], meta["BLOCK_N"]),
                                                          meta["ATTR_GROUP"])))
