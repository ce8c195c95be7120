// conv_im2col: the unroll half of the im2col + GEMM variant (ONNX Conv, any
// group count G). Writes the input of a chunk of `images` images as the
// matrix the convolution multiplies by its filters:
//
//   unrolled[row][col], row = (c * KH + kh) * KW + kw over all C channels,
//                       col = n * OH * OW + oh * OW + ow over the chunk's outputs,
//   value = x[n][c][oh * SH - PH + kh * DH][ow * SW - PW + kw * DW] (0 in the pads).
//
// The rows of group g (channels g*C/G ..) are rows g*KDIM .. of this matrix, so
// the GEMM kernel (conv_gemm.cu) finds group g's K x cols matrix at row g*KDIM.
//
// Why it should be faster than a direct convolution: it is not, on its own; it
// turns the convolution into one dense matrix product, which conv_gemm.cu tiles
// through shared memory so each loaded value feeds many multiply-adds. The price
// is KH*KW copies of the input written to and read back from global memory.
// Each thread copies the KH x KW window of one (channel, output pixel); the
// threads of a warp take neighbouring output pixels, so every store is coalesced.
//
// Shapes are -D macros (C, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW,
// PADDED, BLOCK); `images` is the chunk size, the only run-time argument.
// Launch: block (BLOCK), grid (ceil(images*OH*OW / BLOCK), C).

#define P (OH * OW)  // output pixels of one image

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_im2col(const float* __restrict__ x, float* __restrict__ unrolled, int images)
{
    const int cols = images * P;
    const int col = blockIdx.x * BLOCK + threadIdx.x;
    if (col >= cols) return;
    const int c = blockIdx.y;
    const int n = col / P;
    const int p = col - n * P;
    const int ih0 = (p / OW) * SH - PH;
    const int iw0 = (p % OW) * SW - PW;

    const float* plane = x + ((size_t)n * C + c) * (H * W);
    float* out = unrolled + (size_t)c * (KH * KW) * cols + col;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh * DH;
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = iw0 + kw * DW;
#if PADDED
            const bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
            const float v = inside ? __ldg(plane + ih * W + iw) : 0.0f;
#else
            const float v = __ldg(plane + ih * W + iw);
#endif
            out[(size_t)(kh * KW + kw) * cols] = v;
        }
    }
}
