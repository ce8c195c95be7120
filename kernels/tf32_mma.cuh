// The TF32 tensor-core arithmetic that the mma.sync kernels (conv_tc_gemm, gemm_tc) share: the
// conversions, the m16n8k8 instruction, and the product of one BK-deep slice staged in shared
// memory by a warp, in 3xTF32 (SPLIT 1) or plain TF32 (SPLIT 0).
//
// 3xTF32: each operand a = big + small, big = tf32(a) rounded to nearest, small = a - big (exact
// in FP32), handed to the MMA as it is (the tensor core drops its low 13 bits); the MMAs add
// small*big + big*small + big*big, and only small*small (~2^-22 relative) and small's truncation
// (~2^-21, random in sign) are lost: an error of FP32's order, measured against float64.
// Plain TF32 is opt-in (~3e-4 relative error, as cuDNN's and cuBLAS's TF32 modes).
//
// Fragment layouts of m16n8k8 (lane = 4*g + t): A a0 = [g][t], a1 = [g+8][t], a2 = [g][t+4],
// a3 = [g+8][t+4]; B b0 = [t][g], b1 = [t+4][g]; C c0, c1 = [g][2t], [g][2t+1], c2, c3 =
// [g+8][2t], [g+8][2t+1].
//
// The includer defines BK, WM, WN (a warp's tile), SPLIT, A_STRIDE (floats between the rows of the
// A tile, stored [m][k]), and B_K_STEP and B_N_STEP: how far apart in the B tile two neighbours
// along k and along n lie (conv_tc_gemm stores it [k][n], gemm_tc [n][k]).
#ifndef OPPLUGIN_TF32_MMA_CUH
#define OPPLUGIN_TF32_MMA_CUH

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.sync TF32 needs sm_80 or newer"
#endif

#include "async_copy.cuh"

#define MT (WM / 16)  // 16-row MMA tiles per warp
#define NT (WN / 8)   // 8-column MMA tiles per warp

__device__ __forceinline__ unsigned int to_tf32(float v)
{
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// v = big + small: big rounded to TF32, small the exact FP32 rest, left for the MMA to truncate.
// An infinite v gives small = inf - inf = NaN, so an output whose sum meets an infinity is NaN
// where FP32 sums give +-inf. Handling that here costs about 1.8x in time (the loop is bound by
// its ALU pipe; measured on an H100), so such a kernel says it is not NaN/Inf-exact instead
// (Kernel.nonfinite_exact) and the runner reruns those chunks on an exact variant.
__device__ __forceinline__ void split_tf32(float v, unsigned int& big, unsigned int& small)
{
    big = to_tf32(v);
    small = __float_as_uint(v - __uint_as_float(big));
}

template <int ROWS, int COLS>
__device__ __forceinline__ void zero_tiles(float (&tiles)[ROWS][COLS][4])
{
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < COLS; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) tiles[i][j][r] = 0.0f;
}

template <int ROWS, int COLS>
__device__ __forceinline__ void add_tiles(float (&acc)[ROWS][COLS][4], const float (&part)[ROWS][COLS][4])
{
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < COLS; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] += part[i][j][r];
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// part += a x b in 3xTF32 from the split fragments: the two small-by-big products first, where the
// accumulator is still small, then big by big
__device__ __forceinline__ void mma_3xtf32(float (&part)[4], const unsigned int (&a_big)[4], const unsigned int (&a_small)[4],
                                           const unsigned int (&b_big)[2], const unsigned int (&b_small)[2])
{
    mma_tf32(part, a_small, b_big[0], b_big[1]);
    mma_tf32(part, a_big, b_small[0], b_small[1]);
    mma_tf32(part, a_big, b_big[0], b_big[1]);
}

// big (and with SPLIT its small rest) of a value on its way from shared memory to a fragment
__device__ __forceinline__ void fragment_value(float v, unsigned int& big, unsigned int& small)
{
#if SPLIT
    split_tf32(v, big, small);
#else
    big = to_tf32(v);
#endif
}

// part += a x b from the fragments' TF32 parts: with SPLIT three MMAs (3xTF32), else one of the big parts
__device__ __forceinline__ void mma_parts(float (&part)[4], const unsigned int (&a_big)[4], const unsigned int (&a_small)[4],
                                          const unsigned int (&b_big)[2], const unsigned int (&b_small)[2])
{
#if SPLIT
    mma_3xtf32(part, a_big, a_small, b_big, b_small);
#else
    mma_tf32(part, a_big, b_big[0], b_big[1]);
#endif
}

