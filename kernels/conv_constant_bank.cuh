// The __constant__ filter bank and bias of the register-tiled families (conv_const_rb,
// conv_const_tile), uploaded once per node at build time. Needs CG, KH, KW, M, HAS_BIAS.
__constant__ float filters[CG * KH * KW * M];  // [c][kh][kw][m]
#if HAS_BIAS
__constant__ float bias[M];
#endif

// v plus the bias of `map`; v itself without a bias (no + 0.0f for the compiler to keep)
__device__ __forceinline__ float with_bias(float v, int map)
{
#if HAS_BIAS
    return v + bias[map];
#else
    return v;
#endif
}
