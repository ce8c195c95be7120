// conv_baseline: 2-D convolution (ONNX Conv, any group count G), one thread per output element.
//
// The plain kernel the seeds start from, and the reference point for every
// faster variant: each thread walks the whole C x KH x KW filter window of its
// output map and reads each weight from global memory through a pointer, so it
// also serves nodes whose weights are computed at run time. Deliberately plain:
// its pointers carry no __restrict__ (the compiler must assume they may alias,
// so it cannot route the loads through the read-only path or reorder them past
// the store) and every filter loop is kept rolled with `#pragma unroll 1` (a
// compare and branch per tap, and index arithmetic redone each iteration).
// conv_unrolled is this kernel with exactly those two things changed.
// Shape constants still arrive as -D macros (C, M, G, H, W, KH, KW, SH, SW, PH,
// PW, DH, DW, OH, OW, PADDED, HAS_BIAS, BLOCK); only the batch size is a
// run-time argument. (UNROLL_C may be defined by the host; it is not used here.)
//
// Launch: block (BLOCK), grid (ceil(batch*OH*OW / BLOCK), M). Thread x indexes
// one output pixel of one image, blockIdx.y the output map.

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_baseline(const float* x,
              const float* w,
              const float* b,
              float* y,
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
    const float* image = x + (size_t)n * (C * H * W) + (m / (M / G)) * ((C / G) * H * W);
    const float* filter = w + m * ((C / G) * KH * KW);
    float acc = 0.0f;
#pragma unroll 1
    for (int c = 0; c < C / G; ++c) {
#pragma unroll 1
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = ih0 + kh * DH;
#if PADDED
            if (ih < 0 || ih >= H) continue;
#endif
#pragma unroll 1
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
