// conv_wgmma: 2-D convolution (ONNX Conv, any group count whose groups have a multiple of 32
// input channels) as an FP32-exact implicit GEMM on Hopper's asynchronous warpgroup MMA, wgmma
// (sm_90a alone; conv_tc_gemm is the path elsewhere).
//
// Why: conv_tc_gemm's 3xTF32 loop on mma.sync is bound by its instruction mix (ncu on VGG
// 512->512 at batch 32: 218 registers, 12.5% occupancy, issue slots half busy): each warp loads
// and splits its own operand fragments, and the MMAs wait on them. Here both operands stay in
// shared memory, where wgmma reads them through descriptors, and the work is split between
// producer and consumer warpgroups that do one thing each (as CUTLASS's Hopper kernels do; the
// pipeline, the 3xTF32 arithmetic, the swizzled stages and the accumulators' layout are
// wgmma_3xtf32.cuh's).
//
// The operands arrive split and K-major, so that a producer only copies:
// - the weights, rearranged once at build time (WgmmaGemmKernel) to W[map][k] with
//   k = (kh*KW + kw)*CGP + c (CGP: the group's channels, padded as below), and their small parts
//   beside them;
// - the image, rewritten channel-last by conv_split_channel_last before each call (after the
//   prologue), its values and their small parts: a 16-byte quad of a pixel's slice is four (FP32)
//   or eight (FP16, BF16) channels of one window tap, so a pixel's slice is eight 16-byte copies,
//   each with one test of whether its tap lies inside the image. Where a group has a multiple of
//   BK channels a slice is one tap's, 128 contiguous bytes; with fewer, a slice spans taps. (ncu and timings of the NCHW gather this replaced, on
//   ResNet 128->128 at batch 32: the producers, one 4-byte copy and one __constant__ tap lookup a
//   value, then a split in shared memory, kept the consumers waiting; copying nothing ran the
//   kernel 1.97x faster.)
//
// The product, per group: Y[pixel][map] = sum_k X[pixel][k] * W[map][k] over KDIM = CG*KH*KW; a
// block has BN pixels (n, oh, ow) of the batch, 64 a consumer warpgroup (wgmma's M), and BM maps
// (wgmma's N: 64 or 128; with HALF_OPERANDS also 8 to 32) inside one group (MapTile). The K split and the epilogue are
// conv_tc_gemm's (conv_implicit_tiles.cuh).
//
// With HALF_OPERANDS (1 FP16, 2 BF16: wg_fp16, wg_bf16; not FP32-exact, picked by --precision) the
// image is rewritten channel-last in that format instead, with no small parts, and the weights arrive
// in it from the build: a 128-byte line is BK = 64 channels of one tap, and the wgmmas (one a k16 step)
// accumulate in FP32 (wgmma_3xtf32.cuh). Half the bytes of the rewrite, a sixth of the tensor-core
// work of 3xTF32.
//
// Macros: the shape macros, BM, BN (a multiple of 64), BK (32; 64 with HALF_OPERANDS), STAGES, KSLICES,
// TAP_MASK (PixelCopies), KPAD, PROLOGUE, HALF_OPERANDS, CP (a one-group Conv's channels padded to a quad; C), and with
// HALF_OPERANDS Y_CHANNEL_LAST and R_CHANNEL_LAST (conv_implicit_tiles.cuh: y or the residual kept channel-last
// in the format). Launch conv_split_channel_last first (see there; not where X already is the channel-last image
// in the format, as a linked half Conv step wrote it: then x_big is X itself, or with a PROLOGUE what
// conv_prologue_channel_last makes of it), then conv_wgmma: block (BN *
// 4), grid (ceil(batch*OH*OW / BN), G * ceil(M/G / BM), KSLICES) with KSLICES > 1, else any grid (x, y, 1):
// a block takes every (x*y)-th output tile, so that a block an SM runs them all (persistent), its producers
// copying the next tile's first slices during this one's epilogue; dynamic shared memory (STAGES * PARTS *
// (BM + BN) * 128 + STAGES * 16 + 1024) bytes (PARTS: 2, 1 with HALF_OPERANDS), and with Y_CHANNEL_LAST
// 2 * BN * STAGED_ROW more for the staged stores (16 rows of STAGED_ROW halves a consumer warp). With KSLICES > 1 the partial sums go to `partial` and
// conv_k_slices_reduce finishes them. nonfinite: the step's NaN/Inf flag, as conv_tc_gemm's.

