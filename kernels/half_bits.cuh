// The bits of a float rounded to nearest (ties to even) in a two-byte format, and back: FORMAT 1 FP16, 2 BF16 (the
// numbering of gemm_wgmma's HALF_OPERANDS). What the half-precision GEMMs read A in, written by gemm_to_half
// or by the row prologue that makes A's rows.
#ifndef OPPLUGIN_HALF_BITS_CUH
#define OPPLUGIN_HALF_BITS_CUH

template <int FORMAT>
__device__ __forceinline__ unsigned short half_bits(float v)
{
    static_assert(FORMAT == 1 || FORMAT == 2, "1: FP16, 2: BF16");
    unsigned short bits;
    if (FORMAT == 2)
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(v));
    else
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(v));
    return bits;
}

// The float a two-byte value of the format holds (exact: both formats are floats' subsets)
template <int FORMAT>
__device__ __forceinline__ float half_value(unsigned short bits)
{
    static_assert(FORMAT == 1 || FORMAT == 2, "1: FP16, 2: BF16");
    if (FORMAT == 2)
        return __uint_as_float((unsigned int)bits << 16);
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(bits));
    return v;
}

// Two floats rounded to nearest (ties to even) in the format and packed as a pair: `lower` in the low 16 bits,
// as ldmatrix and stmatrix hold a row's two neighbouring values
template <int FORMAT>
__device__ __forceinline__ unsigned int half_pair_bits(float lower, float upper)
{
    static_assert(FORMAT == 1 || FORMAT == 2, "1: FP16, 2: BF16");
    unsigned int bits;
    if (FORMAT == 2)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(upper), "f"(lower));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(upper), "f"(lower));
    return bits;
}

// Whether either value of a pair is an infinity or a NaN (its exponent's bits all ones)
template <int FORMAT>
__device__ __forceinline__ bool half_pair_nonfinite(unsigned int bits)
{
    constexpr unsigned int EXPONENT = FORMAT == 2 ? 0x7F80u : 0x7C00u;
    return (bits & EXPONENT) == EXPONENT || (bits >> 16 & EXPONENT) == EXPONENT;
}

#endif
