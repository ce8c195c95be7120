// The bits of a float rounded to nearest (ties to even) in a two-byte format: FORMAT 1 FP16, 2 BF16 (the
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

#endif
