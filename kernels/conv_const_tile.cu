// conv_const_tile: 2-D convolution (ONNX Conv), register tiled in two
// dimensions: each thread computes RT output rows x XT output columns x MO
// output maps, filters and bias in __constant__ memory; optionally fused with
// the residual Add, activation and max pool that follow the Conv.
//
// Why it beats conv_const_rb when the channel loop stays rolled (lenet86
// conv2): a weight indexed by a run-time channel is not an immediate operand
// of the FFMA, so it costs a constant load. conv_const_rb uses each loaded
// weight for RT outputs only, and ncu shows half of its issue slots going to
// those loads. Here each weight serves RT x XT outputs, and each input row
// segment (XT + KW - 1 values) loaded per filter row serves KW x MO taps, so
// FFMAs dominate the instruction stream. The filter-row loop can stay rolled
// as well (UNROLL_KH), which keeps the loop body at RT x XT x MO x KW FFMAs:
// small enough for the instruction cache, unlike a fully unrolled filter.
//
// Fused epilogue (conv_epilogue.cuh: residual r, ACTIVATION, then a PKH x PKW
// max pool with stride = window, no pads): a tile covering whole pool windows (RT % PKH == 0, XT % PKW == 0) pools in
// registers. A window larger than the tile (PKH % RT == 0, PKW % XT == 0) is
// split over SUBH x SUBW neighbouring lanes, which pool their parts and then
// combine them with shuffles: the tile stays the one that is fastest without
// a pool (lenet86 conv2: 2 x 2 x 16 maps under a 4 x 4 window). With POOL_FIRST,
// bias and activation are applied once per pooled value (both commute with max);
// otherwise each conv output is finished (bias, residual, activation) first. The
// residual is read with the same vector width as the output is stored. The
// max lets a NaN win, so a NaN anywhere in a window reaches the output, where
// the runner sees it.
//
// ncu puts these kernels at 88-95% of issue slots busy on the shipped convs, so
// fewer non-FFMA instructions is the lever left: input rows are read as float4
// and output rows written as float2/float4 where the shape keeps them aligned,
// and without a pool the bias starts each sum instead of being added last.
//
// Same -D macros as conv_const_rb, plus XT (columns per thread) and
// UNROLL_C, UNROLL_KH (1: rolled loop, else its trip count: fully unrolled).
// Launch: block (BLOCK), grid (ceil(batch*ROW_TILES*COL_TILES*SUB / BLOCK), ceil(M / MO));
// r is the residual operand ([batch][M][OH][OW], 16-byte aligned; null without RESIDUAL).

#define CG (C / G)   // input channels per group
#define MG (M / G)   // output maps per group
#define CH (POH * PKH)  // conv rows computed (all of OH without a pool)
#define CW (POW * PKW)  // conv columns computed
// lanes that share one pool window (1 when a thread's tile covers whole windows)
#define SUBH (PKH > RT ? PKH / RT : 1)
#define SUBW (PKW > XT ? PKW / XT : 1)
#define SUB (SUBH * SUBW)
// tiles of SUB lanes: SUBH * RT rows x SUBW * XT columns
#define ROW_TILES ((CH + SUBH * RT - 1) / (SUBH * RT))
#define COL_TILES ((CW + SUBW * XT - 1) / (SUBW * XT))
#define IN_COLS ((XT - 1) * SW + (KW - 1) * DW + 1)  // input columns one filter row of the tile reads
#define GROUPS ((M + MO - 1) / MO)
// taps may fall outside the image: with pads, or where the last tile overhangs the output
#define ROW_CHECK (PADDED || (CH % RT) != 0)
#define COL_CHECK (PADDED || (CW % XT) != 0)
// Input rows are read as float4 where a tile's row segment starts on a multiple
// of 4 floats (stride and tile width allow it) and rounding its end up stays
// inside the row; the host passes 16-byte aligned arrays. (float2 loads made
// ptxas hoist more of them: 126 instead of 79 registers for lenet86 conv2.)
#define VEC_IN ((!COL_CHECK && PW == 0 && (XT * SW) % 4 == 0 && W % 4 == 0) ? 4 : 1)
// Vector width of the stores without a pool: whole output rows split into tiles.
#define VEC_OUT ((PKH == 1 && PKW == 1 && OW % XT == 0) ? (XT % 4 == 0 ? 4 : XT % 2 == 0 ? 2 : 1) : 1)

