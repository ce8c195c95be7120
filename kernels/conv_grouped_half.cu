// conv_grouped_half: a grouped Conv of narrow groups (CG = C / G input channels and MG = M / G maps a group, a few
// of each: ResNeXt's 4, 8 and 16, RegNet's 16) on operands in a 16-bit format (HALF_OPERANDS 1 FP16, 2 BF16): what
// --precision fp16|bf16 runs such a Conv in (gw_fp16, gw_bf16; not FP32-exact). X and W are rounded to the format,
// each product of two such values is exact in FP32 and the sums, the bias and the epilogue (conv_epilogue.cuh) run
// in FP32. conv_depthwise_half.cu's kernel with a group of CG channels where that one has one channel.
//
// A GEMM tile of 8 or 16 maps (wg_fp16's narrow tiles) spends most of its time moving a group's few channels
// through shared memory for a few multiply-adds each; here nothing is staged. A block computes a BH x BW tile of
// output pixels of PLANES maps of one image, each thread a TH x TW tile of those pixels of VEC (2, 4 or 8) maps of
// one group. It walks the SEG_H input rows its TH output rows need, loads each row's SEG_W pixels' CG channels of
// its group into registers once (one 4-, 8- or 16-byte load a pixel where X is linked, two for 16 channels),
// widened to FP32 once, and each serves every output row whose window covers it, for its TW columns, its VEC maps
// and the KW taps. The weights come from the build as [KH][KW][CG][M] in the format, so a tap's channel's VEC maps
// are one load beside the next thread's (its next run of maps): a few KiB that every block reads, kept in L1.
//
// X arrives one of two ways:
// - X_CHANNEL_LAST (a link the plan made with the step before): the format's bits [N][H][W][C]. A warp's lanes run
//   along the block's runs of maps first, then its pixels, so that a warp's loads and stores are each pixel's runs
//   side by side, and its weight loads few distinct lines (PLANES maps of one tap's channel).
// - else FP32 NCHW, each value rounded to the format as it is loaded; the lanes run along a row's pixels first.
// Y and the residual operand are FP32 NCHW, or with Y_CHANNEL_LAST / R_CHANNEL_LAST the format's bits channel-last,
// VEC maps a store or load. Either way the products are summed in one order, so a linked output is the unlinked
// one rounded.
//
// NaN and Inf: a value past FP16's range becomes an infinity when rounded, so the kernel flags (nonfinite,
// watch_flag.cuh) each output that is not finite as it is stored, and the runtime reruns that chunk in FP32.
//
// Macros: the shape macros (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, HAS_BIAS, RESIDUAL,
// ACTIVATION), HALF_OPERANDS, VEC (maps a thread), TH, TW (output rows x columns a thread), BH, BW (the block's
// output tile), PLANES (maps a block: a multiple of VEC), X_CHANNEL_LAST, Y_CHANNEL_LAST, R_CHANNEL_LAST (each the
// format, where that tensor is linked). Launch: block (NTHREADS = PLANES / VEC * BH/TH * BW/TW), grid (batch *
// TILES_H * TILES_W, ceil(M / PLANES)); no shared memory. w: [KH][KW][CG][M] in the format; b: FP32 (null without
// a bias); r: the residual operand (null without RESIDUAL); nonfinite: the step's NaN/Inf flag (null: not watched).

#include "conv_epilogue.cuh"
#include "half_runs.cuh"
#include "grid_dependency.cuh"

#define CG (C / G)  // input channels a group
#define MG (M / G)  // maps a group
#define RUNS (PLANES / VEC)  // VEC-map runs a block
#define THREADS_W (BW / TW)
#define THREADS_H (BH / TH)
#define PLANE_THREADS (THREADS_W * THREADS_H)
#define NTHREADS (RUNS * PLANE_THREADS)
#define TILES_W ((OW + BW - 1) / BW)
#define TILES_H ((OH + BH - 1) / BH)
#define SEG_H ((TH - 1) * SH + (KH - 1) * DH + 1)  // input rows one thread reads
#define SEG_W ((TW - 1) * SW + (KW - 1) * DW + 1)  // input pixels one thread reads a row

