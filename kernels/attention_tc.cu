// attention_tc: softmax(Q K^T * SCALE [+ BIAS]) V for each output matrix j, the attention block as
// exporters write it (MatMul > [Mul or Div by a constant] > [Add] > Softmax over the keys > MatMul),
// in one kernel that never writes the scores to memory.
//
// A block takes BQ = 64 queries of one matrix and walks the keys 64 at a time (online softmax, as
// FlashAttention does): per key tile it computes the 64 x 64 scores on the tensor cores in 3xTF32
// (tf32_mma.cuh: an error of FP32's order against float64) or plain TF32 (SPLIT, below), scales them,
// adds the bias, and updates each query's running maximum and sum; the probabilities, through shared
// memory, multiply the V tile into the running output, rescaled by exp(old max - new max). The output
// is divided by the sum once, at the end. The K^T and V tiles are staged in shared memory by cp.async,
// one step ahead: the next K^T tile is copied during this tile's softmax and PV, the next V tile during
// the next scores.
//
// Operands as the graph has them: Q [.., TQ, D], K^T [.., D, TK] (the first MatMul's B), V [.., TK, DV],
// BIAS [.., TQ, TK], out [.., TQ, DV], each with strides of its own (in floats), so that a view reads
// as it lies: K^T as a transposed view of K, Q, K and V as slices of one QKV projection, the output
// written through a transposed view (heads merged). Element (r, c) of matrix j of operand X is at
// X + offset_of(j, X) + r * X_ROW + c * X_COL; the leading axes broadcast as numpy does (the
// output's axes OUT_DIM1.. and each operand's X_STRIDE<i>, 0 where it broadcasts). D and DV are at
// most 64; tiles past TQ, TK, D and DV are zero-filled, and the scores of keys past TK are -inf.
// K's tile is staged [key][d] as Q's is [query][d], so that the score product reads both in float4s;
// that is how K lies when K^T is a transposed view of it, as exporters write it (a K^T with its keys
// contiguous is copied a float at a time).
//
// Arithmetic: the scores as ONNX has them (the FP32 product, times SCALE, plus the bias), then kept
// times log2(e) so that the softmax in FP32 runs on exp2f. Both products are 3xTF32 with SPLIT 1 (the
// default, `attention.3xtf32`): FP32's error. SPLIT 0 (`attention.tf32`, what a run in a reduced
// precision asks for) multiplies Q, K^T, the probabilities and V rounded once to TF32, one MMA in
// place of three: TF32's unit roundoff 2^-11, as FP16's, with FP32's range, so no value past FP16's
// 65504 overflows. Neither is NaN/Inf-exact: an infinite operand turns into NaN in the 3xTF32 split,
// and TF32's rounding takes a value within 2^-12 of FP32's largest to infinity; the runner watches
// this kernel (nonfinite) and reruns such chunks on the nodes one by one.
//
// Macros: TQ, TK, D, DV, SCALE (a float literal), HAS_BIAS, BATCH_RANK, OUT_DIM<i>, SPLIT (1 when not
// given), and for X in Q, KT, V, BIAS and OUT: X_ROW, X_COL, X_STRIDE<i>, and X_ALIGNED (1: X starts
// on 16 bytes and its X_STRIDE<i> are multiples of four floats). Launch: block 256, grid (ceil(TQ /
// 64), matrices), dynamic shared memory SHARED_FLOATS floats (below; attention.py's shared_bytes).
#include "watch_flag.cuh"
#include "async_copy.cuh"

#define BQ 64     // queries a block
#define BKEY 64   // keys a tile
#define PAD_D 64  // D and DV, padded
#define BK 32     // the k depth of one tf32_slice
#define WM 32     // a warp's part of a 64 x 64 product: 2 x 4 warps
#define WN 16
#ifndef SPLIT
#define SPLIT 1  // 3xTF32; 0: plain TF32 (above)
#endif
#define WARPS_N (64 / WN)
#define NTHREADS 256
#define A_STRIDE (64 + 4)  // Q's and P's tiles, [row][k]
#define B_ROW (64 + 8)     // V's tile [key][dv]
#define B_K_STEP B_ROW
#define B_N_STEP 1
#include "tf32_mma.cuh"

#define Q_TILE (BQ * A_STRIDE)
#define Q_PARTS (SPLIT ? 2 : 1)  // Q's tile as its TF32 big parts, and with SPLIT its small ones
#define B_TILE (64 * B_ROW)
#define SHARED_FLOATS ((Q_PARTS + 1) * Q_TILE + 2 * B_TILE + 3 * BQ)
#define NEG_INF __int_as_float(0xff800000)
#define LOG2E 1.44269504088896340736f  // the scores are kept in base 2: exp2f is a few instructions shorter than expf
#define ROW_THREADS (NTHREADS / BQ)  // threads that share a row's softmax update: 4, neighbouring lanes