#include "conv_constant_bank.cuh"
#include "conv_epilogue.cuh"

// v[0 .. IN_COLS-1] = start[0 .. IN_COLS-1] in float4 loads (0 where the row is
// outside the image); start is 16-byte aligned and the rounded-up end inside the row.
__device__ __forceinline__ void load_row_segment(const float* start, bool inside, float (&v)[IN_COLS])
{
#pragma unroll
    for (int k = 0; k < IN_COLS; k += 4) {
        const float4 q = inside ? *reinterpret_cast<const float4*>(start + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float part[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (k + e < IN_COLS) v[k + e] = part[e];
    }
}

// Maps FIRST .. FIRST+COUNT-1 of rows oh0 .. oh0+RT-1, columns ow0 .. ow0+XT-1.
template <int FIRST, int COUNT>
__device__ __forceinline__ void conv_tile(const float* __restrict__ image, const float* __restrict__ res,
                                          float* __restrict__ y, int n, int oh0, int ow0, bool valid)
{
    constexpr int group = FIRST / MG;  // every map of a thread lies in one group
    const float* in = image + group * (CG * H * W);
    const int ih0 = oh0 * SH - PH;
    const int iw0 = ow0 * SW - PW;

    // Without a pool the bias starts the sum (one add less per output); with one
    // it is added once per pooled value.
    float acc[RT][XT][COUNT];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int x = 0; x < XT; ++x)
#pragma unroll
            for (int j = 0; j < COUNT; ++j) acc[r][x][j] = (PKH == 1 && PKW == 1) ? with_bias(0.0f, FIRST + j) : 0.0f;

#pragma unroll UNROLL_C
    for (int c = 0; c < CG; ++c) {
#pragma unroll UNROLL_KH
        for (int kh = 0; kh < KH; ++kh) {
            // the input row segment each output row of the tile reads through filter row kh
            float v[RT][IN_COLS];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const int ih = ih0 + r * SH + kh * DH;
                const bool row_inside = !ROW_CHECK || (ih >= 0 && ih < H);
                const float* row = in + (c * H + ih) * W;
#if VEC_IN == 4
                load_row_segment(row + iw0, row_inside, v[r]);
#else
#pragma unroll
                for (int k = 0; k < IN_COLS; ++k) {
                    const int iw = iw0 + k;
                    const bool inside = row_inside && (!COL_CHECK || (iw >= 0 && iw < W));
                    v[r][k] = inside ? row[iw] : 0.0f;  // a predicated load of the pad value
                }
#endif
            }
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
#pragma unroll
                for (int j = 0; j < COUNT; ++j) {
                    const float w = filters[((c * KH + kh) * KW + kw) * M + FIRST + j];
#pragma unroll
                    for (int r = 0; r < RT; ++r)
#pragma unroll
                        for (int x = 0; x < XT; ++x) acc[r][x][j] = fmaf(v[r][x * SW + kw * DW], w, acc[r][x][j]);
                }
            }
        }
    }

#if (PKH > 1 || PKW > 1) && !POOL_FIRST
    // finish every conv output before the pool; those past CH x CW (a partial tile) are never stored
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const int row = oh0 + r < CH ? oh0 + r : CH - 1;
#pragma unroll
        for (int x = 0; x < XT; ++x) {
            const int col = ow0 + x < CW ? ow0 + x : CW - 1;
#pragma unroll
            for (int j = 0; j < COUNT; ++j)
                acc[r][x][j] = finish_output(with_bias(acc[r][x][j], FIRST + j),
                                             residual_at(res, (((size_t)n * M + FIRST + j) * OH + row) * OW + col));
        }
    }
