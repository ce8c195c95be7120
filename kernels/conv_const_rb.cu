// conv_const_rb: 2-D convolution (ONNX Conv), register blocked: each thread
// computes RT output rows x MO output maps of one output column, with filters
// and bias in __constant__ memory; optionally fused with the residual Add,
// activation and max pool that follow the Conv.
//
// Why it beats conv_const_mo: there, one input load feeds MO multiply-adds.
// Here a thread walks the input rows its RT outputs need once, in order; each
// value loaded from row i serves every output row r whose window covers i (up
// to min(RT, KH) of them) for all MO maps, so one load feeds up to
// RT x MO multiply-adds and the kernel becomes bound by FFMA issue rather
// than by load/store-unit traffic. Neighbouring threads of a warp take
// neighbouring columns, so every load and store instruction is coalesced.
// Everything is unrolled at compile time (all shapes are -D macros), so each
// weight is a literal offset into the constant bank and each accumulator a
// register.
//
// Fused epilogue (conv_epilogue.cuh: residual r, ACTIVATION, then a PKH x PKW
// max pool with stride = window, no pads): a thread max-reduces its PKH rows in
// registers and the PKW columns of a pool window live in PKW neighbouring lanes,
// combined with shuffles. With POOL_FIRST the bias and the activation are applied
// once per pooled value (both commute with max); otherwise each conv output is
// finished (bias, residual, activation) before the pool. Only the (pooled) map is
// stored; the residual is read where the output is written, by the same lanes.
//
// Same -D macros as conv_const_mo plus RT (rows per thread), G (group count)
// and the epilogue macros (RESIDUAL, POOL_FIRST, ACTIVATION), PKH, PKW, POH, POW.
// Launch: block (BLOCK), grid (ceil(batch*ROW_TILES*CW / BLOCK), ceil(M / MO));
// r is the residual operand ([batch][M][OH][OW]; null without RESIDUAL).

#define CG (C / G)   // input channels per group
#define MG (M / G)   // output maps per group
#define CH (POH * PKH)  // conv rows computed (all of OH without a pool)
#define CW (POW * PKW)  // conv columns computed
#define ROW_TILES ((CH + RT - 1) / RT)
#define IN_ROWS ((RT - 1) * SH + (KH - 1) * DH + 1)  // input rows one thread reads per channel
#define GROUPS ((M + MO - 1) / MO)
// rows of a tile may fall outside the image: with pads, or when RT does not divide CH
#define ROW_CHECK (PADDED || (CH % RT) != 0)

#include "conv_constant_bank.cuh"
#include "conv_epilogue.cuh"

// Maps FIRST .. FIRST+COUNT-1 of rows oh0 .. oh0+RT-1 at column ow.
template <int FIRST, int COUNT>
__device__ __forceinline__ void conv_tile(const float* __restrict__ image, const float* __restrict__ res,
                                          float* __restrict__ y, int n, int oh0, int ow, bool valid)
{
    constexpr int group = FIRST / MG;  // every map of a thread lies in one group
    const float* in = image + group * (CG * H * W);
    const int iw0 = ow * SW - PW;

    float acc[RT][COUNT];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < COUNT; ++j) acc[r][j] = 0.0f;

#pragma unroll UNROLL_C
    for (int c = 0; c < CG; ++c) {
#pragma unroll
        for (int i = 0; i < IN_ROWS; ++i) {
            const int ih = oh0 * SH - PH + i;
            // outside the image: a predicated load of 0 (the pad value), no branch
            const bool row_inside = !ROW_CHECK || (ih >= 0 && ih < H);
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = iw0 + kw * DW;
                const bool inside = row_inside && (!PADDED || (iw >= 0 && iw < W));
                const float v = inside ? in[(c * H + ih) * W + iw] : 0.0f;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    // output row r reads input row r*SH + kh*DH: does this one belong to it?
                    const int offset = i - r * SH;
                    if (offset < 0 || offset % DH != 0 || offset / DH >= KH) continue;
                    const int kh = offset / DH;
#pragma unroll
                    for (int j = 0; j < COUNT; ++j)
                        acc[r][j] += v * filters[((c * KH + kh) * KW + kw) * M + FIRST + j];
                }
            }
        }
    }

#if (PKH > 1 || PKW > 1) && !POOL_FIRST
    // finish every conv output before the pool; a row past CH (a partial tile) is never stored
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int row = oh0 + r < CH ? oh0 + r : CH - 1;
#pragma unroll
        for (int j = 0; j < COUNT; ++j)
            acc[r][j] = finish_output(with_bias(acc[r][j], FIRST + j), residual_at(res, (((size_t)n * M + FIRST + j) * OH + row) * OW + ow));
    }
#endif
#if PKH > 1 || PKW > 1
    // pool: rows within the thread, columns across PKW neighbouring lanes
#pragma unroll
    for (int pr = 0; pr < RT / PKH; ++pr) {
        const int prow = oh0 / PKH + pr;
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
            float v = acc[pr * PKH][j];
#pragma unroll
            for (int k = 1; k < PKH; ++k) v = max_keep_nan(v, acc[pr * PKH + k][j]);
#pragma unroll
            for (int s = 1; s < PKW; s <<= 1) v = max_keep_nan(v, __shfl_xor_sync(0xffffffffu, v, s));
#if POOL_FIRST
            v = opplugin_activation(with_bias(v, FIRST + j));
#endif
            if (valid && ow % PKW == 0 && prow < POH)
                y[(((size_t)n * M + FIRST + j) * POH + prow) * POW + ow / PKW] = v;
        }
    }
#else
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        if (!valid || ((CH % RT) != 0 && oh0 + r >= CH)) continue;
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
            const size_t at = (((size_t)n * M + FIRST + j) * OH + oh0 + r) * OW + ow;
            y[at] = finish_output(with_bias(acc[r][j], FIRST + j), residual_at(res, at));
        }
    }
#endif
}

#include "conv_map_groups.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_const_rb(const float* __restrict__ x, const float* __restrict__ r, float* __restrict__ y, int batch)
{
    // Threads past the end still run (clamped to the last tile) but store
    // nothing: every lane must take part in the pool's shuffles.
    const int total = batch * (ROW_TILES * CW);
    int t = blockIdx.x * BLOCK + threadIdx.x;  // over batch * ROW_TILES * CW, column fastest
    const bool valid = t < total;
    if (!valid) t = total - 1;
#if PKW == 1
    if (!valid) return;  // no shuffles without a horizontal pool
#endif
    const int n = t / (ROW_TILES * CW);
    const int oh0 = ((t / CW) % ROW_TILES) * RT;
    const int ow = t % CW;
    for_map_group<0>(blockIdx.y, x + (size_t)n * (C * H * W), r, y, n, oh0, ow, valid);
}
