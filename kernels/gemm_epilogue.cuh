// What every Gemm family does to one accumulated dot product before storing it:
// alpha * acc + C (C already scaled by beta), then the activation.
// Needs N, HAS_ALPHA, ALPHA, BIAS (0 none, 1 one value per column, 2 one per element).
#include "activation.cuh"

__device__ __forceinline__ float gemm_output(float acc, const float* __restrict__ bias, int m, int n)
{
#if HAS_ALPHA
    acc *= ALPHA;
#endif
#if BIAS == 1
    acc = bias[n] + acc;
#elif BIAS == 2
    acc = bias[(size_t)m * N + n] + acc;
#endif
    return opplugin_activation(acc);
}

// four consecutive elements k..k+3 (k a multiple of 4) of row `row` of A (row length K):
// one float4 load when rows are 16-byte aligned (K % 4 == 0), two float2 loads when they
// are 8-byte aligned, else four loads; zero past the row's end
__device__ __forceinline__ float4 load_a4(const float* __restrict__ a, size_t row, int k)
{
#if K % 4 == 0
    return __ldg(reinterpret_cast<const float4*>(a + row * K + k));
#elif K % 2 == 0
    const float2* p = reinterpret_cast<const float2*>(a + row * K + k);
    const float2 lo = __ldg(p);
    const float2 hi = k + 2 < K ? __ldg(p + 1) : make_float2(0.0f, 0.0f);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
#else
    const float* p = a + row * K + k;
    return make_float4(__ldg(p), k + 1 < K ? __ldg(p + 1) : 0.0f, k + 2 < K ? __ldg(p + 2) : 0.0f, k + 3 < K ? __ldg(p + 3) : 0.0f);
#endif
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
