// conv_depthwise_half: a depthwise Conv (one input channel a map, depth multiplier 1: C == G == M) on
// operands in a 16-bit format (HALF_OPERANDS 1 FP16, 2 BF16): what --precision fp16|bf16 runs a depthwise
// Conv in (dw_fp16, dw_bf16; not FP32-exact). X and W are rounded to the format, each product of two such
// values is exact in FP32 and the sums, the bias and the epilogue (conv_epilogue.cuh) run in FP32.
//
// Channel-last is a depthwise Conv's natural layout: a pixel's channels are its independent problems side by
// side, so a thread computes VEC (2, 4 or 8) channels at once and reads them as one run of the format (4, 8 or
// 16 bytes). A block computes a BH x BW tile of output pixels of PLANES channels of one image; each thread a
// TH x TW tile of those pixels of its VEC channels. It walks the SEG_H input rows its TH output rows need, loads
// each row's SEG_W pixels into registers once, and each serves every output row whose window covers it, for
// its TW columns and the KW taps. The weights come from the build as [KH][KW][C] in the format, so a tap's
// channels are one load too (a few KiB that every block reads: they stay in L1). Nothing is staged in shared
// memory: the windows of a block's neighbouring threads meet in L1.
//
// VEC trades reuse for registers: a thread holds VEC floats per pixel of its row and per sum, so 2 channels
// leave room for rows of 8 outputs, whose taps and pixels are each loaded and widened to FP32 once for 8
// outputs rather than once or twice (a 7x7 window at 8 channels fits only 1 x 1 tiles).
//
// X arrives one of two ways:
// - X_CHANNEL_LAST (a link the plan made with the step before, opplugin/plan/channel_last.py): the format's
//   bits [N][H][W][C]. A warp's lanes run along the channels first, so that its loads are whole runs side by
//   side.
// - else FP32 NCHW, each value rounded to the format as it is loaded (what the wg families' rewrite does before
//   their GEMM). The lanes run along a row's pixels first, so that a warp's loads of one channel lie close.
// Y and the residual operand are FP32 NCHW, or with Y_CHANNEL_LAST / R_CHANNEL_LAST (the format, as
// conv_implicit_tiles.cuh names it) the format's bits channel-last, VEC channels a store or load.
//
// NaN and Inf: a value past FP16's range becomes an infinity when rounded, so the kernel flags (nonfinite,
// watch_flag.cuh) each output that is not finite as it is stored, and the runtime reruns that chunk in FP32.
//
// Macros: the shape macros (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, HAS_BIAS, RESIDUAL,
// ACTIVATION), HALF_OPERANDS, VEC (channels a thread), TH, TW (output rows x columns a thread), BH, BW (the
// block's output tile), PLANES (channels a block: a multiple of VEC), X_CHANNEL_LAST, Y_CHANNEL_LAST,
// R_CHANNEL_LAST (each the format, where that tensor is linked). Launch: block (NTHREADS = PLANES / VEC *
// BH/TH * BW/TW), grid (batch * TILES_H *
// TILES_W, ceil(C / PLANES)); no shared memory. w: [KH][KW][C] in the format; b: FP32 (null without a bias);
// r: the residual operand (null without RESIDUAL); nonfinite: the step's NaN/Inf flag (null: not watched).

#include "conv_epilogue.cuh"
#include "half_runs.cuh"
#include "grid_dependency.cuh"

#define GROUPS (PLANES / VEC)  // VEC-channel groups a block
#define THREADS_W (BW / TW)
#define THREADS_H (BH / TH)
#define PLANE_THREADS (THREADS_W * THREADS_H)
#define NTHREADS (GROUPS * PLANE_THREADS)
#define TILES_W ((OW + BW - 1) / BW)
#define TILES_H ((OH + BH - 1) / BH)
#define SEG_H ((TH - 1) * SH + (KH - 1) * DH + 1)  // input rows one thread reads
#define SEG_W ((TW - 1) * SW + (KW - 1) * DW + 1)  // input pixels one thread reads a row