static_assert(HALF_OPERANDS == 1 || HALF_OPERANDS == 2, "1: FP16, 2: BF16");
static_assert(C % G == 0 && M % G == 0, "whole groups");
static_assert(CG == 2 || CG == 4 || CG == 8 || CG == 16, "a group's channels of a pixel: one aligned load of 4, 8 or 16 bytes, or two");
static_assert(VEC == 2 || VEC == 4 || VEC == 8, "a run of 4, 8 or 16 bytes");
static_assert(MG % VEC == 0 && PLANES % VEC == 0, "a thread's maps lie in one group");
static_assert(BH % TH == 0 && BW % TW == 0, "the block tile is whole thread tiles");
static_assert(SEG_W <= 32, "a window's columns are bits of one word");

AWAITS_PREVIOUS_GRID(conv_grouped_half)
extern "C" __global__ void __launch_bounds__(NTHREADS)
conv_grouped_half(const input_t* __restrict__ x, const unsigned short* __restrict__ w, const float* __restrict__ b,
                  const residual_t* __restrict__ r, output_t* __restrict__ y, int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    const int tile = blockIdx.x % (TILES_H * TILES_W);
    const int n = blockIdx.x / (TILES_H * TILES_W);
#ifdef X_CHANNEL_LAST
    const int run = threadIdx.x % RUNS, pixel_thread = threadIdx.x / RUNS;
#else
    const int pixel_thread = threadIdx.x % PLANE_THREADS, run = threadIdx.x / PLANE_THREADS;
#endif
    const int m0 = blockIdx.y * PLANES + run * VEC;
    if (m0 >= M) return;  // the last block's runs past M (the kernel has no barrier)
    const int c0 = m0 / MG * CG;  // the group's first input channel
    const int oh0 = tile / TILES_W * BH + pixel_thread / THREADS_W * TH;
    const int ow0 = tile % TILES_W * BW + pixel_thread % THREADS_W * TW;
    const int ih0 = oh0 * SH - PH;  // the corner of this thread's window rows and columns in the image
    const int iw0 = ow0 * SW - PW;
    const input_t* image = x + (size_t)n * C * H * W;  // offsets inside one image fit an int (the family checks)

    const input_t* window = window_corner(image, ih0, iw0, c0);
    // the thread's maps of the first tap's first channel, each weight load a constant past it; held in registers, as
    // the window's corner is
    const unsigned short* filters = w + m0;
    asm("" : "+l"(filters));
    unsigned int columns = 0;  // bit k: the window's column k lies inside the image (the same for each of its rows)
#pragma unroll
    for (int k = 0; k < SEG_W; ++k) columns |= (unsigned int)((unsigned)(iw0 + k) < (unsigned)W) << k;

    float acc[TH][TW][VEC] = {};  // FP32 sums of each output pixel's VEC maps
#pragma unroll
    for (int row = 0; row < SEG_H; ++row) {
        const bool row_inside = (unsigned)(ih0 + row) < (unsigned)H;
        float v[SEG_W][CG];
#pragma unroll
        for (int k = 0; k < SEG_W; ++k) load_pixel<CG>(window, row * X_ROW + k * X_PIXEL, row_inside && (columns >> k & 1u), v[k]);
#pragma unroll
        for (int i = 0; i < TH; ++i) {
            const int down = row - i * SH;  // kh * DH for output row i, if this input row is in its window
            if (down < 0 || down % DH != 0 || down / DH >= KH) continue;  // decided at compile time
            const int kh = down / DH;
#pragma unroll
            for (int kw = 0; kw < KW; ++kw)
#pragma unroll
                for (int c = 0; c < CG; ++c) {
                    float taps[VEC];  // the tap's weights from channel c to the thread's VEC maps
                    load_halves<VEC>(filters + ((kh * KW + kw) * CG + c) * M, taps);
#pragma unroll
                    for (int j = 0; j < TW; ++j)
#pragma unroll
                        for (int q = 0; q < VEC; ++q) acc[i][j][q] = fmaf(v[j * SW + kw * DW][c], taps[q], acc[i][j][q]);
                }
        }
    }

    float bias[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) bias[q] = HAS_BIAS ? __ldg(b + m0 + q) : 0.0f;
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
            load_residual(r, pixel, m0, res);
#pragma unroll
            for (int q = 0; q < VEC; ++q) out[q] = finish_output(acc[i][j][q] + bias[q], res[q]);
            store_outputs(y, pixel, m0, out, nonfinite);
        }
    }
}
