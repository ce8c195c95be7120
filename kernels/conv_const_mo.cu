// conv_const_mo: 2-D convolution (ONNX Conv, any group count G), filters and bias in
// __constant__ memory, each thread computing MO output maps of one output pixel.
//
// Why it beats conv_const: conv_const loads the same C x KH x KW input window
// once per output map; here one load feeds MO multiply-adds, so input traffic
// and address arithmetic drop by a factor of MO. The maps a thread computes are
// fixed at compile time (the block's map group is dispatched to a specialised
// copy of the loop), so every filter offset is a literal, plus the channel's
// offset (uniform across the warp) when UNROLL_C keeps the channel loop rolled.
// ptxas for sm_80 then folds each weight into its FFMA as a constant-bank
// operand; for sm_90 it loads them two at a time into uniform registers. For
// those pairs the host uploads the filters transposed to [C][KH][KW][M] (map
// index fastest): the MO weights of one tap sit side by side. Same -D macros as
// conv_const, plus MO (maps per thread); M need not be a multiple of MO, the
// last group computes fewer maps.
//
// Launch: block (BLOCK), grid (ceil(batch*OH*OW / BLOCK), ceil(M / MO)).

__constant__ float filters[(C / G) * KH * KW * M];  // [c][kh][kw][m], c within the map's group
#if HAS_BIAS
__constant__ float bias[M];
#endif

#define GROUPS ((M + MO - 1) / MO)  // map groups, one per blockIdx.y

// Output maps FIRST .. FIRST+COUNT-1 of one pixel. `out` points at map 0 of
// that pixel; maps are OH*OW floats apart.
template <int FIRST, int COUNT>
__device__ __forceinline__ void conv_tile(const float* __restrict__ image, float* __restrict__ out,
                                          int ih0, int iw0)
{
    // the host keeps the MO maps of a thread inside one group: one set of input channels
    image += (FIRST / (M / G)) * ((C / G) * H * W);
    float acc[COUNT];
#pragma unroll
    for (int j = 0; j < COUNT; ++j) acc[j] = 0.0f;

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
                const float v = image[(c * H + ih) * W + iw];
#pragma unroll
                for (int j = 0; j < COUNT; ++j)
                    acc[j] += v * filters[((c * KH + kh) * KW + kw) * M + FIRST + j];
            }
        }
    }

#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
#if HAS_BIAS
        acc[j] += bias[FIRST + j];
#endif
        out[(FIRST + j) * (OH * OW)] = acc[j];
    }
}

#include "conv_map_groups.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_const_mo(const float* __restrict__ x, float* __restrict__ y, int batch)
{
    const int pixel = blockIdx.x * BLOCK + threadIdx.x;  // over batch * OH * OW
    if (pixel >= batch * (OH * OW)) return;
    const int n = pixel / (OH * OW);
    const int oh = (pixel % (OH * OW)) / OW;
    const int ow = pixel % OW;

    const float* image = x + (size_t)n * (C * H * W);
    float* out = y + (size_t)n * (M * OH * OW) + oh * OW + ow;
    for_map_group<0>(blockIdx.y, image, out, oh * SH - PH, ow * SW - PW);
}
