// GEMV for small batches: Y[m][n] = epilogue(sum_k A[m][k] * W[n][k]) for up to MB rows m per block.
//
// Why it is fast at batch 1-16: the layer is a stream of weights (K x N floats read
// once), so the kernel is built to keep the memory system busy and read each weight
// exactly once. Each warp owns OPW consecutive outputs and a slice of K (WPR warps
// share one output when K is long and N short, so that there are thousands of warps
// in flight); its lanes read the weight rows as float4, 512 contiguous bytes per
// warp load, fully coalesced and marked streaming (__ldcs) so they do not evict A.
// Every weight float4 is multiplied with the matching float4 of all MB batch rows
// (A is small and stays in L1/L2), so for batch 2-16 one weight load feeds every
// row of the batch. Partial sums are reduced with warp shuffles, then across the
// WPR warps of an output through shared memory; the fused epilogue runs once per output.
//
// W arrives padded with zeros to NROWS rows of KP (a multiple of 4) floats, so its
// loads need no bounds tests; A (batch x K, row-major) is read with a guard only when
// K % 4 != 0. Macros: N, K, KP, NROWS, MB, OPW, WPR, WARPS (per block), and the epilogue's.
#include "gemm_epilogue.cuh"

#define GROUPS (WARPS / WPR)  // output groups per block: each WPR warps, OPW outputs
#define RESULTS (MB * OPW)    // sums one warp produces

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemm_gemv(const float* __restrict__ a, const float* __restrict__ w, const float* __restrict__ bias, float* __restrict__ y, int batch)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int slice = warp % WPR;
    const int group = warp / WPR;
    const int n0 = (blockIdx.x * GROUPS + group) * OPW;
    const int m0 = blockIdx.y * MB;
    const float4* __restrict__ w4 = reinterpret_cast<const float4*>(w);

    float acc[MB][OPW];
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int o = 0; o < OPW; ++o)
            acc[m][o] = 0.0f;

    // four loads in flight per lane; two where 32 sums already fill the registers
#if RESULTS <= 16
#pragma unroll 4
#else
#pragma unroll 2
#endif
    for (int g = slice * 32 + lane; g < KP / 4; g += WPR * 32) {
        float4 wv[OPW];
#pragma unroll
        for (int o = 0; o < OPW; ++o)
            wv[o] = __ldcs(w4 + (size_t)(n0 + o) * (KP / 4) + g);
#pragma unroll
        for (int m = 0; m < MB; ++m) {
            if (m0 + m < batch) {
                const float4 av = load_a4(a, m0 + m, 4 * g);
#pragma unroll
                for (int o = 0; o < OPW; ++o) {
                    acc[m][o] = fmaf(av.x, wv[o].x, acc[m][o]);
                    acc[m][o] = fmaf(av.y, wv[o].y, acc[m][o]);
                    acc[m][o] = fmaf(av.z, wv[o].z, acc[m][o]);
                    acc[m][o] = fmaf(av.w, wv[o].w, acc[m][o]);
                }
            }
        }
    }

#if WPR > 1
    __shared__ float partial[GROUPS][WPR][RESULTS];
#endif
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int o = 0; o < OPW; ++o) {
            const float total = warp_sum(acc[m][o]);
#if WPR > 1
            if (lane == 0)
                partial[group][slice][m * OPW + o] = total;
#else
            acc[m][o] = total;
#endif
        }
#if WPR > 1
    __syncthreads();
    if (slice != 0)
        return;
    // lane r of the group's first warp finishes result r (r = m * OPW + o), adding the slices in order
    for (int r = lane; r < RESULTS; r += 32) {
        float total = 0.0f;
#pragma unroll
        for (int s = 0; s < WPR; ++s)
            total += partial[group][s][r];
        const int m = m0 + r / OPW, n = n0 + r % OPW;
        if (m < batch && n < N)
            y[(size_t)m * N + n] = gemm_output(total, bias, m, n);
    }
#else
#pragma unroll
    for (int m = 0; m < MB; ++m)
#pragma unroll
        for (int o = 0; o < OPW; ++o)
            if (lane == (m * OPW + o) % 32 && m0 + m < batch && n0 + o < N)
                y[(size_t)(m0 + m) * N + n0 + o] = gemm_output(acc[m][o], bias, m0 + m, n0 + o);
#endif
}
