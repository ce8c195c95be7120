// conv_depthwise: 2-D convolution (ONNX Conv) whose groups are narrow: depthwise (C / G == 1,
// with any depth multiplier M / G) or a few input channels a group (ResNeXt's 4, RegNet's 16),
// with filters of any size, strides and dilations. The weights are read at call time, so no
// layer is too wide for it (the constant-memory families stop at 64 KiB of filters).
//
// A block computes a BH x BW tile of output pixels of PLANES neighbouring maps of one image
// (with CG > 1, maps of one group); each thread a TH x TW register tile of one map. What makes
// it fast:
// - The block copies the input patch its tile reads ((BH-1)*SH + (KH-1)*DH + 1 rows, likewise
//   columns, zeros where the window leaves the image) and its maps' filters into shared memory
//   once, with coalesced loads and several in flight per thread (a patch wider than a warp by
//   rows, one group of lanes a row; a narrower one value by value). Depthwise, each map
//   has its patch (SLOTS = PLANES); grouped, the block's maps share their group's CG channel
//   patches (SLOTS = CG), so each input value read from global memory serves PLANES maps.
// - A thread then walks, per input channel, the SEG_H input rows its TH output rows need, in
//   order: it loads a row's SEG_W values into registers once, and each serves every output row
//   whose window covers that input row, for all of its TW columns and the KW taps: one shared
//   load feeds up to TH * KW multiply-adds. The loops over rows and taps are unrolled at compile
//   time (all shapes are -D macros), so accumulators, row values and tap indices are registers
//   and immediates. The channel loop is not unrolled: unrolled, ptxas hoists every channel's
//   loads and spills (RegNet's 16 channels a group, 1x4 tiles: 128 registers and 68 bytes spilled).
// - PITCH (floats per patch row, >= the patch's width) is chosen by the host so that the lanes
//   of a warp, which start TW*SW columns and TH*SH rows apart, read distinct banks where they can.
// - Small planes (7x7) put several maps in one block (PLANES) so a block still has enough
//   threads; large ones tile the plane.
// - Grouped, a thread may compute MAPS of its group's maps at once (MAPS > 1): each input value
//   it loads from shared memory then feeds MAPS maps' multiply-adds, where one map a thread
//   re-read the group's patch once per map. The block's filters are stored MAPS maps innermost,
//   so a thread reads one tap of its MAPS maps in one vector load.
// - STAGED 0 skips the staging: each thread reads its window's inputs and taps straight from
//   global memory (through L1, where a block's neighbouring windows meet). A short grid (batch 1,
//   a stride of 2) reuses too little of a patch to repay the staging's loads, stores and barrier.
// FP32-exact by construction: each output is a chain of FP32 fused multiply-adds over its
// window's taps (channel, kh, kw), then the epilogue (conv_epilogue.cuh): bias, the residual
// operand r, ACTIVATION. No max pool.
//
// Macros: the shape macros (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, HAS_BIAS,
// RESIDUAL, ACTIVATION) plus TH, TW (rows x columns per thread), BH, BW (the block's output
// tile), PLANES (maps per block), MAPS (maps per thread, dividing PLANES), PITCH, STAGED (1:
// patches and filters in shared memory).
// Launch: block (NTHREADS = PLANES / MAPS * BH/TH * BW/TW), grid (batch * TILES_H * TILES_W,
// ceil(M / PLANES)), static shared memory. r: the residual operand ([batch][M][OH][OW]; null
// without RESIDUAL).

#include "conv_epilogue.cuh"