#include "conv_epilogue.cuh"

// A group's channels as the channel-last image holds them: CG, or with CP (a one-group Conv's channels
// padded with zeros to a whole 16-byte quad: a stem's 3 to 8 in FP16) CP; K runs over CGP channels of
// each tap, in whole slices (the weights padded with zero rows at build, the image's quads past K not read)
#ifndef CP
#define CP C
#endif
#define CGP (CP / G)
#define KDIM_PADDED (CGP * KH * KW)
#define KTILES ((KDIM_PADDED + BK - 1) / BK)
#define KROW (KTILES * BK)  // a map's weights, in whole slices
#define W_ROWS BM  // maps: wgmma's N
#define X_ROWS BN  // pixels: 64 a consumer warpgroup
#include "wgmma_3xtf32.cuh"

#include "conv_implicit_tiles.cuh"
#include "grid_dependency.cuh"
#ifdef HALF_OPERANDS
#include "half_bits.cuh"
#endif

static_assert(CGP % QUAD_VALUES == 0 && CGP >= CG && (CP == C || G == 1), "a 16-byte quad is channels of one window tap");

// The prologue on an image value of channel c of image n (conv_implicit_tiles.cuh says which;
// prologue_b_slice there applies the same arithmetic to the NCHW gather).
__device__ __forceinline__ float prologue_value(float v, const float* __restrict__ pro, int n, int c)
{
#if PROLOGUE == 1
    return v * __ldg(pro + (size_t)n * C + c);
#elif PROLOGUE == 2
    return PROLOGUE_ACTIVATION(fmaf(v, __ldg(pro + c), __ldg(pro + C + c)));
#else
    return v;
#endif
}

// big, small = X after the prologue, channel-last ([batch][H*W][CP], channels past C zero), and its
// small parts (with HALF_OPERANDS: big in that format, small not written); X's images lie x_image
// floats apart. A block transposes SPLIT_CHANNELS channels x SPLIT_PIXELS pixels of one image through
// shared memory, so that both its reads (along pixels) and its writes (along channels) are coalesced.
// SPLIT_CHANNELS is 32, or 8 or 16 where the image has no more channels than that (a stem's 3 padded to 8):
// a 32-channel tile would leave most of its threads idle and its blocks many and short.
// Launch: block (32, 8), grid (batch * ceil(H*W / SPLIT_PIXELS), ceil(CP / SPLIT_CHANNELS)).
#ifndef SPLIT_CHANNELS
#define SPLIT_CHANNELS 32
#endif
constexpr int SPLIT_PIXELS = 1024 / SPLIT_CHANNELS;

AWAITS_PREVIOUS_GRID(conv_split_channel_last)
extern "C" __global__ void __launch_bounds__(256)
conv_split_channel_last(const float* __restrict__ x, const float* __restrict__ pro, operand_t* __restrict__ big,
                        operand_t* __restrict__ small, int x_image)
{
    await_previous_grid();
    constexpr int PIXEL_TILES = (H * W + SPLIT_PIXELS - 1) / SPLIT_PIXELS;
    __shared__ float tile[SPLIT_CHANNELS][SPLIT_PIXELS + 1];  // [channel][pixel], a column apart in banks
    const int thread = threadIdx.y * 32 + threadIdx.x;
    const int n = blockIdx.x / PIXEL_TILES;
    const int p0 = blockIdx.x % PIXEL_TILES * SPLIT_PIXELS;
    const int c0 = blockIdx.y * SPLIT_CHANNELS;
    const float* image = x + (size_t)n * x_image;
#pragma unroll
    for (int e = thread; e < SPLIT_CHANNELS * SPLIT_PIXELS; e += 256) {  // a warp along one channel's pixels
        const int i = e / SPLIT_PIXELS, j = e % SPLIT_PIXELS;
        const int p = p0 + j;
        const int c = c0 + i;
        tile[i][j] = p < H * W && c < C ? prologue_value(image[(size_t)c * (H * W) + p], pro, n, c) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int e = thread; e < SPLIT_CHANNELS * SPLIT_PIXELS; e += 256) {  // a warp along pixels' channels
        const int i = e % SPLIT_CHANNELS, j = e / SPLIT_CHANNELS;
        const int p = p0 + j;
        if (p >= H * W || c0 + i >= CP) continue;
        const float v = tile[i][j];
        const size_t at = ((size_t)n * (H * W) + p) * CP + c0 + i;
#ifdef HALF_OPERANDS
        big[at] = half_bits<HALF_OPERANDS>(v);
#else
        big[at] = v;
        small[at] = small_part(v);
#endif
    }
}

