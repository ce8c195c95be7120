// conv_tc_gemm: 2-D convolution (ONNX Conv, any group count) as an implicit GEMM on the
// tensor cores, with the tiles streamed through a multi-stage shared-memory
// pipeline by cp.async. FP32 in and out; the weights are read from global memory
// at call time, so no layer is too big for it.
//
// The product: Y[m][col] = sum_k W[m][k] * X[k][col], m an output map, col an
// output pixel of the batch (n, oh, ow), k = (c, kh, kw) over KDIM = C/G*KH*KW: one
// GEMM per group, a block's map tile inside one (MapTile in conv_implicit_tiles.cuh).
// X is never built: each B-tile element is copied straight from the image.
//
// What makes it fast:
// - A block computes a BM x BN tile of Y; each of its warps a WM x WN part of it
//   as (WM/16) x (WN/8) tensor-core tiles, mma.sync m16n8k8 TF32 (sm_80+): one
//   warp instruction does 1024 multiply-adds, so the FP32 pipe is not the limit.
// - The K loop walks BK-deep slices. STAGES slices are in flight at once:
//   cp.async copies slice i + STAGES - 1 from global to shared memory while the
//   warps multiply slice i, so load latency hides behind the MMAs, and the copies
//   bypass the registers.
// - Weight rows are copied 16 bytes at a time when KDIM is a multiple of 4
//   (A_VEC 4). A 1x1 stride-1 unpadded conv reads four neighbouring pixels of a
//   channel as one 16-byte copy too (B_VEC 4).
// - Each im2col index comes from compile-time shape constants: the (c, kh, kw)
//   split of a k is a lookup in the __constant__ table `taps`, the same k for
//   the whole warp (a broadcast), and a thread's columns are worked out once.
// - Rows padded by 4 (A) and 8 (B) floats make every fragment load of a warp hit
//   32 different shared-memory banks.
// - Layers whose output is too small to fill the GPU (512->512 at 7x7, batch 1)
//   split K over KSLICES blocks (grid z); conv_k_slices_reduce (conv_implicit_tiles.cuh) then adds the slices in
//   a fixed order, with the epilogue: the same result on every run.
// - The epilogue (conv_epilogue.cuh): bias, the residual operand r (read at the
//   output's own index, by the lanes that store it), then ACTIVATION; no pool.
//
// Arithmetic: HALF 1 (FP16) or 2 (BF16) rounds both operands to 16 bits and runs
// m16n8k16 MMAs with FP32 accumulation (opt-in, inexact). Otherwise SPLIT 1 is 3xTF32 and 0
// plain TF32 (opt-in), as tf32_mma.cuh describes: an error of FP32's order against float64.
// The instruction mix, not memory, limits these kernels (ncu on VGG 512->512 at
// batch 32: the ALU pipe busiest at 53%, issue slots 67% busy), so the small parts
// skip a conversion and the window bounds become one bit test per copy.
//
// Fragment layouts: see tf32_mma.cuh.
//
// Macros: the shape macros (C, M, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW,
// HAS_BIAS, RESIDUAL, ACTIVATION, PROLOGUE, PROLOGUE_ACTIVATION) plus BM, BN, BK, WM, WN, STAGES, HALF, SPLIT, KSLICES, A_VEC, B_VEC,
// TAP_MASK, KPAD (rows of `taps`: KDIM rounded up to BK) and MIN_BLOCKS.
// Launch: block (NTHREADS), grid (ceil(batch*OH*OW / BN), G * ceil(M/G / BM), KSLICES),
// dynamic shared memory STAGES * (BM*(BK+4) + BK*(BN+8)) * 4 bytes.
// With KSLICES > 1 the partial sums go to `partial` ([KSLICES][M][batch*OH*OW])
// and conv_k_slices_reduce (one thread per output) writes y. r is the residual operand
// ([batch][M][OH][OW]; null without RESIDUAL), pro the prologue's (s [batch][C], or a [C] then b [C];
// null without PROLOGUE), x_image the floats between X's images (C*H*W unless X is a view).
// nonfinite: a byte raised where an output is NaN or Inf (null: the step is not watched; see
// flag_nonfinite), here or, with a K split, in conv_k_slices_reduce.

#include "conv_epilogue.cuh"

#define KTILES ((KDIM + BK - 1) / BK)
#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define NTHREADS (WARPS_M * WARPS_N * 32)
#define A_STRIDE (BK + 4)
#define B_STRIDE (BN + 8)
#define A_STAGE (BM * A_STRIDE)
#define B_STAGE (BK * B_STRIDE)

#include "conv_implicit_tiles.cuh"

