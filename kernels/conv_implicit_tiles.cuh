// conv_implicit_tiles: what the pipelined implicit-GEMM kernels (conv_tc_gemm, the
// tensor cores; conv_simt_gemm, FP32 FMAs) share: the __constant__ table of im2col
// taps, the cp.async copies, the A tile of weight rows, the B tile gathered straight
// from the image, and the split-K reduction.
//
// The includer defines the shape macros and BM, BN, BK, NTHREADS, A_STRIDE and
// B_STRIDE (floats per A and B row in shared memory), A_VEC (4: 16-byte weight
// copies), B_VEC (4: a 1x1 stride-1 unpadded conv copies four neighbouring pixels
// at once), TAP_MASK, KPAD and KSLICES, and includes conv_epilogue.cuh. B rows are
// k = (c, kh, kw) of KDIM = C/G*KH*KW (one group's input channels), columns the output
// pixels (n, oh, ow) of the batch.
//
// X may be a view whose images lie `x_image` floats apart (a channel slice of a larger buffer:
// DenseNet's Concat), each image's C x H x W values contiguous.
//
// The prologue (PROLOGUE, opplugin/ops/conv/prologue.py) transforms each B value inside the image
// after it lands in shared memory, before the slice is multiplied: 1, x * pro[n * C + c] (a per-
// (image, channel) scale); 2, PROLOGUE_ACTIVATION(fmaf(x, pro[c], pro[C + c])) (a per-channel
// affine, then an activation). A padded position (zero-filled) is left as it is.
//
// Groups: each group is a GEMM of its own MG maps, K over its CG input channels. A block's
// map tile lies inside one group (MapTile): grid y runs over the groups' map tiles, the A
// rows stop at the group's last map, and the B gather starts at the group's first channel.

#define CG (C / G)  // input channels per group
#define MG (M / G)  // output maps per group
#define KDIM (CG * KH * KW)
#define MAP_TILES ((MG + BM - 1) / BM)  // BM-map tiles of one group
#define P (OH * OW)
#define NO_TAP 0x3fff  // kh*DH of a k past KDIM: no pixel row is that far down
#ifndef PROLOGUE
#define PROLOGUE 0
#endif
#ifndef PROLOGUE_ACTIVATION
#define PROLOGUE_ACTIVATION(v) (v)
#endif

#ifdef B_STRIDE  // the includer gathers its B tile from the image here (conv_wgmma copies a channel-last one)
// k -> {c*H*W + kh*DH*W + kw*DW, the tap's place}; filled by the host. The place is
// kh*KW + kw with TAP_MASK (windows of at most 63 taps: a thread keeps a bit per tap
// saying whether it lies inside the image for its column; rows past K get KH*KW, a
// bit that is never set), else (kh*DH << 16) | kw*DW for a bounds test (rows past K:
// NO_TAP << 16).
//
// TAPS_BY_CHANNEL: K is past what 64 KiB of __constant__ rows hold (a 3x3 Conv over more than
// 910 channels), so the table holds channel 0's window (KH*KW rows) and one row for past K,
// and a k = c*KH*KW + j adds c*H*W to row j (a division by a compile-time constant). Only with
// TAP_MASK: with the packed bounds test too, the 64x128 tile spills on sm_80 (255 registers).
#ifndef TAPS_BY_CHANNEL
#define TAPS_BY_CHANNEL 0
#endif
#if TAPS_BY_CHANNEL
__constant__ int2 taps[KH * KW + 1];

__device__ __forceinline__ int2 tap_at(int k)
{
    if (k >= KDIM) return taps[KH * KW];
    const int c = k / (KH * KW);
    int2 tap = taps[k - c * (KH * KW)];
    tap.x += c * (H * W);
    return tap;
}
#else
__constant__ int2 taps[KPAD];

__device__ __forceinline__ int2 tap_at(int k) { return taps[k]; }
#endif

#endif

#include "async_copy.cuh"
#include "grid_dependency.cuh"

// The maps of map tile `tile` (of G * MAP_TILES: grid y, where a block has one tile), [first, end), inside group
// `group`.
struct MapTile {
    int group, first, end;
    __device__ __forceinline__ explicit MapTile(int tile = (int)blockIdx.y)
        : group(tile / MAP_TILES),
          first(group * MG + tile % MAP_TILES * BM),
          end(group * MG + MG) {}
};

// A bit per tap of a window and one more (the rows past K): 32 bits where they fit, since a 64-bit
// shift and test cost three more instructions a copy.
#if KH * KW < 32
typedef unsigned int TapBits;
#else
typedef unsigned long long TapBits;
#endif

