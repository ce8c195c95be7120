// The fused epilogue's arithmetic, shared by conv_const_rb and conv_const_tile.
// Needs ACT (0 none, 1 Relu, 2 Tanh).

__device__ __forceinline__ float activate(float v)
{
#if ACT == 1
    return v < 0.0f ? 0.0f : v;  // keeps NaN, as onnxruntime's Relu does
#elif ACT == 2
    return tanhf(v);
#else
    return v;
#endif
}

// max in which NaN wins (fmaxf would drop it): a NaN in a pool window reaches
// the output, where the runner sees it
__device__ __forceinline__ float max_keep_nan(float a, float b)
{
    return (a > b || a != a) ? a : b;
}