#ifdef HALF_OPERANDS
// big = the prologue on X where X comes channel-last in the format already (a link): each value widened to FP32,
// transformed, and rounded once to the format, as conv_split_channel_last rounds an FP32 X's. Both are
// [batch][H*W][C] (a linked X has whole 16-byte runs of channels: no padding). A thread takes one run of 8
// channels of a pixel, loaded and stored whole. Launch: block 256, grid ceil(batch * H*W * C / 8 / 256).
AWAITS_PREVIOUS_GRID(conv_prologue_channel_last)
extern "C" __global__ void __launch_bounds__(256)
conv_prologue_channel_last(const operand_t* __restrict__ x, const float* __restrict__ pro, operand_t* __restrict__ big, int batch)
{
    await_previous_grid();
    constexpr int RUNS = CP / 8;  // 16-byte runs a pixel (a linked X is never padded: CP is C)
    const size_t run = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (run >= (size_t)batch * (H * W) * RUNS) return;
    const int n = (int)(run / ((size_t)(H * W) * RUNS));
    const int c0 = (int)(run % RUNS) * 8;
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(x) + run);
    const unsigned int words[4] = {bits.x, bits.y, bits.z, bits.w};
    unsigned int out[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float lower = prologue_value(half_value<HALF_OPERANDS>((unsigned short)(words[k] & 0xFFFF)), pro, n, c0 + 2 * k);
        const float upper = prologue_value(half_value<HALF_OPERANDS>((unsigned short)(words[k] >> 16)), pro, n, c0 + 2 * k + 1);
        out[k] = half_pair_bits<HALF_OPERANDS>(lower, upper);
    }
    reinterpret_cast<uint4*>(big)[run] = make_uint4(out[0], out[1], out[2], out[3]);
}
#endif

// This thread's weight copies: eight consecutive threads on a row's eight quads (one 128-byte line
// read, all 32 banks written), rows NTHREADS / 8 apart. A narrow map tile (8 to 32 rows, a turn being 16 or 32)
// ends in a partial turn, which the threads past its last row sit out.
struct WeightCopies {
    static constexpr int ROW_STEP = NTHREADS / QUADS;
    static constexpr int TURNS = (BM + ROW_STEP - 1) / ROW_STEP;
    int quad, first_row;

    __device__ __forceinline__ WeightCopies() : quad(threadIdx.x % QUADS), first_row(threadIdx.x / QUADS) {}

    __device__ __forceinline__ void copy(operand_t* stage, const operand_t* __restrict__ w_big, const operand_t* __restrict__ w_small,
                                         const MapTile& maps, int k0) const
    {
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
            const int m = first_row + turn * ROW_STEP;
            if (BM % ROW_STEP && m >= BM) break;  // past the tile: the stage's data rows lie there
            const bool inside = maps.first + m < maps.end;
            const size_t from = inside ? (size_t)(maps.first + m) * KROW + k0 + quad * QUAD_VALUES : 0;
            const int to = SWIZZLED_AT(m, quad * QUAD_VALUES);
            copy_quad(stage + to, w_big + from, inside);
            if (PARTS > 1) copy_quad(stage + A_STAGE + to, w_small + from, inside);
        }
    }
};

// This thread's image copies: eight consecutive threads on a pixel's eight quads of the slice (each
// quad QUAD_VALUES channels of one tap: a slice spans taps where a group has fewer channels than it
// holds), pixels NTHREADS / 8 apart; where each of its pixels' windows lies in the channel-last
// image worked out once, and with TAP_MASK which of their taps lie inside it. Without (a window
// wider than 3x3), each copy tests its own tap against the image instead: a 7x7 stem's 49-bit
// masks, held a pixel, spilled the 56 registers a 512-thread block's producers get.
struct PixelCopies {
    static constexpr int PIXEL_STEP = NTHREADS / QUADS;
    static constexpr int TURNS = BN / PIXEL_STEP;
    long long origin[TURNS];  // (image, ih0, iw0, the group's channel 0); ih0, iw0 may be negative (pads)
#if TAP_MASK
    TapBits inside[TURNS];    // bit kh*KW + kw: that tap of the pixel's window lies inside the image
#else
    int ih0s[TURNS], iw0s[TURNS];  // the window's first row and column; ih0 H past the batch: no tap inside
#endif
    int quad, first_pixel;

