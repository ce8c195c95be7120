// Resize of the two innermost axes (IH x IW -> OH x OW) over any number of leading planes:
// nearest (NEAREST_MODE 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil) or
// bilinear (LINEAR 1), with ONNX's coordinate transformation COORDINATES (0 asymmetric,
// 1 half_pixel, 2 pytorch_half_pixel, 3 align_corners) and the scales SCALE_H, SCALE_W.
// Coordinates are computed in float, as onnxruntime does. The output is C-contiguous.

__device__ __forceinline__ float source_coordinate(int x, float scale, int extent, int size)
{
#if COORDINATES == 0
    return x / scale;
#elif COORDINATES == 3
    return size == 1 ? 0.0f : x * (float)(extent - 1) / (float)(size - 1);
#else
    if (COORDINATES == 2 && size == 1) return 0.0f;
    return (x + 0.5f) / scale - 0.5f;
#endif
}

__device__ __forceinline__ int nearest(float x, int extent)
{
    const bool tie = x == floorf(x) + 0.5f;
#if NEAREST_MODE == 0
    float r = tie ? floorf(x) : roundf(x);
#elif NEAREST_MODE == 1
    float r = tie ? ceilf(x) : roundf(x);
#elif NEAREST_MODE == 2
    float r = floorf(x);
#else
    float r = ceilf(x);
#endif
    return (int)fminf(fmaxf(r, 0.0f), (float)(extent - 1));
}

extern "C" __global__ void __launch_bounds__(256) layout_resize(const float* __restrict__ in, float* __restrict__ out, long long total)
{
    const long long i = blockIdx.x * 256LL + threadIdx.x;
    if (i >= total) return;
    const int ox = (int)(i % OW), oy = (int)((i / OW) % OH);
    const float* plane = in + (i / ((long long)OW * OH)) * ((long long)IW * IH);
    const float sy = source_coordinate(oy, SCALE_H, IH, OH), sx = source_coordinate(ox, SCALE_W, IW, OW);
#if LINEAR
    const float y = fminf(fmaxf(sy, 0.0f), (float)(IH - 1)), x = fminf(fmaxf(sx, 0.0f), (float)(IW - 1));
    const int y0 = (int)y, x0 = (int)x;
    const int y1 = min(y0 + 1, IH - 1), x1 = min(x0 + 1, IW - 1);
    const float wy = y - y0, wx = x - x0;
    const float top = __ldg(plane + y0 * IW + x0) * (1.0f - wx) + __ldg(plane + y0 * IW + x1) * wx;
    const float bottom = __ldg(plane + y1 * IW + x0) * (1.0f - wx) + __ldg(plane + y1 * IW + x1) * wx;
    out[i] = top * (1.0f - wy) + bottom * wy;
#else
    out[i] = __ldg(plane + nearest(sy, IH) * IW + nearest(sx, IW));
#endif
}
