// conv_reduce_atomic: 2-D convolution (ONNX Conv, any group count G) with the
// sum over input channels split across threads, as in conv_reduce_tree, but
// each slice adds its partial sum straight into the output with atomicAdd.
// Filters and bias in __constant__ memory.
//
// Why it can be faster than conv_reduce_tree: no shared memory and no barriers;
// the partial sums meet in the L2 cache, whose atomic units apply them
// (a fire-and-forget RED instruction, since the old value is not used), and a
// thread is done as soon as its partial is issued. The price: the output must
// be initialised first (a second kernel, conv_reduce_atomic_init, writes the
// bias or 0 to every element, launched just before on the same stream), and
// SL read-modify-writes of each output at L2 instead of one store.
//
// Not deterministic: the order in which the SL partials reach an output varies
// from run to run, so results may differ in the last bits between runs. Still
// FP32 arithmetic throughout; compare with a tolerance.
//
// Slice s takes channels s, s+SL, ... of the group; SL is 2, 4 or 8 so every
// warp belongs to one slice (one constant address per filter read).
// -D macros: as conv_reduce_tree (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW,
// OH, OW, PADDED, HAS_BIAS, BLOCK, SL, UNROLL_K). Only the batch is a run-time argument.
//
// Launch, in this order on one stream:
//   conv_reduce_atomic_init: block (BLOCK), grid (ceil(batch*OH*OW / BLOCK), M);
//   conv_reduce_atomic:      block (BLOCK/SL, SL), grid (ceil(batch*OH*OW / (BLOCK/SL)), M).

#define CG (C / G)
#define MG (M / G)
#define PX (BLOCK / SL)                 // output pixels per block
#define PASSES ((CG + SL - 1) / SL)     // channels a slice sums, at most

__constant__ float filters[M * CG * KH * KW];  // [m][c][kh][kw], c within the map's group
#if HAS_BIAS
__constant__ float bias[M];
#endif

// Every output element starts at its bias (or 0): the slices add onto it.
extern "C" __global__ void __launch_bounds__(BLOCK)
conv_reduce_atomic_init(float* __restrict__ y, int batch)
{
    const int pixel = blockIdx.x * BLOCK + threadIdx.x;  // over batch * OH * OW
    if (pixel >= batch * (OH * OW)) return;
    const int m = blockIdx.y;
    const int n = pixel / (OH * OW);
#if HAS_BIAS
    const float start = bias[m];
#else
    const float start = 0.0f;
#endif
    y[((size_t)n * M + m) * (OH * OW) + pixel % (OH * OW)] = start;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_reduce_atomic(const float* __restrict__ x, float* __restrict__ y, int batch)
{
    const int pixel = blockIdx.x * PX + threadIdx.x;  // over batch * OH * OW
    if (pixel >= batch * (OH * OW)) return;  // no barriers here: idle threads may leave
    const int slice = threadIdx.y;
    const int m = blockIdx.y;
    const int n = pixel / (OH * OW);
    const int oh = (pixel % (OH * OW)) / OW;
    const int ow = pixel % OW;
    const int ih0 = oh * SH - PH;
    const int iw0 = ow * SW - PW;

    const float* __restrict__ image = x + (size_t)n * (C * H * W) + (m / MG) * (CG * H * W);
    const float* filter = filters + m * (CG * KH * KW);
    float acc = 0.0f;
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
    atomicAdd(&y[((size_t)n * M + m) * (OH * OW) + oh * OW + ow], acc);
}