#ifdef B_STRIDE
// The B columns this thread copies: the same for every k slice.
struct Columns {
#if TAP_MASK
    TapBits inside;  // bit kh*KW + kw: that tap of this column's window lies inside the image
#endif
#if B_VEC == 4
    static constexpr int GROUPS = BN / 4;  // 4-pixel groups per tile row
#else
    static constexpr int GROUPS = BN;
#endif
    static constexpr int ROW_STEP = NTHREADS / GROUPS;
    static constexpr int ROWS = BK / ROW_STEP;  // rows of a slice this thread copies
    int first_row;
    int column;          // within the tile
    long long origin;    // x offset of (image, the group's channel 0, ih0, iw0); ih0, iw0 may be negative (pads)
    int ih0, iw0;
    int image;           // n of this column (its 4-pixel group lies in one image)
    bool live;           // column inside the batch

    __device__ __forceinline__ Columns(int col0, int total, int group, int x_image)
    {
        const int piece = threadIdx.x % GROUPS;  // consecutive threads on consecutive columns
        first_row = threadIdx.x / GROUPS;
#if B_VEC == 4
        column = piece * 4;
#else
        column = piece;
#endif
        const int col = col0 + column;
        live = col < total;
        const int q = live ? col : 0;
        const int n = q / P;
        const int p = q % P;
        image = n;
        ih0 = (p / OW) * SH - PH;
        iw0 = (p % OW) * SW - PW;
        origin = (long long)n * x_image + (long long)group * (CG * H * W) + (long long)ih0 * W + iw0;
#if TAP_MASK
        inside = 0;
#pragma unroll
        for (int j = 0; j < KH * KW; ++j) {
            const bool in = (unsigned)(ih0 + (j / KW) * DH) < (unsigned)H && (unsigned)(iw0 + (j % KW) * DW) < (unsigned)W;
            inside |= (TapBits)(in && live) << j;
        }
#endif
    }
};

// Whether B row `tap` of this thread's column lies inside the image (and K, and the batch).
__device__ __forceinline__ bool tap_inside(const Columns& cols, int2 tap)
{
#if TAP_MASK
    return (cols.inside >> tap.y) & 1;  // tap.y: the tap's index in the window, KH*KW past K
#else
    const int dh = tap.y >> 16;
    const int dw = tap.y & 0xffff;
    return cols.live && (unsigned)(cols.ih0 + dh) < (unsigned)H && (unsigned)(cols.iw0 + dw) < (unsigned)W;
#endif
}

// Copies this thread's share of the BK x BN B slice from k0 on, gathered from the image.
__device__ __forceinline__ void copy_b_slice(float* Bs, const float* __restrict__ x, const Columns& cols, int k0)
{
#pragma unroll
    for (int i = 0; i < Columns::ROWS; ++i) {
        const int row = cols.first_row + i * Columns::ROW_STEP;
        const int2 tap = tap_at(k0 + row);
        const bool valid = tap_inside(cols, tap);
#if B_VEC == 4
        copy_async16(Bs + row * B_STRIDE + cols.column, valid ? x + (cols.origin + tap.x) : x, valid);
#else
        copy_async4(Bs + row * B_STRIDE + cols.column, valid ? x + (cols.origin + tap.x) : x, valid);
#endif
    }
}

// The prologue on this thread's share of the B slice from k0 on (what copy_b_slice copied, landed):
// each value inside the image transformed in place; none without PROLOGUE.
__device__ __forceinline__ void prologue_b_slice(float* Bs, const float* __restrict__ pro, const Columns& cols, int k0)
{
#if PROLOGUE
#pragma unroll
    for (int i = 0; i < Columns::ROWS; ++i) {
        const int row = cols.first_row + i * Columns::ROW_STEP;
        const int k = k0 + row;
        if (!tap_inside(cols, tap_at(k))) continue;  // zero-filled: padding, or past K or the batch
        const int c = (int)blockIdx.y / MAP_TILES * CG + k / (KH * KW);  // the input channel of row k
#if PROLOGUE == 1
        const float s = __ldg(pro + (size_t)cols.image * C + c);
#else
        const float a = __ldg(pro + c);
        const float b = __ldg(pro + C + c);
#endif
        float* at = Bs + row * B_STRIDE + cols.column;
#pragma unroll
        for (int j = 0; j < B_VEC; ++j) {
            const float v = at[j];
#if PROLOGUE == 1
            at[j] = v * s;
#else
            at[j] = PROLOGUE_ACTIVATION(fmaf(v, a, b));
#endif
        }
    }
#endif
}