#define B_K_STEP B_STRIDE  // image values, [k][pixel]
#define B_N_STEP 1
#include "tf32_mma.cuh"

__device__ __forceinline__ void copy_slice(float* As, float* Bs, const float* __restrict__ x, const float* __restrict__ w,
                                           const Columns& cols, const MapTile& maps, int k0)
{
    copy_weights(As, w, maps, k0);
    copy_b_slice(Bs, x, cols, k0);
}

#if HALF
// two floats as one register of 16-bit values {lo, hi} (FP16 or BF16), rounded to nearest
__device__ __forceinline__ unsigned int pack_pair(float lo, float hi)
{
    unsigned int r;
#if HALF == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// d += a * b on one 16x8x16 tile, FP32 accumulation
__device__ __forceinline__ void mma_half(float (&d)[4], const unsigned int (&a)[4], unsigned int b0, unsigned int b1)
{
#if HALF == 1
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc += the warp's part of As x Bs for one BK slice, operands rounded to 16 bits on the
// way from shared memory (m16n8k16: A a0 = [g][2t, 2t+1], a1 = [g+8][2t, 2t+1],
// a2 = [g][2t+8, 2t+9], a3 = [g+8][2t+8, 2t+9]; B b0 = [2t, 2t+1][g], b1 = [2t+8, 2t+9][g])
__device__ __forceinline__ void multiply_slice(float (&acc)[MT][NT][4], const float* As, const float* Bs, int warp_m, int warp_n)
{
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        unsigned int a[MT][4], b[NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const float* row = As + (warp_m * WM + mt * 16 + g) * A_STRIDE + kk + 2 * t;
            a[mt][0] = pack_pair(row[0], row[1]);
            a[mt][1] = pack_pair(row[8 * A_STRIDE], row[8 * A_STRIDE + 1]);
            a[mt][2] = pack_pair(row[8], row[9]);
            a[mt][3] = pack_pair(row[8 * A_STRIDE + 8], row[8 * A_STRIDE + 9]);
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const float* col = Bs + (kk + 2 * t) * B_STRIDE + warp_n * WN + nt * 8 + g;
            b[nt][0] = pack_pair(col[0], col[B_STRIDE]);
            b[nt][1] = pack_pair(col[8 * B_STRIDE], col[9 * B_STRIDE]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_half(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
}
#else
__device__ __forceinline__ void multiply_slice(float (&acc)[MT][NT][4], const float* As, const float* Bs, int warp_m, int warp_n)
{
    tf32_slice(acc, As, Bs, warp_m, warp_n);
}
#endif  // HALF

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
conv_tc_gemm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, const float* __restrict__ r,
             const float* __restrict__ pro, float* __restrict__ y, float* __restrict__ partial, int batch, int x_image,
             unsigned char* nonfinite)
{
    extern __shared__ float4 shared_tiles[];
    float* As = reinterpret_cast<float*>(shared_tiles);
    float* Bs = As + STAGES * A_STAGE;

    const int total = batch * P;
    const int col0 = blockIdx.x * BN;
    const MapTile maps;
    const int m0 = maps.first;
    const Columns cols(col0, total, maps.group, x_image);

    const SliceRun run;  // this block's share of the k slices

    const int warp = threadIdx.x / 32;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;
    float acc[MT][NT][4];
    zero_tiles(acc);

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < run.count) copy_slice(As + s * A_STAGE, Bs + s * B_STAGE, x, w, cols, maps, (run.first + s) * BK);
        commit_copies();  // an empty group keeps the count of groups in step
    }
    for (int i = 0; i < run.count; ++i) {
        wait_copies<STAGES - 2>();  // slice i has landed (this thread's copies)
        prologue_b_slice(Bs + i % STAGES * B_STAGE, pro, cols, (run.first + i) * BK);
        __syncthreads();            // ... and everyone's; slice i - 1 is no longer read
        const int next = i + STAGES - 1;
        if (next < run.count) {
            const int stage = next % STAGES;
            copy_slice(As + stage * A_STAGE, Bs + stage * B_STAGE, x, w, cols, maps, (run.first + next) * BK);
        }
        commit_copies();
        const int stage = i % STAGES;
        multiply_slice(acc, As + stage * A_STAGE, Bs + stage * B_STAGE, warp_m, warp_n);
    }
    wait_copies<0>();

    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int col = col0 + warp_n * WN + nt * 8 + 2 * t + half;
            if (col >= total) continue;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int upper = 0; upper < 2; ++upper) {
                    const int m = m0 + warp_m * WM + mt * 16 + g + 8 * upper;
                    if (m < maps.end) store_sum(y, partial, b, r, nonfinite, total, col, m, acc[mt][nt][2 * upper + half]);
                }
            }
        }
    }
}
