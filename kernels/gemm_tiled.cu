// Tiled GEMM for large batches: Y = epilogue(A W^T), A batch x K, W N x K, both K-contiguous.
//
// Why it is fast: at batch 10,000 the product is compute-bound, so every operand
// fetched from memory must feed many multiply-adds. A block computes a BM x BN tile
// of Y; for each BK-wide slice of K it stages the A and W tiles in shared memory
// (float4 loads along K, stored transposed so the inner loop reads rows), and each
// thread then accumulates a TM x TN register micro-tile from TM + TN shared loads per
// k step: TM*TN multiply-adds per TM+TN loads instead of one per two. Tile edges:
// A rows past the batch and K past its end read as zero; W comes padded with zeros
// to a multiple of BN rows and BK columns. Macros: N, K, KP, BM, BN, BK, TM, TN and
// the epilogue's.
#include "gemm_epilogue.cuh"

#define THREADS_X (BN / TN)
#define THREADS ((BM / TM) * THREADS_X)
#define A_LOADS (BM * BK / 4 / THREADS)  // float4 loads per thread per A tile
#define W_LOADS (BN * BK / 4 / THREADS)
#define PAD 4  // keeps rows 16-byte aligned while spreading the transposed stores over banks

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_tiled(const float* __restrict__ a, const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ y, int batch)
{
    __shared__ __align__(16) float as[BK][BM + PAD];
    __shared__ __align__(16) float ws[BK][BN + PAD];
    const int tid = threadIdx.x;
    const int tx = tid % THREADS_X, ty = tid / THREADS_X;
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < KP; k0 += BK) {
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const int index = tid + l * THREADS;
            const int row = index / (BK / 4), col = 4 * (index % (BK / 4));
            const int m = bm + row, k = k0 + col;
            const float4 v = (m < batch && k < K) ? load_a4(a, m, k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            as[col][row] = v.x;
            as[col + 1][row] = v.y;
            as[col + 2][row] = v.z;
            as[col + 3][row] = v.w;
        }
#pragma unroll
        for (int l = 0; l < W_LOADS; ++l) {
            const int index = tid + l * THREADS;
            const int row = index / (BK / 4), col = 4 * (index % (BK / 4));
            const float4 v = __ldg(reinterpret_cast<const float4*>(w + (size_t)(bn + row) * KP + k0 + col));
            ws[col][row] = v.x;
            ws[col + 1][row] = v.y;
            ws[col + 2][row] = v.z;
            ws[col + 3][row] = v.w;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM], wv[TN];
#pragma unroll
            for (int i = 0; i < TM; i += 4)
                *reinterpret_cast<float4*>(&av[i]) = *reinterpret_cast<const float4*>(&as[kk][ty * TM + i]);
#pragma unroll
            for (int j = 0; j < TN; j += 4)
                *reinterpret_cast<float4*>(&wv[j]) = *reinterpret_cast<const float4*>(&ws[kk][tx * TN + j]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = bm + ty * TM + i;
        if (m >= batch)
            break;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = bn + tx * TN + j;
            if (n < N)
                y[(size_t)m * N + n] = gemm_output(acc[i][j], bias, m, n);
        }
    }
}