static_assert(D <= PAD_D && DV <= PAD_D, "a head of at most 64 values");

#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif

// where matrix j of an operand starts, its leading axes broadcast (strides 0) as the output's
__device__ __forceinline__ long long offset_of(long long j, long long s0, long long s1, long long s2, long long s3)
{
    long long at = 0;
#if BATCH_RANK > 3
    at += (j % OUT_DIM3) * s3;
    j /= OUT_DIM3;
#endif
#if BATCH_RANK > 2
    at += (j % OUT_DIM2) * s2;
    j /= OUT_DIM2;
#endif
#if BATCH_RANK > 1
    at += (j % OUT_DIM1) * s1;
    j /= OUT_DIM1;
#endif
    return at + j * s0;
}
#define OFFSET(j, X) offset_of(j, X##_STRIDE0, X##_STRIDE1, X##_STRIDE2, X##_STRIDE3)

// the 64 x 64 tile at (row0, col0) of a matrix whose element (r, c) is at from[r * ROW + c * COL], into
// tile[r * TILE_ROW + c * TILE_COL], zero where row >= rows or col >= cols. Neighbouring threads take
// neighbouring columns, or neighbouring rows where those lie next to each other in memory instead.
// Where that contiguous axis stays contiguous in the tile and every four floats along it start on 16
// bytes (ALIGNED, and the other axis's stride a multiple of four), a thread copies four floats at once:
// a quarter of the copies, and of the index arithmetic that was most of this kernel's integer work.
template <long long ROW, long long COL, int TILE_ROW, int TILE_COL, bool ALIGNED>
__device__ __forceinline__ void copy_tile(float* tile, const float* __restrict__ from, int row0, int rows, int col0, int cols)
{
    constexpr bool down = COL != 1 && ROW == 1;
    constexpr bool in_fours = ALIGNED && (down ? TILE_ROW == 1 && COL % 4 == 0 : COL == 1 && TILE_COL == 1 && ROW % 4 == 0);
    if constexpr (in_fours) {
#pragma unroll 1
        for (int i = threadIdx.x; i < 64 * 16; i += NTHREADS) {
            const int along = i % 16 * 4, across = i / 16;  // 16 threads a line of 64 floats
            const int r = down ? along : across, c = down ? across : along;
            const int left = down ? rows - (row0 + r) : cols - (col0 + c);  // floats of the line from here on
            const bool line = down ? col0 + c < cols : row0 + r < rows;
            const int bytes = line && left > 0 ? 4 * min(left, 4) : 0;  // the rest of the 16 zero-filled
            copy_async16_part(tile + r * TILE_ROW + c * TILE_COL, bytes ? from + (row0 + r) * ROW + (col0 + c) * COL : from, bytes);
        }
        return;
    }
#pragma unroll 4
    for (int i = threadIdx.x; i < 64 * 64; i += NTHREADS) {
        const int r = down ? i % 64 : i / 64, c = down ? i / 64 : i % 64;
        const bool valid = row0 + r < rows && col0 + c < cols;
        copy_async4(tile + r * TILE_ROW + c * TILE_COL, valid ? from + (row0 + r) * ROW + (col0 + c) * COL : from, valid);
    }
}

__device__ __forceinline__ float element(const float4& x, int i) { return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w; }

// acc += the warp's part of the scores over one BK-deep slice of d, from Q's tile in TF32 parts
// (prepare_q: Qs the big parts, Qsmall the small ones with SPLIT; [query][d]) and K's tile as it landed
// ([key][d], split or rounded here), all A_STRIDE apart. A product's k order within the slice is free,
// so lane t of a quad takes d = 8t .. 8t + 7 across the slice's four MMA steps (step s: 8t + 2s as its
// k = t, 8t + 2s + 1 as t + 4) in place of t and t + 4 of each step: a row's eight values come in two
// float4 loads, not eight scalar ones. Banks: the eight lanes of a quarter-warp read rows g, g + 1 at
// 8t, all 32 banks once.
__device__ __forceinline__ void score_slice(float (&acc)[MT][NT][4], const float* Qs, const float* Qsmall, const float* Ks, int warp_m,
                                            int warp_n)
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    add_slice(acc, [&](float (&part)[MT][NT][4]) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float4 a[MT][2], a_rest[MT][2], b[NT];  // a_rest: Q's small parts, read with SPLIT alone
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int up = 0; up < 2; ++up) {
                    const int at = (warp_m * WM + mt * 16 + g + 8 * up) * A_STRIDE + 8 * t + 4 * half;
                    a[mt][up] = *reinterpret_cast<const float4*>(Qs + at);
                    if (SPLIT) a_rest[mt][up] = *reinterpret_cast<const float4*>(Qsmall + at);
                }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) b[nt] = *reinterpret_cast<const float4*>(Ks + (warp_n * WN + nt * 8 + g) * A_STRIDE + 8 * t + 4 * half);