#endif

#ifdef A_STRIDE  // else the includer lays out and copies its weight tile itself (conv_wgmma)
#define A_PIECES (BM * BK / A_VEC)
static_assert(A_PIECES % NTHREADS == 0 || A_PIECES < NTHREADS, "every thread copies as many A pieces, or at most one");

// Copies this thread's share of the BM x BK weight slice (the tile's rows, columns k0..) into As,
// A_VEC floats a copy; pieces past the group's maps or KDIM are zero-filled.
__device__ __forceinline__ void copy_weights(float* As, const float* __restrict__ w, const MapTile& maps, int k0)
{
#pragma unroll
    for (int turn = 0; turn < (A_PIECES + NTHREADS - 1) / NTHREADS; ++turn) {
        const int piece = turn * NTHREADS + threadIdx.x;
        if (A_PIECES < NTHREADS && piece >= A_PIECES) break;  // a small tile: fewer pieces than threads
        constexpr int PIECES_PER_ROW = BK / A_VEC;
        const int m = piece / PIECES_PER_ROW;
        const int k = piece % PIECES_PER_ROW * A_VEC;
        const int m0 = maps.first;
        const bool inside = m0 + m < maps.end && k0 + k < KDIM;
        const float* from = inside ? w + ((size_t)(m0 + m) * KDIM + k0 + k) : w;
#if A_VEC == 4
        copy_async16(As + m * A_STRIDE + k, from, inside);
#else
        copy_async4(As + m * A_STRIDE + k, from, inside);
#endif
    }
}
#endif

// Where output map m at column col (a pixel of the batch) lies in an NCHW tensor ([batch][M][P]), and in a
// channel-last one ([batch][P][M]).
__device__ __forceinline__ size_t nchw_at(int col, int m) { return (size_t)(col / P) * (M * P) + col % P + (size_t)m * P; }
__device__ __forceinline__ size_t channel_last_at(int col, int m) { return (size_t)col * M + m; }

// Y_CHANNEL_LAST and R_CHANNEL_LAST (1 FP16, 2 BF16; conv_wgmma in that format alone): y, or the residual
// operand, is channel-last in the format's bits, as the next half-precision Conv reads its image, rather
// than FP32 NCHW (a link the plan made between two such steps: opplugin/plan/channel_last.py)
#if defined(Y_CHANNEL_LAST) || defined(R_CHANNEL_LAST)
#include "half_bits.cuh"
#endif
#ifdef Y_CHANNEL_LAST
typedef unsigned short output_t;
__device__ __forceinline__ size_t output_at(int col, int m) { return channel_last_at(col, m); }
__device__ __forceinline__ output_t stored(float v) { return half_bits<Y_CHANNEL_LAST>(v); }
__device__ __forceinline__ float stored_value(output_t v) { return half_value<Y_CHANNEL_LAST>(v); }
#else
typedef float output_t;
__device__ __forceinline__ size_t output_at(int col, int m) { return nchw_at(col, m); }
__device__ __forceinline__ output_t stored(float v) { return v; }
__device__ __forceinline__ float stored_value(output_t v) { return v; }
#endif
#ifdef R_CHANNEL_LAST
typedef unsigned short residual_t;
#else
typedef float residual_t;
#endif

// The residual operand of output map m at column col (0 without RESIDUAL: conv_epilogue.cuh's residual_at).
__device__ __forceinline__ float residual_of(const residual_t* __restrict__ r, int col, int m)
{
#ifdef R_CHANNEL_LAST
    return RESIDUAL ? half_value<R_CHANNEL_LAST>(__ldg(r + channel_last_at(col, m))) : 0.0f;
#else
    return residual_at(r, nchw_at(col, m));
#endif
}

// The sum v of output map m at column col into y, finished by the epilogue (bias, `res`: the residual
// at the output's own index, the activation) and flagged if not finite as stored (a value past FP16's
// range is an infinity in a linked y).
__device__ __forceinline__ void store_finished(output_t* __restrict__ y, const float* __restrict__ b, unsigned char* nonfinite,
                                               int col, int m, float v, float res)
{
#if HAS_BIAS
    v += b[m];
#endif
    const output_t out = stored(finish_output(v, res));
    y[output_at(col, m)] = out;
    flag_nonfinite(nonfinite, stored_value(out));
}

