// What every Gemm family does to one accumulated dot product before storing it:
// alpha * acc + C (C already scaled by beta), then the activation; with RESIDUAL, a
// tensor of Y's shape added last (store_output_pair's `residual`).
// Needs N, HAS_ALPHA, ALPHA, BIAS (0 none, 1 one value per column, 2 one per element).
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#include "activation.cuh"
#include "watch_flag.cuh"

// alpha * acc + the bias value C holds for this output (read by the caller; ignored without BIAS), then the activation
__device__ __forceinline__ float gemm_finish(float acc, float bias_value)
{
#if HAS_ALPHA
    acc *= ALPHA;
#endif
#if BIAS
    acc = bias_value + acc;
#endif
    return opplugin_activation(acc);
}

__device__ __forceinline__ float gemm_output(float acc, const float* __restrict__ bias, int m, int n)
{
#if BIAS == 1
    return gemm_finish(acc, bias[n]);
#elif BIAS == 2
    return gemm_finish(acc, bias[(size_t)m * N + n]);
#else
    return gemm_finish(acc, 0.0f);
#endif
}

// Y[m][n] and Y[m][n + 1] (n even, as an MMA tile's lanes hold them) from their finished values, the residual
// added: one 8-byte store when N is even, else each while it lies inside Y; flagged if not finite (watch_flag.cuh)
__device__ __forceinline__ void store_pair(float* __restrict__ y, unsigned char* nonfinite, int m, int n, float out0, float out1,
                                           const float* __restrict__ residual)
{
#if N % 2 == 0
    if (n < N) {
        float2 out = make_float2(out0, out1);
#if RESIDUAL
        const float2 added = *reinterpret_cast<const float2*>(residual + (size_t)m * N + n);
        out.x += added.x;
        out.y += added.y;
#endif
        *reinterpret_cast<float2*>(y + (size_t)m * N + n) = out;
        flag_nonfinite2(nonfinite, out);
    }
#else
    const float outs[2] = {out0, out1};
#pragma unroll
    for (int q = 0; q < 2; ++q) {
        if (n + q < N) {
            float out = outs[q];
#if RESIDUAL
            out += residual[(size_t)m * N + n + q];
#endif
            y[(size_t)m * N + n + q] = out;
            flag_nonfinite(nonfinite, out);
        }
    }
#endif
}

// Y[m][n] and Y[m][n + 1] from their sums, the epilogue applied (store_pair: how they are stored)
__device__ __forceinline__ void store_output_pair(float* __restrict__ y, const float* __restrict__ bias, unsigned char* nonfinite,
                                                  int m, int n, float sum0, float sum1, const float* __restrict__ residual = nullptr)
{
    if (n >= N) return;
    store_pair(y, nonfinite, m, n, gemm_output(sum0, bias, m, n), n + 1 < N ? gemm_output(sum1, bias, m, n + 1) : 0.0f, residual);
}

// Y[m][n] and Y[m][n + 1] as summed, for a K split's partial sums (gemm_split_reduce finishes them)
__device__ __forceinline__ void store_sum_pair(float* __restrict__ y, int m, int n, float sum0, float sum1)
{
#if N % 2 == 0
    if (n < N) *reinterpret_cast<float2*>(y + (size_t)m * N + n) = make_float2(sum0, sum1);
#else
    if (n < N) y[(size_t)m * N + n] = sum0;
    if (n + 1 < N) y[(size_t)m * N + n + 1] = sum1;
#endif
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