#pragma unroll
            for (int step = 0; step < 2; ++step) {
                unsigned int a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];  // the small parts unused without SPLIT
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                    for (int r = 0; r < 4; ++r) {  // a0 = [g][t], a1 = [g + 8][t], a2 = [g][t + 4], a3 = [g + 8][t + 4]
                        const int up = r % 2, at = 2 * step + r / 2;
                        a_big[mt][r] = __float_as_uint(element(a[mt][up], at));
                        if (SPLIT) a_small[mt][r] = __float_as_uint(element(a_rest[mt][up], at));
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    fragment_value(element(b[nt], 2 * step), b_big[nt][0], b_small[nt][0]);  // b0 = [t][g]
                    fragment_value(element(b[nt], 2 * step + 1), b_big[nt][1], b_small[nt][1]);  // b1 = [t + 4][g]
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_parts(part[mt][nt], a_big[mt], a_small[mt], b_big[nt], b_small[nt]);
            }
        }
    });
}

// v as its TF32 big part (rounded to nearest), `small` the exact rest with SPLIT (fragment_value's parts, as floats)
__device__ __forceinline__ void to_parts(float& v, float& small)
{
    unsigned int big, rest = 0;
    fragment_value(v, big, rest);
    v = __uint_as_float(big), small = __uint_as_float(rest);
}