// The sum v of output map m at column col: into y (store_finished, the residual read here), or with a
// K split into this block's slice of `partial` ([KSLICES][M][total]) for conv_k_slices_reduce.
__device__ __forceinline__ void store_sum(output_t* __restrict__ y, float* __restrict__ partial, const float* __restrict__ b,
                                          const residual_t* __restrict__ r, unsigned char* nonfinite, int total, int col, int m, float v)
{
#if KSLICES == 1
    store_finished(y, b, nonfinite, col, m, v, residual_of(r, col, m));
#else
    partial[((size_t)blockIdx.z * M + m) * total + col] = v;
#endif
}

// The KSLICES partial sums of one output (`apart` floats apart), every one loaded before the first is added, then
// added in slice order. Added as each arrived, a thread waited on memory KSLICES times: ResNet-50's reduces at
// batch 1 in FP16 took 4-7 us each for 1-3 MB (ncu, an H200), 40% of the model's GPU time.
struct SliceSums {
    float part[KSLICES];

    __device__ __forceinline__ void load(const float* __restrict__ sums, size_t apart, bool inside)
    {
#pragma unroll
        for (int s = 0; s < KSLICES; ++s) part[s] = inside ? sums[s * apart] : 0.0f;
    }

    __device__ __forceinline__ float total() const
    {
        float v = 0.0f;
#pragma unroll
        for (int s = 0; s < KSLICES; ++s) v += part[s];
        return v;
    }
};

// y[n][m][p] (with Y_CHANNEL_LAST y[n][p][m] in the format) = the epilogue of (sum of the KSLICES partial
// sums + bias), slices added in order; nonfinite (null: not watched) raised where an output is NaN or Inf
AWAITS_PREVIOUS_GRID(conv_k_slices_reduce)
extern "C" __global__ void __launch_bounds__(256)
conv_k_slices_reduce(const float* __restrict__ partial, const float* __restrict__ b, const residual_t* __restrict__ r,
                     output_t* __restrict__ y, int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    const int total = batch * P;
    const size_t apart = (size_t)M * total;  // between one slice's partial sums and the next's
#ifdef Y_CHANNEL_LAST
    // a linked y: tiles of 32 columns x 32 maps, summed reading along the columns (as `partial` lies) and
    // stored along the maps (as y lies) through shared memory; blockDim.x is 256, each thread's four maps
    // 8 apart loaded at once
    __shared__ float tile[32][33];
    const int lane = threadIdx.x % 32, row = threadIdx.x / 32;
    const int col_tiles = (total + 31) / 32;
    const int tiles = col_tiles * ((M + 31) / 32);
    for (int at = blockIdx.x; at < tiles; at += gridDim.x) {
        const int c0 = at % col_tiles * 32, mt = at / col_tiles * 32;
        SliceSums sums[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = c0 + lane, m = mt + row + 8 * i;
            sums[i].load(partial + (size_t)m * total + col, apart, col < total && m < M);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float v = sums[i].total();
#if HAS_BIAS
            const int m = mt + row + 8 * i;
            if (m < M) v += b[m];
#endif
            tile[row + 8 * i][lane] = v;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = row + 8 * i, col = c0 + k, m = mt + lane;
            if (col < total && m < M) {
                const output_t out = stored(finish_output(tile[lane][k], residual_of(r, col, m)));
                y[channel_last_at(col, m)] = out;
                flag_nonfinite(nonfinite, stored_value(out));
            }
        }
        __syncthreads();
    }
#else
    const size_t outputs = (size_t)batch * M * P;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < outputs; i += (size_t)gridDim.x * blockDim.x) {
        const int n = (int)(i / (M * P));
        const int m = (int)(i / P % M);
        const int p = (int)(i % P);
        SliceSums sums;
        sums.load(partial + (size_t)m * total + n * P + p, apart, true);
        float v = sums.total();
#if HAS_BIAS
        v += b[m];
#endif
        const output_t out = stored(finish_output(v, residual_of(r, n * P + p, m)));
        y[i] = out;
        flag_nonfinite(nonfinite, stored_value(out));
    }
#endif
}

// The run of BK slices that block z of KSLICES multiplies: [first, first + count); count is 0
// or less for a last block that K does not reach. The includer defines KTILES (slices in K).
struct SliceRun {
    static constexpr int LENGTH = (KTILES + KSLICES - 1) / KSLICES;
    int first, count;
    __device__ __forceinline__ SliceRun() : first((int)blockIdx.z * LENGTH), count(min(KTILES - first, LENGTH)) {}
};
