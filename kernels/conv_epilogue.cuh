// The fused epilogue of the Conv families (conv_const_rb, conv_const_tile, conv_tc_gemm),
// as opplugin/ops/conv/epilogue.py describes it: conv + bias, plus the residual operand r
// (RESIDUAL 1: r has the conv output's shape and NCHW layout), then ACTIVATION(v) (the
// shared table's expression, see activation.cuh), then the PKH x PKW max pool.
// POOL_FIRST 1 (a pool, no residual, a nondecreasing activation) lets a kernel pool the
// raw sums and add the bias and activate once per pooled value; otherwise every conv
// output is finished (finish_output) before it is pooled.
#include "activation.cuh"
#include "watch_flag.cuh"

#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef POOL_FIRST
#define POOL_FIRST 0
#endif

// the residual operand at NCHW index i (never read without RESIDUAL)
__device__ __forceinline__ float residual_at(const float* __restrict__ r, size_t i)
{
#if RESIDUAL
    return __ldg(r + i);
#else
    return 0.0f;
#endif
}

// two and four neighbours, for the kernels that store rows as float2 / float4 (i aligned to them)
__device__ __forceinline__ float2 residual2_at(const float* __restrict__ r, size_t i)
{
#if RESIDUAL
    return __ldg(reinterpret_cast<const float2*>(r + i));
#else
    return make_float2(0.0f, 0.0f);
#endif
}

__device__ __forceinline__ float4 residual4_at(const float* __restrict__ r, size_t i)
{
#if RESIDUAL
    return __ldg(reinterpret_cast<const float4*>(r + i));
#else
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#endif
}

// one conv output (bias included) with the residual `res` added (when there is one), activated
__device__ __forceinline__ float finish_output(float v, float res)
{
#if RESIDUAL
    v += res;  // ONNX's order: (conv + bias) + residual, NaN and Inf carried
#endif
    return opplugin_activation(v);
}

// max in which NaN wins (fmaxf would drop it): a NaN in a pool window reaches
// the output, where the runner sees it
__device__ __forceinline__ float max_keep_nan(float a, float b)
{
    return (a > b || a != a) ? a : b;
}
