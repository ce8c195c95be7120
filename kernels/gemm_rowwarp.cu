// Narrow Gemm (N <= 32 outputs) with the row Softmax fused: a warp per RW rows of Y.
//
// Why it is fast: a classifier head (K = 32..1024 inputs, N = 10 classes) is too
// narrow to tile, and its row Softmax needs a whole row of Y in one place. Here a
// warp reads RW rows of A with coalesced loads (lane k of each 32), multiplies them
// with W's columns, which every warp of the grid reads and so stay in L1, and keeps
// all RW x N sums in registers; each W load feeds RW rows. Warp shuffles give every
// lane the finished row, so the epilogue (bias, activation, then Softmax: max, exp
// of the difference, sum, divide) runs in registers with no shared memory or second
// pass, and lane n stores output n. Macros: N, K, RW, WARPS, SOFTMAX and the epilogue's.
#include "gemm_epilogue.cuh"

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemm_rowwarp(const float* __restrict__ a, const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ y, int batch)
{
    const int lane = threadIdx.x & 31;
    const int m0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * RW;
    if (m0 >= batch)
        return;

    float acc[RW][N];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int n = 0; n < N; ++n)
            acc[r][n] = 0.0f;

#pragma unroll 2
    for (int k = lane; k < K; k += 32) {
        float av[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r)
            av[r] = m0 + r < batch ? __ldg(a + (size_t)(m0 + r) * K + k) : 0.0f;
#pragma unroll
        for (int n = 0; n < N; ++n) {
            const float wv = __ldg(w + n * K + k);
#pragma unroll
            for (int r = 0; r < RW; ++r)
                acc[r][n] = fmaf(av[r], wv, acc[r][n]);
        }
    }

#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int m = m0 + r;
        float v[N];
#pragma unroll
        for (int n = 0; n < N; ++n)
            v[n] = gemm_output(warp_sum(acc[r][n]), bias, m, n);
#if SOFTMAX
        float top = v[0];
#pragma unroll
        for (int n = 1; n < N; ++n)
            top = v[n] > top ? v[n] : top;  // a NaN never wins, but reaches every output through the sum
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N; ++n) {
            v[n] = expf(v[n] - top);
            sum += v[n];
        }
#pragma unroll
        for (int n = 0; n < N; ++n)
            v[n] = v[n] / sum;
#endif
        float mine = 0.0f;
#pragma unroll
        for (int n = 0; n < N; ++n)
            mine = lane == n ? v[n] : mine;
        if (m < batch && lane < N)
            y[(size_t)m * N + lane] = mine;
    }
}