    __device__ __forceinline__ PixelCopies(int col0, int total, int group) : quad(threadIdx.x % QUADS), first_pixel(threadIdx.x / QUADS)
    {
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
            const int col = col0 + first_pixel + turn * PIXEL_STEP;
            const bool live = col < total;
            const int n = live ? col / P : 0;
            const int p = live ? col % P : 0;
            const int ih0 = (p / OW) * SH - PH;
            const int iw0 = (p % OW) * SW - PW;
            origin[turn] = ((long long)(n * H + ih0) * W + iw0) * CP + group * CGP;
#if TAP_MASK
            TapBits bits = 0;
#pragma unroll
            for (int j = 0; j < KH * KW; ++j) {
                const bool in = (unsigned)(ih0 + (j / KW) * DH) < (unsigned)H && (unsigned)(iw0 + (j % KW) * DW) < (unsigned)W;
                bits |= (TapBits)(in && live) << j;
            }
            inside[turn] = bits;
#else
            ih0s[turn] = live ? ih0 : H;
            iw0s[turn] = iw0;
#endif
        }
    }

    __device__ __forceinline__ void copy(operand_t* stage, const operand_t* __restrict__ x_big, const operand_t* __restrict__ x_small,
                                         int k0) const
    {
        const int k = k0 + quad * QUAD_VALUES;  // this thread's quad: its window tap and first channel
        const bool in_k = k < KDIM_PADDED;      // the last slice's quads past K are zeros
        const int tap = in_k ? k / CGP : 0;
        const int kh = tap / KW;
        const long long offset = ((long long)(kh * DH) * W + (tap - kh * KW) * DW) * CP + (k - tap * CGP);
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
#if TAP_MASK
            const bool valid = in_k && ((inside[turn] >> tap) & 1);
#else
            const bool valid = in_k && (unsigned)(ih0s[turn] + kh * DH) < (unsigned)H &&
                               (unsigned)(iw0s[turn] + (tap - kh * KW) * DW) < (unsigned)W;
#endif
            const long long from = valid ? origin[turn] + offset : 0;
            const int to = SWIZZLED_AT(first_pixel + turn * PIXEL_STEP, quad * QUAD_VALUES);
            copy_quad(stage + PARTS * A_STAGE + to, x_big + from, valid);
            if (PARTS > 1) copy_quad(stage + PARTS * A_STAGE + B_STAGE + to, x_small + from, valid);
        }
    }
};

// A slice's copies, for produce_slices: the weights' and the image's, of this block's run of slices.
struct SliceCopies {
    const operand_t* __restrict__ x_big;
    const operand_t* __restrict__ x_small;  // null with HALF_OPERANDS, as w_small
    const operand_t* __restrict__ w_big;
    const operand_t* __restrict__ w_small;
    const MapTile& maps;
    const SliceRun& run;
    WeightCopies weights;
    PixelCopies image;

    __device__ __forceinline__ void copy(operand_t* stage, int j) const
    {
        const int k0 = (run.first + j) * BK;
        weights.copy(stage, w_big, w_small, maps, k0);
        image.copy(stage, x_big, x_small, k0);
    }
};

// Calls visit(i, col, m) for each accumulator i of this consumer thread in pixel row `upper` (0: the lane's
// first pixel, 1: the one 8 further) whose output lies inside Y: map m (below map_end) at column col (a
// pixel of the batch, below total)
template <class Visit>
__device__ __forceinline__ void for_each_output_of(int upper, int col0, int m0, int total, int map_end, Visit visit)
{
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int row0 = (threadIdx.x - NTHREADS) / 32 * 16;  // this warp's 16 pixels of the tile
    const int col = col0 + row0 + g + 8 * upper;
    if (col >= total) return;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int m = m0 + 8 * j + 2 * t + q;
            if (m < map_end) visit(4 * j + 2 * upper + q, col, m);
        }
    }
}

