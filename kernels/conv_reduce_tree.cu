// conv_reduce_tree: 2-D convolution (ONNX Conv, any group count G) with the sum
// over input channels split across threads: the C/G channels of one output are
// dealt out to SL channel slices (threadIdx.y), each slice sums the KH x KW
// windows of its channels, and the SL partial sums are added by a tree in
// shared memory (log2(SL) steps). Filters and bias in __constant__ memory.
//
// Why it can be faster than conv_const: one output's work, a chain of
// (C/G)*KH*KW dependent multiply-adds in one thread, becomes SL shorter chains
// in SL threads. That adds parallelism where outputs are few (small batch,
// small maps) and shortens each thread's latency-bound chain; the price is
// SL x the threads, a shared-memory round trip and log2(SL) barriers per
// output. It needs C/G >= 2: with one channel per group there is nothing to split.
//
// Slice s takes channels s, s+SL, s+2*SL, ... of the group (the last pass is
// short when SL does not divide C/G). SL is 2, 4 or 8, so a block row of
// PX = BLOCK/SL >= 32 threads is whole warps: every warp belongs to one slice,
// and its filter reads hit one constant address (a broadcast). The tree adds
// in a fixed order, so results are deterministic.
//
// -D macros: C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, PADDED,
// HAS_BIAS, BLOCK, plus SL (slices) and UNROLL_K (passes over the slice's
// channels to unroll). Only the batch is a run-time argument.
//
// Launch: block (BLOCK/SL, SL), grid (ceil(batch*OH*OW / (BLOCK/SL)), M).
// threadIdx.x + blockIdx.x index one output pixel of one image, blockIdx.y the map.

#define CG (C / G)
#define MG (M / G)
#define PX (BLOCK / SL)                 // output pixels per block
#define PASSES ((CG + SL - 1) / SL)     // channels a slice sums, at most

__constant__ float filters[M * CG * KH * KW];  // [m][c][kh][kw], c within the map's group
#if HAS_BIAS
__constant__ float bias[M];
#endif

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_reduce_tree(const float* __restrict__ x, float* __restrict__ y, int batch)
{
    __shared__ float partial[SL][PX];

    const int pixel = blockIdx.x * PX + threadIdx.x;  // over batch * OH * OW
    const bool valid = pixel < batch * (OH * OW);
    const int slice = threadIdx.y;
    const int m = blockIdx.y;
    const int n = pixel / (OH * OW);
    const int oh = (pixel % (OH * OW)) / OW;
    const int ow = pixel % OW;

    float acc = 0.0f;
    if (valid) {  // no early return: every thread takes part in the tree's barriers
        const int ih0 = oh * SH - PH;
        const int iw0 = ow * SW - PW;
        const float* __restrict__ image = x + (size_t)n * (C * H * W) + (m / MG) * (CG * H * W);
        const float* filter = filters + m * (CG * KH * KW);
#pragma unroll UNROLL_K
        for (int k = 0; k < PASSES; ++k) {
            const int c = slice + k * SL;
            if (CG % SL != 0 && c >= CG) break;
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
                const int ih = ih0 + kh * DH;
#if PADDED
                if (ih < 0 || ih >= H) continue;
#endif
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const int iw = iw0 + kw * DW;
#if PADDED
                    if (iw < 0 || iw >= W) continue;
#endif
                    acc += image[(c * H + ih) * W + iw] * filter[(c * KH + kh) * KW + kw];
                }
            }
        }
    }

    // tree: at each step the lower half of the slices adds the upper half
    partial[slice][threadIdx.x] = acc;
    __syncthreads();
#pragma unroll
    for (int half = SL / 2; half > 0; half /= 2) {
        if (slice < half) partial[slice][threadIdx.x] += partial[slice + half][threadIdx.x];
        __syncthreads();
    }

    if (slice == 0 && valid) {
        float sum = partial[0][threadIdx.x];
#if HAS_BIAS
        sum += bias[m];
#endif
        y[((size_t)n * M + m) * (OH * OW) + oh * OW + ow] = sum;
    }
}