#define CG (C / G)  // input channels per group
#define MG (M / G)  // maps per group
#define TAPS (KH * KW)
#define PATCH_H ((BH - 1) * SH + (KH - 1) * DH + 1)
#define PATCH_W ((BW - 1) * SW + (KW - 1) * DW + 1)
#define SEG_H ((TH - 1) * SH + (KH - 1) * DH + 1)  // input rows one thread reads
#define SEG_W ((TW - 1) * SW + (KW - 1) * DW + 1)  // input columns one thread reads per row
#define THREADS_W (BW / TW)
#define THREADS_H (BH / TH)
#define PLANE_THREADS (THREADS_W * THREADS_H)
#ifndef MAPS
#define MAPS 1
#endif
#define NTHREADS (PLANES / MAPS * PLANE_THREADS)
#define TILES_W ((OW + BW - 1) / BW)
#define TILES_H ((OH + BH - 1) / BH)
#define PATCH_FLOATS (PATCH_H * PITCH)
#define SLOTS (CG == 1 ? PLANES : CG)  // channel patches: each map's own, or its group's
#define STAGE_CHUNK 4  // global loads a thread has in flight while staging a narrow patch and the filters
#define ROW_LOADS 8  // the same for a wide patch, staged by rows
// threads that stage one row of a wide patch together: PATCH_W in as few rounds of at most 32
// lanes as it needs, split evenly (a 57-wide row: 29 lanes twice), no more than the block has
#define ROW_ROUNDS ((PATCH_W + 31) / 32)
#define ROW_LANES ((PATCH_W + ROW_ROUNDS - 1) / ROW_ROUNDS)
#define STAGE_LANES (NTHREADS < ROW_LANES ? NTHREADS : ROW_LANES)
#define STAGE_GROUPS (NTHREADS / STAGE_LANES)  // whole groups of them
#ifndef STAGED
#define STAGED 1
#endif

static_assert(CG == 1 || MG % PLANES == 0, "a block's maps lie in one group");
static_assert(BH % TH == 0 && BW % TW == 0, "the block tile is whole thread tiles");
static_assert(PLANES % MAPS == 0 && (MAPS == 1 || CG > 1), "a thread's maps share their group's patches");
static_assert(PITCH >= PATCH_W, "a patch row fits its pitch");

