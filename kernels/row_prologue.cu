// row_prologue: what a GEMM's step does to A's rows on their way into the product (ops/gemm/row_prologue.py),
// so that a LayerNorm or a row gather that only that GEMM reads needs no step of its own:
// - with `table`, output row r is input row (r / rows_out) * rows_in + table[r % rows_out]: the rows of each
//   image gathered (Swin's shift, padding and windows, graph/passes/row_gather.py); a table entry of -1 is a
//   row of zeros (a padded one: neither normalised nor read);
// - with NORMALISE, each row normalised as a LayerNormalization over the last axis would, in FP32 as
//   kernels/reduce.cu does: two passes (the mean, then the mean of the squared deviations),
//   inv = 1 / sqrtf(variance + epsilon), (x - mean) * inv * scale + bias;
// - with `small` given (wg_3xtf32), each value's TF32 small part written beside it: the pass
//   gemm_small_parts would otherwise make over A, made here from the rows as they are read;
// - with HALF_OUT (1 FP16, 2 BF16: wg_fp16, wg_bf16), the rows written in that format's bits instead of
//   FP32, as the half-precision GEMM reads them: the pass gemm_to_half would otherwise make (no `small`).
// x: C-contiguous rows of k floats; a and small: rows x k, C-contiguous. Launch: block 256 (a warp a row),
// grid ceil(rows / 8).
#include "tf32_small_part.cuh"
#ifdef HALF_OUT
#include "half_bits.cuh"
typedef unsigned short out_t;
#define STORED(v) half_bits<HALF_OUT>(v)
#else
typedef float out_t;
#define STORED(v) (v)
#endif

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int step = 16; step > 0; step /= 2) v += __shfl_xor_sync(0xffffffffu, v, step);
    return v;
}

extern "C" __global__ void __launch_bounds__(256)
row_prologue(const float* __restrict__ x, const int* __restrict__ table, int rows_in, int rows_out, const float* __restrict__ scale,
             const float* __restrict__ bias, out_t* __restrict__ a, float* __restrict__ small, int rows, int k, float epsilon)
{
    const int lane = threadIdx.x % 32;
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;  // a whole warp: the shuffles below see every lane
    const int taken = table == nullptr ? 0 : __ldg(table + row % rows_out);
    out_t* out = a + row * k;
    if (taken < 0) {  // a padded row: zeros, and zero small parts
        for (int i = lane; i < k; i += 32) {
            out[i] = 0;  // zero's bits in every format
            if (small != nullptr) small[row * k + i] = 0.0f;
        }
        return;
    }
    const long long source = table == nullptr ? row : row / rows_out * rows_in + taken;
    const float* in = x + source * k;
#if NORMALISE
    float sum = 0.0f;
    for (int i = lane; i < k; i += 32) sum += in[i];
    const float mean = warp_sum(sum) / (float)k;
    float squares = 0.0f;
    for (int i = lane; i < k; i += 32) {
        const float d = in[i] - mean;
        squares += d * d;
    }
    const float inv = 1.0f / sqrtf(warp_sum(squares) / (float)k + epsilon);
#endif
    for (int i = lane; i < k; i += 32) {
#if NORMALISE
        const float v = (in[i] - mean) * inv * __ldg(scale + i) + __ldg(bias + i);
#else
        const float v = in[i];
#endif
        out[i] = STORED(v);
        if (small != nullptr) small[row * k + i] = small_part(v);
    }
}