static_assert(HALF_OPERANDS == 1 || HALF_OPERANDS == 2, "1: FP16, 2: BF16");
static_assert(G == C && M == C, "depthwise with a depth multiplier of 1");
static_assert(VEC == 2 || VEC == 4 || VEC == 8, "a run of 4, 8 or 16 bytes");
static_assert(C % VEC == 0 && PLANES % VEC == 0, "whole runs of channels");
static_assert(BH % TH == 0 && BW % TW == 0, "the block tile is whole thread tiles");
static_assert(SEG_W <= 32, "a window's columns are bits of one word");

AWAITS_PREVIOUS_GRID(conv_depthwise_half)
extern "C" __global__ void __launch_bounds__(NTHREADS)
conv_depthwise_half(const input_t* __restrict__ x, const unsigned short* __restrict__ w, const float* __restrict__ b,
                    const residual_t* __restrict__ r, output_t* __restrict__ y, int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    const int tile = blockIdx.x % (TILES_H * TILES_W);
    const int n = blockIdx.x / (TILES_H * TILES_W);
#ifdef X_CHANNEL_LAST
    const int group = threadIdx.x % GROUPS, pixel_thread = threadIdx.x / GROUPS;
#else
    const int pixel_thread = threadIdx.x % PLANE_THREADS, group = threadIdx.x / PLANE_THREADS;
#endif
    const int c0 = blockIdx.y * PLANES + group * VEC;
    if (c0 >= C) return;  // the last block's groups past C (the kernel has no barrier)
    const int oh0 = tile / TILES_W * BH + pixel_thread / THREADS_W * TH;
    const int ow0 = tile % TILES_W * BW + pixel_thread % THREADS_W * TW;
    const int ih0 = oh0 * SH - PH;  // the corner of this thread's window rows and columns in the image
    const int iw0 = ow0 * SW - PW;
    const input_t* image = x + (size_t)n * C * H * W;  // offsets inside one image fit an int (the family checks)

    const input_t* window = window_corner(image, ih0, iw0, c0);
    unsigned int columns = 0;  // bit k: the window's column k lies inside the image (the same for each of its rows)
#pragma unroll
    for (int k = 0; k < SEG_W; ++k) columns |= (unsigned int)((unsigned)(iw0 + k) < (unsigned)W) << k;

    float acc[TH][TW][VEC] = {};  // FP32 sums of each output pixel's VEC channels
#pragma unroll
    for (int row = 0; row < SEG_H; ++row) {
        const bool row_inside = (unsigned)(ih0 + row) < (unsigned)H;
        float v[SEG_W][VEC];
#pragma unroll
        for (int k = 0; k < SEG_W; ++k) load_pixel<VEC>(window, row * X_ROW + k * X_PIXEL, row_inside && (columns >> k & 1u), v[k]);
#pragma unroll
        for (int i = 0; i < TH; ++i) {
            const int down = row - i * SH;  // kh * DH for output row i, if this input row is in its window
            if (down < 0 || down % DH != 0 || down / DH >= KH) continue;  // decided at compile time
            const int kh = down / DH;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                float taps[VEC];
                load_halves<VEC>(w + (kh * KW + kw) * C + c0, taps);
#pragma unroll
                for (int j = 0; j < TW; ++j)
#pragma unroll
                    for (int q = 0; q < VEC; ++q) acc[i][j][q] = fmaf(v[j * SW + kw * DW][q], taps[q], acc[i][j][q]);
            }
        }
    }

    float bias[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) bias[q] = HAS_BIAS ? __ldg(b + c0 + q) : 0.0f;
#pragma unroll
    for (int i = 0; i < TH; ++i) {
        const int oh = oh0 + i;
        if (oh >= OH) break;
#pragma unroll
        for (int j = 0; j < TW; ++j) {
            const int ow = ow0 + j;
            if (ow >= OW) break;
            const size_t pixel = ((size_t)n * OH + oh) * OW + ow;
            float res[VEC], out[VEC];
            load_residual(r, pixel, c0, res);
#pragma unroll
            for (int q = 0; q < VEC; ++q) out[q] = finish_output(acc[i][j][q] + bias[q], res[q]);
            store_outputs(y, pixel, c0, out, nonfinite);
        }
    }
}