// The bias of this consumer thread's maps in a tile (zeros without HAS_BIAS), loaded into registers before the
// tile's slices are multiplied. Read from memory as each output was finished, every load waited behind the
// stores before it (to shared staging, to the NaN flag: pointers the compiler cannot tell apart from b); ncu on
// ResNet-50's 1x1 64->256 in FP16, in the model: long-scoreboard waits were half of all stall cycles, the hottest
// on these adds.
struct MapBias {
    float of_pair[BM / 4];  // maps m0 + 8j + 2t + q at 2j + q

    __device__ __forceinline__ MapBias(const float* __restrict__ b, int m0, int map_end)
    {
        const int t = threadIdx.x % 4;
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int m = m0 + 8 * j + 2 * t + q;
                of_pair[2 * j + q] = HAS_BIAS && m < map_end ? __ldg(b + m) : 0.0f;
            }
        }
    }

    // the bias of accumulator i (4j + 2 upper + q: map m0 + 8j + 2t + q)
    __device__ __forceinline__ float of(int i) const { return of_pair[i / 4 * 2 + i % 2]; }
};

// for_each_output_of both pixel rows: every accumulator of this consumer thread inside Y
template <class Visit>
__device__ __forceinline__ void for_each_output(int col0, int m0, int total, int map_end, Visit visit)
{
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) for_each_output_of(upper, col0, m0, total, map_end, visit);
}

#ifdef Y_CHANNEL_LAST
// The tile's outputs into a channel-last y in the format (a linked Y), through shared memory: a pixel's maps
// are contiguous there, but a lane holds two neighbouring maps of each of eight maps' runs, eight pixels
// apart, so storing from registers would write 4 bytes to each of eight 32-byte sectors an instruction.
// Each consumer warp instead stages its 16 pixels x BM maps in its own rows of `staging` (past the stages:
// the producers are filling those with the next tile's slices meanwhile), then stores whole 16-byte pieces of
// each pixel's run of maps. Needs a group's maps a multiple of 8 (the plan links no other Y).
//
// A residual operand in the same layout comes in the same rows, before the tile's slices are multiplied
// (prefetch_residual): loaded 8 rows at a time after them, each warp had 2 KB in flight and waited for it
// (ncu on ResNet-50's 1x1 64->256 + Add at 56x56 in FP16, in the model: 1 TB/s of DRAM, half the stall
// cycles waits on global loads).
//
// Halves a staged row. An 8x8 matrix of stmatrix or ldmatrix is 16 bytes (words t = 0 to 3) of each of 8 rows g,
// at word g * STAGED_ROW / 2 + t (+ 4j for n8 block j), so its 32 words fall in 32 banks where STAGED_ROW / 2 is 4
// times an odd number: g * STAGED_ROW / 2 mod 32 is then a distinct multiple of 4 for each of the 8 rows g, and t
// adds 0 to 3. BM + 8 is such a row where BM is a multiple of 16 (64: 36 words, 4 x 9; 16: 12, 4 x 3); a tile of
// 8 or 24 maps takes 8 halves more (8: 12 words, 4 x 3; 24: 20, 4 x 5), where BM + 8 alone would put 2 or 4 of the
// words in each bank. A row stays whole 16-byte pieces; their copies to y may still meet 2-way conflicts on 16 to
// 32 maps.
constexpr int STAGED_ROW = BM + 8 + BM % 16;
constexpr int ROW_PIECES = BM / 8;  // 16-byte pieces of a pixel's maps in the tile
#if RESIDUAL && defined(R_CHANNEL_LAST)
#define PREFETCHED_RESIDUAL 1
#else
#define PREFETCHED_RESIDUAL 0
#endif

// This consumer warp's staged rows
__device__ __forceinline__ unsigned short* warp_rows(unsigned short* staging)
{
    return staging + (threadIdx.x - NTHREADS) / 32 * 16 * STAGED_ROW;
}

#if PREFETCHED_RESIDUAL
// Start copying this warp's 16 pixels x BM maps of the residual into its staged rows (zeros past Y's edge);
// store_channel_last waits for them. The rows' last reads, the previous tile's stores, are this warp's own
// and behind it (__syncwarp).
__device__ __forceinline__ void prefetch_residual(const residual_t* __restrict__ r, unsigned short* staging, int col0, int m0,
                                                  int total, int map_end)
{
    const int lane = threadIdx.x % 32;
    const int first = col0 + (threadIdx.x - NTHREADS) / 32 * 16;
    unsigned short* rows = warp_rows(staging);
#pragma unroll
    for (int piece = lane; piece < 16 * ROW_PIECES; piece += 32) {
        const int row = piece / ROW_PIECES, m = m0 + piece % ROW_PIECES * 8;
        const bool inside = first + row < total && m < map_end;
        copy_async16(reinterpret_cast<float*>(rows + row * STAGED_ROW + piece % ROW_PIECES * 8),
                     reinterpret_cast<const float*>(r + (inside ? channel_last_at(first + row, m) : 0)), inside);
    }
    commit_copies();
}
#endif