// acc += what add_products(part) adds into `part`, one BK slice's MMAs. The tensor cores add into their FP32
// accumulator with truncation, so over a long K a running sum drifts (3xTF32 measured 1e-5 relative at K =
// 1440, past the exact bound); with SPLIT each slice is summed in a `part` of its own by the MMAs, then added
// to acc with a correctly rounded add. Plain TF32 is inexact anyway: its MMAs add into acc itself.
template <class Products>
__device__ __forceinline__ void add_slice(float (&acc)[MT][NT][4], const Products& add_products)
{
#if SPLIT
    float part[MT][NT][4];
    zero_tiles(part);
    add_products(part);
    add_tiles(acc, part);
#else
    add_products(acc);
#endif
}

// acc += the warp's part of As x Bs for one BK slice (add_slice: in a part of its own with SPLIT).
// K_STEP and N_STEP: the B tile's layout, B_K_STEP and B_N_STEP unless the includer stages a second
// B operand in another layout (attention_tc's K^T beside its V)
template <int K_STEP = B_K_STEP, int N_STEP = B_N_STEP>
__device__ __forceinline__ void tf32_slice(float (&acc)[MT][NT][4], const float* As, const float* Bs, int warp_m, int warp_n)
{
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    add_slice(acc, [&](float (&part)[MT][NT][4]) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned int a_big[MT][4], b_big[NT][2];
            unsigned int a_small[MT][4], b_small[NT][2];  // unused (and dropped) without SPLIT
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const float* row = As + (warp_m * WM + mt * 16 + g) * A_STRIDE + kk + t;
                const float v[4] = {row[0], row[8 * A_STRIDE], row[4], row[8 * A_STRIDE + 4]};
#pragma unroll
                for (int r = 0; r < 4; ++r) fragment_value(v[r], a_big[mt][r], a_small[mt][r]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float* col = Bs + (kk + t) * K_STEP + (warp_n * WN + nt * 8 + g) * N_STEP;
                const float v[2] = {col[0], col[4 * K_STEP]};
#pragma unroll
                for (int r = 0; r < 2; ++r) fragment_value(v[r], b_big[nt][r], b_small[nt][r]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_parts(part[mt][nt], a_big[mt], a_small[mt], b_big[nt], b_small[nt]);
        }
    });
}

// store(m, n, first, second) for each pair of neighbouring outputs of the warp's accumulators (row m,
// columns n and n + 1: c0 and c1, or c2 and c3, of a fragment) in rows below `rows`, the block's tile
// starting at row m0 and column n0
template <class Store>
__device__ __forceinline__ void for_each_output_pair(const float (&acc)[MT][NT][4], int m0, int n0, int warp_m, int warp_n, int rows,
                                                     const Store& store)
{
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int upper = 0; upper < 2; ++upper) {
            const int m = m0 + warp_m * WM + mt * 16 + g + 8 * upper;
            if (m >= rows) continue;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                store(m, n0 + warp_n * WN + nt * 8 + 2 * t, acc[mt][nt][2 * upper], acc[mt][nt][2 * upper + 1]);
        }
    }
}

#ifdef STAGES
// acc = the product over `ktiles` BK-deep slices, STAGES of them in flight: copy(As, Bs, k0) issues the
// cp.async copies of slice k0 into one stage of the A tiles (A_STAGE floats apart) and of the B tiles
// (`b_stage` apart), while the warps multiply the slice copied STAGES - 1 turns before.
template <class Copy>
__device__ __forceinline__ void pipelined_product(float (&acc)[MT][NT][4], float* As, float* Bs, int b_stage, int ktiles,
                                                  const Copy& copy, int warp_m, int warp_n)
{
    zero_tiles(acc);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) copy(As + s * A_STAGE, Bs + s * b_stage, s * BK);
        commit_copies();  // an empty group keeps the count of groups in step
    }
    for (int i = 0; i < ktiles; ++i) {
        wait_copies<STAGES - 2>();  // slice i has landed (this thread's copies)
        __syncthreads();            // ... and everyone's; slice i - 1 is no longer read
        const int next = i + STAGES - 1;
        if (next < ktiles) copy(As + next % STAGES * A_STAGE, Bs + next % STAGES * b_stage, next * BK);
        commit_copies();
        tf32_slice(acc, As + i % STAGES * A_STAGE, Bs + i % STAGES * b_stage, warp_m, warp_n);
    }
    wait_copies<0>();
}
#endif

#endif
