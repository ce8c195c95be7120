// What the depthwise and grouped half-precision Conv kernels (conv_depthwise_half.cu, conv_grouped_half.cu) share: the
// element type of each tensor by its link, runs of a pixel's values in a 16-bit format (HALF_OPERANDS 1 FP16, 2 BF16)
// loaded and stored whole, the loads of a thread's window, and a thread's VEC outputs of maps m0 .. m0 + VEC - 1 of one pixel finished into Y (and
// their residual operand read), channel-last in the format where linked, FP32 NCHW where not.
//
// Macros: HALF_OPERANDS, VEC, C, H, W, M, OH, OW, RESIDUAL, and X_CHANNEL_LAST, Y_CHANNEL_LAST, R_CHANNEL_LAST (each the format,
// where that tensor is linked).
#ifndef OPPLUGIN_HALF_RUNS_CUH
#define OPPLUGIN_HALF_RUNS_CUH

#include "half_bits.cuh"
#include "watch_flag.cuh"

// Each tensor's elements: the format's bits where the plan linked it channel-last, FP32 (NCHW) where not
#if defined(X_CHANNEL_LAST)
static_assert(X_CHANNEL_LAST == HALF_OPERANDS, "a linked X is in the kernel's format");
typedef unsigned short input_t;
#else
typedef float input_t;
#endif
#if defined(Y_CHANNEL_LAST)
static_assert(Y_CHANNEL_LAST == HALF_OPERANDS, "a linked Y is in the kernel's format");
typedef unsigned short output_t;
#else
typedef float output_t;
#endif
#if defined(R_CHANNEL_LAST)
static_assert(R_CHANNEL_LAST == HALF_OPERANDS, "a linked residual is in the kernel's format");
typedef unsigned short residual_t;
#else
typedef float residual_t;
#endif

// The N two-byte values at p (aligned to their size, or to 16 bytes past it) as floats (exact): 16-byte loads, or
// one load of 8 or 4 bytes
template <int N>
__device__ __forceinline__ void load_halves(const unsigned short* __restrict__ p, float (&v)[N])
{
    static_assert(N == 2 || N == 4 || N % 8 == 0, "whole 4-, 8- or 16-byte loads");
    unsigned int words[N / 2];
    if constexpr (N % 8 == 0) {
#pragma unroll
        for (int k = 0; k < N / 8; ++k) {
            const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p) + k);
            words[4 * k] = bits.x, words[4 * k + 1] = bits.y, words[4 * k + 2] = bits.z, words[4 * k + 3] = bits.w;
        }
    } else if constexpr (N == 4) {
        const uint2 bits = __ldg(reinterpret_cast<const uint2*>(p));
        words[0] = bits.x, words[1] = bits.y;
    } else {
        words[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    }
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
        v[2 * k] = half_value<HALF_OPERANDS>((unsigned short)(words[k] & 0xFFFF));
        v[2 * k + 1] = half_value<HALF_OPERANDS>((unsigned short)(words[k] >> 16));
    }
}

// VEC floats rounded to the format (to nearest, ties to even, two at a time) and stored as one run at p; false
// where one of them is an infinity or a NaN once rounded (a value past FP16's range is one now)
__device__ __forceinline__ bool store_run(unsigned short* p, const float (&v)[VEC])
{
    static_assert(VEC == 2 || VEC == 4 || VEC == 8, "a run of 4, 8 or 16 bytes");
    unsigned int words[VEC / 2];
    bool finite = true;
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) {
        words[k] = half_pair_bits<HALF_OPERANDS>(v[2 * k], v[2 * k + 1]);
        finite = finite && !half_pair_nonfinite<HALF_OPERANDS>(words[k]);
    }
#if VEC == 8
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
#elif VEC == 4
    *reinterpret_cast<uint2*>(p) = make_uint2(words[0], words[1]);
#else
    *reinterpret_cast<unsigned int*>(p) = words[0];
#endif
    return finite;
}

// Elements between an input pixel and the next one along its row, and the one below it: the steps of the offsets
// that every load of a thread's window adds to one corner pointer (constants: immediate offsets)
#ifdef X_CHANNEL_LAST
#define X_PIXEL C
#else
#define X_PIXEL 1
#endif
#define X_ROW (W * X_PIXEL)

// A thread's window corner: its first input pixel at channel c0 (maybe in the pads, never read there), to which each of
// its loads adds a constant. Held in registers: left to itself, the compiler remade the address from the kernel's
// parameter at each load (LDC, LEA, LEA.HI.X a load).
__device__ __forceinline__ const input_t* window_corner(const input_t* image, int ih0, int iw0, int c0)
{
#ifdef X_CHANNEL_LAST
    const input_t* window = image + ((ih0 * W + iw0) * C + c0);
#else
    const input_t* window = image + ((c0 * H + ih0) * W + iw0);
#endif
    asm("" : "+l"(window));
    return window;
}

// N channels (a thread's VEC of a depthwise Conv, a group's CG) at the input pixel `offset` elements past a thread's
// window corner (its first channel, where X is NCHW), as the format holds them; zeros outside the image (`inside`
// false: a pad)
template <int N>
__device__ __forceinline__ void load_pixel(const input_t* __restrict__ window, int offset, bool inside, float (&v)[N])
{
    if (!inside) {
#pragma unroll
        for (int q = 0; q < N; ++q) v[q] = 0.0f;
        return;
    }
#ifdef X_CHANNEL_LAST
    load_halves<N>(window + offset, v);
#else
#pragma unroll
    for (int q = 0; q < N; ++q) v[q] = half_value<HALF_OPERANDS>(half_bits<HALF_OPERANDS>(__ldg(window + offset + q * H * W)));
#endif
}

// The residual operand of maps m0 .. m0 + VEC - 1 at output pixel `pixel` (n * OH*OW + oh * OW + ow); zeros without RESIDUAL
__device__ __forceinline__ void load_residual(const residual_t* __restrict__ r, size_t pixel, int m0, float (&res)[VEC])
{
#if RESIDUAL && defined(R_CHANNEL_LAST)
    load_halves<VEC>(r + pixel * M + m0, res);
#elif RESIDUAL
    const size_t n = pixel / (OH * OW), p = pixel % (OH * OW);
#pragma unroll
    for (int q = 0; q < VEC; ++q) res[q] = __ldg(r + (n * M + m0 + q) * (OH * OW) + p);
#else
#pragma unroll
    for (int q = 0; q < VEC; ++q) res[q] = 0.0f;
#endif
}

// The finished outputs of maps m0 .. m0 + VEC - 1 at output pixel `pixel` into y, flagged if not finite as stored
__device__ __forceinline__ void store_outputs(output_t* __restrict__ y, size_t pixel, int m0, const float (&out)[VEC], unsigned char* nonfinite)
{
#ifdef Y_CHANNEL_LAST
    if (!store_run(y + pixel * M + m0, out) && nonfinite != nullptr) *nonfinite = 1;
#else
    const size_t n = pixel / (OH * OW), p = pixel % (OH * OW);
#pragma unroll
    for (int q = 0; q < VEC; ++q) {
        y[(n * M + m0 + q) * (OH * OW) + p] = out[q];
        flag_nonfinite(nonfinite, out[q]);
    }
#endif
}

#endif