#endif
#if PKH > 1 || PKW > 1
    // the part of each window inside this thread's tile, and the windows the tile covers
    constexpr int part_h = PKH < RT ? PKH : RT, part_w = PKW < XT ? PKW : XT;
    constexpr int windows_h = RT / part_h, windows_w = XT / part_w;
#pragma unroll
    for (int pr = 0; pr < windows_h; ++pr) {
#pragma unroll
        for (int px = 0; px < windows_w; ++px) {
            const int prow = oh0 / PKH + pr;
            const int pcol = ow0 / PKW + px;
#pragma unroll
            for (int j = 0; j < COUNT; ++j) {
                float v = acc[pr * part_h][px * part_w][j];
#pragma unroll
                for (int a = 0; a < part_h; ++a)
#pragma unroll
                    for (int b = 0; b < part_w; ++b) v = max_keep_nan(v, acc[pr * part_h + a][px * part_w + b][j]);
#pragma unroll
                for (int s = 1; s < SUB; s <<= 1) v = max_keep_nan(v, __shfl_xor_sync(0xffffffffu, v, s));
#if POOL_FIRST
                v = opplugin_activation(with_bias(v, FIRST + j));
#endif
                const bool inside = ((CH % RT) == 0 || prow < POH) && ((CW % XT) == 0 || pcol < POW);
                if (valid && inside && (SUB == 1 || (threadIdx.x % SUB) == 0))
                    y[(((size_t)n * M + FIRST + j) * POH + prow) * POW + pcol] = v;
            }
        }
    }
#else
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        if (!valid || ((CH % RT) != 0 && oh0 + r >= CH)) continue;
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
            const size_t at = (((size_t)n * M + FIRST + j) * OH + oh0 + r) * OW + ow0;
            float* out = y + at;
#pragma unroll
            for (int x = 0; x < XT; x += VEC_OUT) {
                if ((CW % XT) != 0 && ow0 + x >= CW) continue;
                if constexpr (VEC_OUT == 4) {
                    const float4 s = residual4_at(res, at + x);
                    *reinterpret_cast<float4*>(out + x) = make_float4(
                        finish_output(acc[r][x][j], s.x), finish_output(acc[r][x + 1][j], s.y),
                        finish_output(acc[r][x + 2][j], s.z), finish_output(acc[r][x + 3][j], s.w));
                } else if constexpr (VEC_OUT == 2) {
                    const float2 s = residual2_at(res, at + x);
                    *reinterpret_cast<float2*>(out + x) = make_float2(finish_output(acc[r][x][j], s.x), finish_output(acc[r][x + 1][j], s.y));
                } else {
                    out[x] = finish_output(acc[r][x][j], residual_at(res, at + x));
                }
            }
        }
    }
#endif
}

#include "conv_map_groups.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_const_tile(const float* __restrict__ x, const float* __restrict__ r, float* __restrict__ y, int batch)
{
    // over batch * ROW_TILES * COL_TILES * SUB, the lanes of one pool window fastest
    const int total = batch * (ROW_TILES * COL_TILES * SUB);
    int t = blockIdx.x * BLOCK + threadIdx.x;
    const bool valid = t < total;
#if SUB == 1
    if (!valid) return;
#else
    if (!valid) t = total - 1;  // still takes part in the shuffles, stores nothing
#endif
    const int sub = t % SUB;
    const int tile = t / SUB;
    const int n = tile / (ROW_TILES * COL_TILES);
    const int oh0 = ((tile / COL_TILES) % ROW_TILES) * (SUBH * RT) + (sub / SUBW) * RT;
    const int ow0 = (tile % COL_TILES) * (SUBW * XT) + (sub % SUBW) * XT;
    for_map_group<0>(blockIdx.y, x + (size_t)n * (C * H * W), r, y, n, oh0, ow0, valid);
}