// One tap of a thread's MAPS maps, stored side by side (and aligned to their size) in shared memory.
__device__ __forceinline__ void load_taps(const float* at, float (&taps)[MAPS])
{
#if MAPS % 4 == 0
#pragma unroll
    for (int q = 0; q < MAPS; q += 4) {
        const float4 v = *reinterpret_cast<const float4*>(at + q);
        taps[q] = v.x, taps[q + 1] = v.y, taps[q + 2] = v.z, taps[q + 3] = v.w;
    }
#elif MAPS == 2
    const float2 v = *reinterpret_cast<const float2*>(at);
    taps[0] = v.x, taps[1] = v.y;
#else
#pragma unroll
    for (int q = 0; q < MAPS; ++q) taps[q] = at[q];
#endif
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
conv_depthwise(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
               const float* __restrict__ r, float* __restrict__ y, int batch)
{
    const int tile = blockIdx.x % (TILES_H * TILES_W);
    const int n = blockIdx.x / (TILES_H * TILES_W);
    const int oh0 = tile / TILES_W * BH;
    const int ow0 = tile % TILES_W * BW;
    const int m0 = blockIdx.y * PLANES;
    const int ih0 = oh0 * SH - PH;  // the patch's corner in the image (negative in the pads)
    const int iw0 = ow0 * SW - PW;

    const float* image = x + (size_t)n * C * H * W;  // offsets inside one image fit an int (the family checks)
#if STAGED
    __shared__ float patch[SLOTS * PATCH_FLOATS];
    __shared__ __align__(16) float filters[PLANES * CG * TAPS];  // [PLANES / MAPS][CG][TAPS][MAPS]
    // the patch of each slot's input channel, zeros outside the image (and for maps past M)
#if PATCH_W > 32
    // A wide patch: groups of STAGE_LANES threads walk its rows, their lanes the columns, so a
    // row's channel, bounds and offset are worked out once for all its values; ROW_LOADS loads
    // in flight per thread before their stores. On an H200 this took MobileNetV2's 3x3 s2 layer
    // (57-column patches) from 51 to 36 µs at batch 32; on narrow patches it left lanes idle.
    constexpr int PATCH_ROWS = SLOTS * PATCH_H;
    constexpr int ROW_STEPS = (PATCH_W + STAGE_LANES - 1) / STAGE_LANES;  // a lane's values per row
    constexpr int ROWS_AT_ONCE = ROW_STEPS >= ROW_LOADS ? 1 : ROW_LOADS / ROW_STEPS;
    const int lane = threadIdx.x % STAGE_LANES;
    const int row_group = threadIdx.x / STAGE_LANES;  // STAGE_GROUPS of them; the threads past stay idle here
    if (row_group < STAGE_GROUPS) {
        for (int first = row_group; first < PATCH_ROWS; first += ROWS_AT_ONCE * STAGE_GROUPS) {
            float v[ROWS_AT_ONCE][ROW_STEPS];
#pragma unroll
            for (int r = 0; r < ROWS_AT_ONCE; ++r) {
                const int prow = first + r * STAGE_GROUPS;
                const int slot = prow / PATCH_H;
                const int ih = ih0 + prow % PATCH_H;
                const int channel = CG == 1 ? (m0 + slot) / MG : m0 / MG * CG + slot;
                const bool row_inside = prow < PATCH_ROWS && (CG > 1 || m0 + slot < M) && (unsigned)ih < (unsigned)H;
                const int row_at = (channel * H + ih) * W + iw0;
#pragma unroll
                for (int k = 0; k < ROW_STEPS; ++k) {
                    const int column = lane + k * STAGE_LANES;
                    const bool inside = row_inside && column < PATCH_W && (unsigned)(iw0 + column) < (unsigned)W;
                    v[r][k] = inside ? __ldg(image + row_at + column) : 0.0f;
                }
            }
#pragma unroll
            for (int r = 0; r < ROWS_AT_ONCE; ++r) {
                const int prow = first + r * STAGE_GROUPS;
                float* target = patch + prow / PATCH_H * PATCH_FLOATS + prow % PATCH_H * PITCH;
#pragma unroll
                for (int k = 0; k < ROW_STEPS; ++k)
                    if (prow < PATCH_ROWS && lane + k * STAGE_LANES < PATCH_W) target[lane + k * STAGE_LANES] = v[r][k];
            }
        }
    }
#else
    // A narrow patch: the block's threads walk its values in order, STAGE_CHUNK loads in flight
    // per thread before their stores (a small layer's blocks have few threads, and one load at
    // a time left them waiting on memory)
    constexpr int PATCH_COUNT = SLOTS * PATCH_H * PATCH_W;
    for (int first = threadIdx.x; first < PATCH_COUNT; first += STAGE_CHUNK * NTHREADS) {
        float v[STAGE_CHUNK];
#pragma unroll
        for (int k = 0; k < STAGE_CHUNK; ++k) {
            const int i = first + k * NTHREADS;
            const int slot = i / (PATCH_H * PATCH_W);
            const int ih = ih0 + i / PATCH_W % PATCH_H;
            const int iw = iw0 + i % PATCH_W;
            const int channel = CG == 1 ? (m0 + slot) / MG : m0 / MG * CG + slot;
            const bool inside = i < PATCH_COUNT && (CG > 1 || m0 + slot < M) && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
            v[k] = inside ? __ldg(image + (channel * H + ih) * W + iw) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < STAGE_CHUNK; ++k) {
            const int i = first + k * NTHREADS;
            if (i < PATCH_COUNT) patch[i / (PATCH_H * PATCH_W) * PATCH_FLOATS + i / PATCH_W % PATCH_H * PITCH + i % PATCH_W] = v[k];
        }
    }
#endif
    constexpr int FILTER_COUNT = PLANES * CG * TAPS;
    for (int first = threadIdx.x; first < FILTER_COUNT; first += STAGE_CHUNK * NTHREADS) {
        float v[STAGE_CHUNK];
#pragma unroll
        for (int k = 0; k < STAGE_CHUNK; ++k) {
            const int i = first + k * NTHREADS;
            v[k] = i < FILTER_COUNT && m0 + i / (CG * TAPS) < M ? __ldg(w + (size_t)m0 * CG * TAPS + i) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < STAGE_CHUNK; ++k) {
            const int i = first + k * NTHREADS;  // (plane * CG + channel) * TAPS + tap, as w holds them
            const int plane = i / (CG * TAPS);
            if (i < FILTER_COUNT) filters[((plane / MAPS * CG * TAPS) + i % (CG * TAPS)) * MAPS + plane % MAPS] = v[k];
        }
    }
    __syncthreads();
#endif

    const int plane = threadIdx.x / PLANE_THREADS;  // the first of this thread's MAPS maps in the block, over MAPS
    const int ty = threadIdx.x % PLANE_THREADS / THREADS_W;
    const int tx = threadIdx.x % THREADS_W;
    const int m = m0 + plane * MAPS;
    float acc[MAPS][TH][TW];
#pragma unroll
    for (int q = 0; q < MAPS; ++q)
#pragma unroll
        for (int i = 0; i < TH; ++i)
#pragma unroll
            for (int j = 0; j < TW; ++j) acc[q][i][j] = 0.0f;

#if !STAGED
    const int seg_h0 = ih0 + ty * TH * SH;  // the corner of this thread's window rows and columns in the image
    const int seg_w0 = iw0 + tx * TW * SW;
#endif
#pragma unroll 1
    for (int c = 0; c < CG; ++c) {
#if STAGED
        const float* in = patch + (CG == 1 ? plane : c) * PATCH_FLOATS + ty * TH * SH * PITCH + tx * TW * SW;
        const float* f = filters + (plane * CG + c) * TAPS * MAPS;
#else
        const int channel = CG == 1 ? m / MG : m0 / MG * CG + c;
        const float* in = image + channel * H * W;
        const float* f = w + ((size_t)(m < M ? m : 0) * CG + c) * TAPS;  // a map past M reads map 0's, never stored (MAPS 1)
#endif
#pragma unroll
        for (int row = 0; row < SEG_H; ++row) {
            float v[SEG_W];
#if STAGED
#pragma unroll
            for (int k = 0; k < SEG_W; ++k) v[k] = in[row * PITCH + k];
#else
            const int ih = seg_h0 + row;
#pragma unroll
            for (int k = 0; k < SEG_W; ++k) {
                const int iw = seg_w0 + k;
                v[k] = m < M && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W ? __ldg(in + ih * W + iw) : 0.0f;
            }
#endif
#pragma unroll
            for (int i = 0; i < TH; ++i) {
                const int down = row - i * SH;  // kh * DH for output row i, if this row is in its window
                if (down < 0 || down % DH != 0 || down / DH >= KH) continue;  // decided at compile time
                const int kh = down / DH;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    float taps[MAPS];
#if STAGED
                    load_taps(f + (kh * KW + kw) * MAPS, taps);
#else
#pragma unroll
                    for (int q = 0; q < MAPS; ++q) taps[q] = __ldg(f + (size_t)q * CG * TAPS + kh * KW + kw);
#endif
#pragma unroll
                    for (int q = 0; q < MAPS; ++q)
#pragma unroll
                        for (int j = 0; j < TW; ++j) acc[q][i][j] = fmaf(v[j * SW + kw * DW], taps[q], acc[q][i][j]);
                }
            }
        }
    }

    if (m >= M) return;
#pragma unroll
    for (int q = 0; q < MAPS; ++q) {
#if HAS_BIAS
        const float bias = __ldg(b + m + q);
#else
        const float bias = 0.0f;
#endif
        const size_t plane_at = ((size_t)n * M + m + q) * (OH * OW);
#pragma unroll
        for (int i = 0; i < TH; ++i) {
            const int oh = oh0 + ty * TH + i;
            if (oh >= OH) break;
#pragma unroll
            for (int j = 0; j < TW; ++j) {
                const int ow = ow0 + tx * TW + j;
                if (ow >= OW) break;
                const size_t at = plane_at + oh * OW + ow;
                y[at] = finish_output(acc[q][i][j] + bias, residual_at(r, at));
            }
        }
    }
}
