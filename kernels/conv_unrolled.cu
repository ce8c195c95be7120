// conv_unrolled: 2-D convolution (ONNX Conv, any group count G), one thread per
// output element, weights from global memory: conv_baseline with the seeds'
// "__restrict__ and loop unrolling" step applied and nothing else.
//
// Why it should be faster than conv_baseline:
// - `const float* __restrict__` promises the compiler that x, w and b never
//   alias y, so it may load through the read-only (non-coherent) data path and
//   hoist or batch the loads of a window ahead of the multiply-adds;
// - every filter loop is unrolled with compile-time bounds (KH, KW are -D
//   macros; the channel loop too, UNROLL_C = C/G when the unrolled body stays
//   small): no loop counters or branches per tap, every filter offset and
//   input row offset becomes an immediate, and the independent loads of a
//   window can all be in flight together.
// The arithmetic and its order are the same as conv_baseline's, so the results
// are bit-identical to it.
// -D macros: C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, PADDED,
// HAS_BIAS, BLOCK, UNROLL_C. Only the batch is a run-time argument.
//
// Launch: block (BLOCK), grid (ceil(batch*OH*OW / BLOCK), M). Thread x indexes
// one output pixel of one image, blockIdx.y the output map.

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_unrolled(const float* __restrict__ x,
              const float* __restrict__ w,
              const float* __restrict__ b,
              float* __restrict__ y,
              int batch)
{
    const int pixel = blockIdx.x * BLOCK + threadIdx.x;  // over batch * OH * OW
    if (pixel >= batch * (OH * OW)) return;
    const int m = blockIdx.y;
    const int n = pixel / (OH * OW);
    const int oh = (pixel % (OH * OW)) / OW;
    const int ow = pixel % OW;
    const int ih0 = oh * SH - PH;
    const int iw0 = ow * SW - PW;

    // map m reads the C/G input channels of its group
    const float* __restrict__ image = x + (size_t)n * (C * H * W) + (m / (M / G)) * ((C / G) * H * W);
    const float* __restrict__ filter = w + m * ((C / G) * KH * KW);
    float acc = 0.0f;
#pragma unroll UNROLL_C
    for (int c = 0; c < C / G; ++c) {
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
#if HAS_BIAS
    acc += b[m];
#endif
    y[((size_t)n * M + m) * (OH * OW) + oh * OW + ow] = acc;
}