// stmatrix (x2): lanes 0-15 give the addresses of 16 staged rows; each lane's two registers are its pair of two
// 8 x 8 matrices, rows 0-7 and 8-15, as the accumulators lie (row lane / 4, columns 2 (lane % 4) and one more)
__device__ __forceinline__ void store_matrix_pair(unsigned short* row, unsigned int upper0, unsigned int upper1)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};\n" ::"r"((unsigned int)__cvta_generic_to_shared(row)),
                 "r"(upper0), "r"(upper1) : "memory");
}

// ldmatrix (x2), the other way
__device__ __forceinline__ uint2 load_matrix_pair(const unsigned short* row)
{
    uint2 pair;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(pair.x), "=r"(pair.y)
                 : "r"((unsigned int)__cvta_generic_to_shared(row)) : "memory");
    return pair;
}

// The warp's 16 pixels x BM maps go through its staged rows an 8-map block at a time: the residual's pairs out
// (ldmatrix), the outputs' pairs in (stmatrix), packed in the format two at a time; then whole 16-byte pieces
// of each pixel's maps go to y. Value by value (a two-byte shared load and store each, the NaN check on the value
// converted back), ResNet-50's 1x1 64->256 + Add took 75 us in the model; so, 45 (FP16, batch 32, an H200, ncu).
__device__ __forceinline__ void store_channel_last(const float* acc, const MapBias& bias, unsigned short* staging,
                                                   const residual_t* __restrict__ r, output_t* __restrict__ y, unsigned char* nonfinite, int col0, int m0,
                                                   int total, int map_end)
{
    const int lane = threadIdx.x % 32;
    const int first = col0 + (threadIdx.x - NTHREADS) / 32 * 16;  // the pixel of staged row 0
    unsigned short* rows = warp_rows(staging);
    unsigned short* lane_row = rows + lane % 16 * STAGED_ROW;  // the row whose address this lane gives
    const bool pixel_inside[2] = {first + lane / 4 < total, first + lane / 4 + 8 < total};  // this lane's pixels
    bool flagged = false;
#if PREFETCHED_RESIDUAL
    wait_copies<0>();
    __syncwarp();
#endif
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
        const bool maps_inside = m0 + 8 * j < map_end;  // a group's maps come 8 at a time
        unsigned int pair[2];
#if PREFETCHED_RESIDUAL
        const uint2 residual = load_matrix_pair(lane_row + 8 * j);
#endif
#pragma unroll
        for (int upper = 0; upper < 2; ++upper) {
            const int i = 4 * j + 2 * upper;  // the accumulators of maps 8j + 2 (lane % 4) and one more
#if PREFETCHED_RESIDUAL
            const unsigned int bits = upper ? residual.y : residual.x;
            const float r0 = half_value<R_CHANNEL_LAST>((unsigned short)bits), r1 = half_value<R_CHANNEL_LAST>((unsigned short)(bits >> 16));
#else
            const int col = first + lane / 4 + 8 * upper, m = m0 + 8 * j + 2 * (lane % 4);
            const bool read = pixel_inside[upper] && maps_inside;
            const float r0 = read ? residual_of(r, col, m) : 0.0f, r1 = read ? residual_of(r, col, m + 1) : 0.0f;  // 0 without RESIDUAL
#endif
            pair[upper] = half_pair_bits<Y_CHANNEL_LAST>(finish_output(acc[i] + bias.of(i), r0), finish_output(acc[i + 1] + bias.of(i + 1), r1));
            flagged |= pixel_inside[upper] && maps_inside && half_pair_nonfinite<Y_CHANNEL_LAST>(pair[upper]);
        }
        store_matrix_pair(lane_row + 8 * j, pair[0], pair[1]);
    }
    if (flagged && nonfinite != nullptr)
        *nonfinite = 1;
    __syncwarp();
    for (int piece = lane; piece < 16 * ROW_PIECES; piece += 32) {
        const int row = piece / ROW_PIECES, m = m0 + piece % ROW_PIECES * 8;
        if (first + row < total && m < map_end)
            *reinterpret_cast<uint4*>(y + channel_last_at(first + row, m)) =
                *reinterpret_cast<const uint4*>(rows + row * STAGED_ROW + piece % ROW_PIECES * 8);
    }
    __syncwarp();
}
#endif

