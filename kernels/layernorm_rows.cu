// layernorm_parts: a LayerNormalization over the last axis applied to A's rows on their way into a GEMM
// (ops/gemm/layernorm_prologue.py), so that a LayerNorm whose output only that GEMM reads needs no
// step of its own. With `small` given (wg_3xtf32), each normalised value's TF32 small part is written
// beside it: the pass gemm_small_parts would otherwise make over the LayerNorm's output, made here
// from its input.
//
// Arithmetic as kernels/reduce.cu normalises, in FP32: two passes (the mean, then the mean of the
// squared deviations), inv = 1 / sqrtf(variance + epsilon), (x - mean) * inv * scale + bias.
// x, a and small are rows x k, C-contiguous; scale and bias k floats. Launch: block 256 (a warp a
// row), grid ceil(rows / 8).
#include "tf32_small_part.cuh"

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int step = 16; step > 0; step /= 2) v += __shfl_xor_sync(0xffffffffu, v, step);
    return v;
}

extern "C" __global__ void __launch_bounds__(256)
layernorm_parts(const float* __restrict__ x, const float* __restrict__ scale, const float* __restrict__ bias, float* __restrict__ a,
                float* __restrict__ small, int rows, int k, float epsilon)
{
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;  // a whole warp: the shuffles below see every lane
    const float* in = x + row * k;
    float sum = 0.0f;
    for (int i = lane; i < k; i += 32) sum += in[i];
    const float mean = warp_sum(sum) / (float)k;
    float squares = 0.0f;
    for (int i = lane; i < k; i += 32) {
        const float d = in[i] - mean;
        squares += d * d;
    }
    const float inv = 1.0f / sqrtf(warp_sum(squares) / (float)k + epsilon);
    float* out = a + row * k;
    for (int i = lane; i < k; i += 32) {
        const float v = (in[i] - mean) * inv * __ldg(scale + i) + __ldg(bias + i);
        out[i] = v;
        if (small != nullptr) small[row * k + i] = small_part(v);
    }
}
