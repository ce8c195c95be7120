// conv_tiled: 2-D convolution (ONNX Conv, any group count G), shared-memory tiled:
// a block computes a TH x TW tile of one output map of one image, one output
// per thread, staging its input window in shared memory one channel at a time.
// Filters and bias in __constant__ memory.
//
// Why it should be faster than conv_const: there, each input element is read
// from global memory (or L1) by every output whose window covers it, up to
// KH x KW times. Here the block loads the input tile its outputs need, halo
// included, once per channel with coalesced row-wise loads, then every thread
// reads its KH x KW taps from shared memory, which serves a warp in one pass
// (bank conflicts aside: a stride SW > 1 spreads a warp's taps SW words apart).
// The cost: two barriers per channel, and the halo rows and columns that are
// loaded but shared with the neighbouring tiles.
//
// The tile of input a block needs, per channel:
//   IN_TH = (TH-1)*SH + (KH-1)*DH + 1 rows, IN_TW = (TW-1)*SW + (KW-1)*DW + 1 columns,
// starting at (oh0*SH - PH, ow0*SW - PW). Elements outside the image (pads, and
// tiles that overhang the output edge) are stored as 0, the pad value; threads
// of an overhanging tile still load and meet the barriers, but store nothing.
//
// -D macros: C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW, PADDED,
// HAS_BIAS, UNROLL_C, plus TW and TH (tile width and height = block shape,
// TW*TH threads). Only the batch is a run-time argument.
//
// Launch: block (TW, TH), grid (batch * TILES_H * TILES_W, M): blockIdx.x is
// (image, tile) with the tile fastest, blockIdx.y the output map.

#define CG (C / G)  // input channels per group
#define MG (M / G)  // output maps per group
#define THREADS (TW * TH)
#define IN_TH ((TH - 1) * SH + (KH - 1) * DH + 1)
#define IN_TW ((TW - 1) * SW + (KW - 1) * DW + 1)
#define TILE_SIZE (IN_TH * IN_TW)
#define LOADS ((TILE_SIZE + THREADS - 1) / THREADS)  // tile elements per thread, at most
#define TILES_H ((OH + TH - 1) / TH)
#define TILES_W ((OW + TW - 1) / TW)
// a tile may reach outside the image: with pads, or where it overhangs the output
#define EDGE_CHECK (PADDED || (OH % TH) != 0 || (OW % TW) != 0)

__constant__ float filters[M * CG * KH * KW];  // [m][c][kh][kw], c within the map's group
#if HAS_BIAS
__constant__ float bias[M];
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
conv_tiled(const float* __restrict__ x, float* __restrict__ y, int batch)
{
    __shared__ float tile[TILE_SIZE];

    const int n = blockIdx.x / (TILES_H * TILES_W);
    const int t = blockIdx.x % (TILES_H * TILES_W);
    const int oh0 = (t / TILES_W) * TH;
    const int ow0 = (t % TILES_W) * TW;
    const int m = blockIdx.y;
    const int oh = oh0 + threadIdx.y;
    const int ow = ow0 + threadIdx.x;
    const int ih0 = oh0 * SH - PH;  // the tile's first input row and column
    const int iw0 = ow0 * SW - PW;
    const int lane = threadIdx.y * TW + threadIdx.x;

    const float* __restrict__ image = x + (size_t)n * (C * H * W) + (m / MG) * (CG * H * W);
    const float* filter = filters + m * (CG * KH * KW);
    float acc = 0.0f;

#pragma unroll UNROLL_C
    for (int c = 0; c < CG; ++c) {
        const float* __restrict__ plane = image + c * (H * W);
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int i = lane + k * THREADS;
            if (TILE_SIZE % THREADS != 0 && i >= TILE_SIZE) break;
            const int ih = ih0 + i / IN_TW;
            const int iw = iw0 + i % IN_TW;
            const bool inside = !EDGE_CHECK || (ih >= 0 && ih < H && iw >= 0 && iw < W);
            tile[i] = inside ? plane[ih * W + iw] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
#pragma unroll
            for (int kw = 0; kw < KW; ++kw)
                acc += tile[(threadIdx.y * SH + kh * DH) * IN_TW + threadIdx.x * SW + kw * DW]
                     * filter[(c * KH + kh) * KW + kw];
        }
        __syncthreads();  // before the next channel overwrites the tile
    }

    if (oh < OH && ow < OW) {
#if HAS_BIAS
        acc += bias[m];
#endif
        y[((size_t)n * M + m) * (OH * OW) + oh * OW + ow] = acc;
    }
}
