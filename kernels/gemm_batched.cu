// MatMul of any rank: C[j] = A[j] (M x K) x B[j] (K x N) for each output matrix j, all row-major,
// the leading axes broadcast as numpy does. With an activation fused (ACTIVATION(v)).
//
// The shapes are NVRTC -D macros (opplugin/ops/gemm/matmul.py): M, N, K; BATCH_RANK, the
// output's leading axes, with their extents OUT_DIM1.. (the first, the batch, is whatever
// is left) and, per axis, how far A's and B's matrices move: A_STRIDE<i>, B_STRIDE<i>
// (0 where an operand broadcasts). Matrix j is block z (plus `first`, for more matrices
// than a grid's z extent).
//
// Why it is reasonably fast: a 64 x 64 tile of C per block of 256 threads, each thread 4 x 4
// outputs from registers; A's and B's 64 x 16 and 16 x 64 slices of K staged in shared memory
// with loads that run along rows (coalesced), so each loaded float feeds 64 multiply-adds.
// Arithmetic is FP32 with fmaf, K in order, so a result never depends on the run.
#include "activation.cuh"
#include "matmul_batch_axes.cuh"

#define BM 64
#define BN 64
#define BK 16

extern "C" __global__ void __launch_bounds__(256)
matmul_batched(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int first)
{
    __shared__ float as[BK][BM + 1];  // A's slice, K-major: a thread's 4 rows are read together
    __shared__ float bs[BK][BN];
    locate_matrix(first, a, b, c);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int n = 0; n < 4; ++n)
            acc[i][n] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int load = 0; load < 4; ++load) {
            const int index = threadIdx.x + load * 256;
            const int m = index / BK, ka = index % BK;  // A: 16 neighbouring k of a row per 16 threads
            const int kb = index / BN, n = index % BN;  // B: 64 neighbouring n of a row per 64 threads
            as[ka][m] = row0 + m < M && k0 + ka < K ? __ldg(a + (long long)(row0 + m) * K + k0 + ka) : 0.0f;
            bs[kb][n] = k0 + kb < K && col0 + n < N ? __ldg(b + (long long)(k0 + kb) * N + col0 + n) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                av[i] = as[k][ty + 16 * i];
                bv[i] = bs[k][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int n = 0; n < 4; ++n)
                    acc[i][n] = fmaf(av[i], bv[n], acc[i][n]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = row0 + ty + 16 * i;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int col = col0 + tx + 16 * n;
            if (m < M && col < N)
                c[(long long)m * N + col] = opplugin_activation(acc[i][n]);
        }
    }
}
