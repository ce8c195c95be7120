// An activation applied to a kernel's output, whatever the op. The meaning
// arrives as the function-like macro ACTIVATION(v), an expression written by
// opplugin/ops/activation.py (its table gives each activation's numpy meaning
// and this CUDA expression side by side); without it the activation is the
// identity. The helpers below are what those expressions call.

// lo <= v <= hi by comparisons, so that a NaN compares false and stays NaN
// (fminf/fmaxf would replace it by a bound; onnxruntime's Clip keeps it)
__device__ __forceinline__ float opplugin_clamp(float v, float lo, float hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

// 1 / (1 + e^-v): exactly 0 and 1 at -inf and +inf, NaN for NaN. __fdividef skips the IEEE
// division's slow-path subroutine, whose call made ptxas spill in the Conv kernels' unrolled
// epilogues (const_rb, 32 outputs a thread); it is within 2 ulp for every divisor up to 2^126
// and gives 0 beyond (v below -87, where the exact value is under 1.2e-38).
__device__ __forceinline__ float opplugin_sigmoid(float v)
{
    return __fdividef(1.0f, 1.0f + expf(-v));
}

// Gelu as its formula: 0.5 v (1 + erf(v / sqrt 2)), or with tanh_form the tanh approximation
__device__ __forceinline__ float opplugin_gelu(float v, float tanh_form)
{
    if (tanh_form != 0.0f)
        return 0.5f * v * (1.0f + tanhf(0x1.988454p-1f * (v + 0.044715f * v * v * v)));
    return 0.5f * v * (1.0f + erff(v * 0x1.6a09e6p-1f));
}

#ifndef ACTIVATION
#define ACTIVATION(v) (v)
#endif

__device__ __forceinline__ float opplugin_activation(float v)
{
    return ACTIVATION(v);
}