AWAITS_PREVIOUS_GRID(conv_wgmma)
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, 1)
conv_wgmma(const operand_t* __restrict__ x_big, const operand_t* __restrict__ x_small, const operand_t* __restrict__ w_big,
           const operand_t* __restrict__ w_small, const float* __restrict__ b, const residual_t* __restrict__ r,
           output_t* __restrict__ y, float* __restrict__ partial, int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    extern __shared__ float4 shared_tiles[];
    const int total = batch * P;
    // the output tiles, pixel tile by pixel tile (a tile's map tiles one after another, so that blocks working
    // at once read the same pixels); a block takes every (gridDim.x * gridDim.y)-th from its own: one with the
    // K split's grid, several where the grid is a block an SM (persistent)
    constexpr int MAP_COLUMN = G * MAP_TILES;
    const int tiles = (total + BN - 1) / BN * MAP_COLUMN, tile_step = gridDim.x * gridDim.y;
    const int first_tile = blockIdx.y * gridDim.x + blockIdx.x;
    const SliceRun run;
    unsigned long long *full, *empty;
    operand_t* stages = stage_memory(shared_tiles, full, empty);

    if (threadIdx.x < NTHREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS));
        // the producers run ahead into the next tile while the consumers finish this one's epilogue
        for (int tile = first_tile, before = 0; tile < tiles; tile += tile_step, before += run.count) {
            const MapTile maps(tile % MAP_COLUMN);
            const SliceCopies copies{x_big, x_small, w_big, w_small, maps, run, WeightCopies(), PixelCopies(tile / MAP_COLUMN * BN, total, maps.group)};
            produce_slices(copies, run.count, stages, full, empty, before);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS));
#ifdef Y_CHANNEL_LAST
    unsigned short* staging = reinterpret_cast<unsigned short*>(empty + STAGES);  // past the mbarriers
#endif
#pragma unroll 1
    for (int tile = first_tile, before = 0; tile < tiles; tile += tile_step, before += run.count) {
        const MapTile maps(tile % MAP_COLUMN);
        const int col0 = tile / MAP_COLUMN * BN, m0 = maps.first;
#if KSLICES == 1
#ifdef Y_CHANNEL_LAST
        const MapBias bias(b, m0, maps.end);
#if PREFETCHED_RESIDUAL
        prefetch_residual(r, staging, col0, m0, total, maps.end);
#endif
#endif
#endif
        float acc[ACC];
        consume_slices(acc, run.count, stages, full, empty, before);

#if KSLICES == 1
#ifdef Y_CHANNEL_LAST
        store_channel_last(acc, bias, staging, r, y, nonfinite, col0, m0, total, maps.end);
#else
        // the residual values of a pixel row (none without RESIDUAL: residual_of gives 0), loaded before its
        // first store: one wait on memory for half the tile rather than one a value. On an H200, ResNet-50's
        // 64->256 1x1 + Add + Relu at batch 32 in FP16: 0.349 ms loading each value as it was stored, 0.146 ms
        // loading the whole tile's first (the same Conv without its Add: 0.098 ms). Half a tile at a time keeps
        // 3xTF32's 512-thread tile within its registers (the whole spilled once a block looped over tiles).
#pragma unroll
        for (int upper = 0; upper < 2; ++upper) {
            float res[ACC / 2];  // accumulator 4j + 2 upper + q's at 2j + q
            for_each_output_of(upper, col0, m0, total, maps.end, [&](int i, int col, int m) { res[i / 4 * 2 + i % 2] = residual_of(r, col, m); });
            for_each_output_of(upper, col0, m0, total, maps.end,
                               [&](int i, int col, int m) { store_finished(y, b, nonfinite, col, m, acc[i], res[i / 4 * 2 + i % 2]); });
        }
#endif
#else
        for_each_output(col0, m0, total, maps.end, [&](int i, int col, int m) { store_sum(y, partial, b, r, nonfinite, total, col, m, acc[i]); });
#endif
    }
}
