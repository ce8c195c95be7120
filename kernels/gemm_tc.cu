// gemm_tc: Y = epilogue(A W^T) on the tensor cores, FP32 in and out. A is batch x K and W is
// N x K, both K-contiguous (the Gemm plugin's common form, kernels/gemm_tiled.cu's too).
//
// What makes it fast:
// - A block computes a BM x BN tile of Y; each of its warps a WM x WN part of it as
//   (WM/16) x (WN/8) mma.sync m16n8k8 tiles (tf32_mma.cuh): 3xTF32 by default (SPLIT 1), an
//   error of FP32's order, at several times the rate of FP32 FMAs; plain TF32 with SPLIT 0.
// - STAGES BK-deep slices of both operands are in flight at once: cp.async copies slice
//   i + STAGES - 1 while the warps multiply slice i, so load latency hides behind the MMAs.
// - Both tiles are stored [row][k] with rows BK + 4 floats apart, so the eight rows g and four
//   columns t of a fragment load fall on 32 different banks; 16-byte copies when K % 4 == 0.
// - The epilogue (gemm_epilogue.cuh: alpha, C, the activation) runs on the accumulators, and a
//   lane's two neighbouring columns are stored as one float2 when N is even (store_output_pair).
//
// Tile edges: A rows past the batch and k past K are copied as zeros (cp.async's zero fill);
// W arrives padded with zeros to a multiple of BN rows and BK columns (KP), so its copies need
// no test.
//
// Macros: N, K, KP, BM, BN, BK, WM, WN, STAGES, SPLIT, MIN_BLOCKS and the epilogue's.
// Launch: block (NTHREADS), grid (ceil(N / BN), ceil(batch / BM)), dynamic shared memory
// STAGES * (BM + BN) * (BK + 4) * 4 bytes. nonfinite: a byte raised where an output is NaN or
// Inf (null: the step is not watched; see watch_flag.cuh).
#include "gemm_epilogue.cuh"

#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define NTHREADS (WARPS_M * WARPS_N * 32)
#define A_STRIDE (BK + 4)
#define A_STAGE (BM * A_STRIDE)
#define W_STAGE (BN * A_STRIDE)
#define KTILES (KP / BK)
#define QUADS (BK / 4)  // 16-byte pieces of a row's slice

#define B_K_STEP 1  // weight rows, [n][k] like A
#define B_N_STEP A_STRIDE
#include "tf32_mma.cuh"

static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0 && BK % 8 == 0, "whole MMA tiles");
static_assert(KP % BK == 0, "W's columns padded to whole slices");
static_assert(STAGES >= 2, "a slice in flight while one is multiplied");

// slice k0 of A's rows [m0, m0 + BM) and W's rows [n0, n0 + BN) into shared memory
__device__ __forceinline__ void copy_slice(float* As, float* Ws, const float* __restrict__ a, const float* __restrict__ w,
                                           int m0, int n0, int batch, int k0)
{
#pragma unroll
    for (int i = threadIdx.x; i < BM * QUADS; i += NTHREADS) {
        const int row = i / QUADS, k = k0 + i % QUADS * 4;
        const int m = m0 + row;
        float* to = As + row * A_STRIDE + i % QUADS * 4;
#if K % 4 == 0
        const bool valid = m < batch && k < K;
        copy_async16(to, valid ? a + (size_t)m * K + k : a, valid);
#else
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool valid = m < batch && k + j < K;
            copy_async4(to + j, valid ? a + (size_t)m * K + k + j : a, valid);
        }
#endif
    }
#pragma unroll
    for (int i = threadIdx.x; i < BN * QUADS; i += NTHREADS) {
        const int row = i / QUADS, k = i % QUADS * 4;
        copy_async16(Ws + row * A_STRIDE + k, w + (size_t)(n0 + row) * KP + k0 + k, true);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
gemm_tc(const float* __restrict__ a, const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ y, int batch,
        unsigned char* nonfinite)
{
    extern __shared__ float4 shared_tiles[];
    float* As = reinterpret_cast<float*>(shared_tiles);
    float* Ws = As + STAGES * A_STAGE;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int warp = threadIdx.x / 32;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

    float acc[MT][NT][4];
    const auto copy = [&](float* as, float* ws, int k0) { copy_slice(as, ws, a, w, m0, n0, batch, k0); };
    pipelined_product(acc, As, Ws, W_STAGE, KTILES, copy, warp_m, warp_n);

    for_each_output_pair(acc, m0, n0, warp_m, warp_n, batch, [&](int m, int n, float first, float second) {
        store_output_pair(y, bias, nonfinite, m, n, first, second);
    });
}