// Q's tile in TF32 parts, once, where every key tile's product would make them again: the big parts in
// place, and with SPLIT the small ones in Qsmall
__device__ __forceinline__ void prepare_q(float* Qs, float* Qsmall)
{
#pragma unroll
    for (int i = threadIdx.x; i < BQ * 16; i += NTHREADS) {
        const int at = i / 16 * A_STRIDE + i % 16 * 4;
        float4 big = *reinterpret_cast<float4*>(Qs + at), small;
        to_parts(big.x, small.x), to_parts(big.y, small.y), to_parts(big.z, small.z), to_parts(big.w, small.w);
        *reinterpret_cast<float4*>(Qs + at) = big;
        if (SPLIT) *reinterpret_cast<float4*>(Qsmall + at) = small;
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 2)
attention_tc(const float* __restrict__ q, const float* __restrict__ kt, const float* __restrict__ v, const float* __restrict__ bias,
             float* __restrict__ out, int first, unsigned char* nonfinite)
{
    extern __shared__ float4 shared_tiles[];
    float* Qs = reinterpret_cast<float*>(shared_tiles);  // Q's tile, then its TF32 big parts
    float* Qsmall = Qs + Q_TILE;                           // ... and small ones (SPLIT; never read without)
    float* Ps = Qs + Q_PARTS * Q_TILE;  // the scores, then the probabilities, of the key tile
    float* KTs = Ps + Q_TILE;     // K's tile [key][d] whichever way K^T lies
    float* Vs = KTs + B_TILE;
    float* row_max = Vs + B_TILE;
    float* row_sum = row_max + BQ;
    float* row_scale = row_sum + BQ;

    const long long j = (long long)first + blockIdx.y;
    const int q0 = blockIdx.x * BQ;
    q += OFFSET(j, Q);
    kt += OFFSET(j, KT);
    v += OFFSET(j, V);
#if HAS_BIAS
    bias += OFFSET(j, BIAS);
#endif
    out += OFFSET(j, OUT);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const int g = lane / 4, t = lane % 4;

    // the copies run one step ahead of the arithmetic, in commit groups that alternate K^T and V: the
    // next K^T tile lands while this tile's softmax and PV run, the next V tile while its scores do
    copy_tile<Q_ROW, Q_COL, A_STRIDE, 1, Q_ALIGNED>(Qs, q, q0, TQ, 0, D);
    copy_tile<KT_ROW, KT_COL, 1, A_STRIDE, KT_ALIGNED>(KTs, kt, 0, D, 0, TK);
    commit_copies();
    copy_tile<V_ROW, V_COL, B_ROW, 1, V_ALIGNED>(Vs, v, 0, TK, 0, DV);
    commit_copies();
    if (threadIdx.x < BQ) {
        row_max[threadIdx.x] = NEG_INF;
        row_sum[threadIdx.x] = 0.0f;
    }
    wait_copies<1>();
    __syncthreads();
    prepare_q(Qs, Qsmall);
    float o[MT][NT][4];
    zero_tiles(o);

    for (int k0 = 0; k0 < TK; k0 += BKEY) {
        wait_copies<1>();  // Q and this K^T tile have landed; this V tile may still be on its way
        __syncthreads();

        // the scores of this key tile: Q K^T over D, scaled, the bias added, keys past TK at -inf
        float s[MT][NT][4];
        zero_tiles(s);
        score_slice(s, Qs, Qsmall, KTs, warp_m, warp_n);
        if (D > BK) score_slice(s, Qs + BK, Qsmall + BK, KTs + BK, warp_m, warp_n);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const int row = warp_m * WM + mt * 16 + g + 8 * (r / 2);
                    const int col = warp_n * WN + nt * 8 + 2 * t + r % 2;
                    float score = s[mt][nt][r] * SCALE;
#if HAS_BIAS
                    if (q0 + row < TQ && k0 + col < TK) score += __ldg(bias + (q0 + row) * BIAS_ROW + (k0 + col) * BIAS_COL);
#endif
                    score *= LOG2E;
                    Ps[row * A_STRIDE + col] = k0 + col < TK ? score : NEG_INF;
                }
        __syncthreads();  // K^T's tile is read: the next one may land there
        if (k0 + BKEY < TK) copy_tile<KT_ROW, KT_COL, 1, A_STRIDE, KT_ALIGNED>(KTs, kt, 0, D, k0 + BKEY, TK);
        commit_copies();  // an empty group past the last tile keeps the count in step

        // each row's running maximum and sum, by the ROW_THREADS neighbouring lanes that share it
        {
            const int row = threadIdx.x / ROW_THREADS, part = threadIdx.x % ROW_THREADS;
            float* scores = Ps + row * A_STRIDE;
            float tile_max = NEG_INF;
#pragma unroll
            for (int c = part; c < BKEY; c += ROW_THREADS) {
                const float x = scores[c];
                tile_max = (x > tile_max || x != x) ? x : tile_max;  // a NaN wins, as in Softmax
            }
#pragma unroll
            for (int step = ROW_THREADS / 2; step > 0; step /= 2) {
                const float other = __shfl_xor_sync(0xffffffffu, tile_max, step);
                tile_max = (other > tile_max || other != other) ? other : tile_max;
            }
            const float old_max = row_max[row];
            const float new_max = old_max > tile_max ? old_max : tile_max;
            // every score so far -inf (a mask): exp2(-inf - 0) adds nothing yet, where -inf - -inf would be NaN
            const float shift = new_max == NEG_INF ? 0.0f : new_max;
            float tile_sum = 0.0f;
#pragma unroll
            for (int c = part; c < BKEY; c += ROW_THREADS) {
                const float p = exp2f(scores[c] - shift);
                scores[c] = p;
                tile_sum += p;
            }
#pragma unroll
            for (int step = ROW_THREADS / 2; step > 0; step /= 2) tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, step);
            __syncwarp();
            if (part == 0) {
                const float scale = old_max == NEG_INF ? 0.0f : exp2f(old_max - new_max);  // nothing summed yet: no NaN
                row_scale[row] = scale;
                row_sum[row] = row_sum[row] * scale + tile_sum;
                row_max[row] = new_max;
            }
        }
        wait_copies<1>();  // this V tile has landed; the next K^T tile may still be on its way
        __syncthreads();

        // the running output, rescaled, plus the probabilities times the V tile
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const float scale = row_scale[warp_m * WM + mt * 16 + g + 8 * (r / 2)];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) o[mt][nt][r] *= scale;
            }
        tf32_slice(o, Ps, Vs, warp_m, warp_n);
        tf32_slice(o, Ps + BK, Vs + BK * B_ROW, warp_m, warp_n);
        __syncthreads();  // V's tile and the probabilities are read: the next tiles may overwrite them
        if (k0 + BKEY < TK) copy_tile<V_ROW, V_COL, B_ROW, 1, V_ALIGNED>(Vs, v, k0 + BKEY, TK, 0, DV);
        commit_copies();
    }
    wait_copies<0>();

#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = warp_m * WM + mt * 16 + g + 8 * (r / 2);
            if (q0 + row >= TQ) continue;
            const float sum = row_sum[row];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int col = warp_n * WN + nt * 8 + 2 * t + r % 2;
                if (col < DV) {
                    const float value = o[mt][nt][r] / sum;
                    out[(q0 + row) * OUT_ROW + col * OUT_COL] = value;
                    flag_nonfinite(nonfinite, value);
                }
            }
        }
}
