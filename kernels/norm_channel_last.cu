// LayerNormalization over the channel axis of an N x C x H x W tensor, on tensors a run in FP16 or BF16 keeps
// channel-last in the format between its steps (opplugin/plan/channel_last.py): the format's bits, uint16
// [N][H][W][C] (HALF_FORMAT 1 FP16, 2 BF16, as half_bits.cuh numbers them). X_CHANNEL_LAST and Y_CHANNEL_LAST
// (0 or 1) say which of X and Y are so; the other is float32 NCHW, as reduce.cu's normalize_rows has it.
// The macros (opplugin/ops/reduction/linked_kernel.py): C (a multiple of 8), PLANE (H * W, for NCHW's
// addresses), EPSILON, PIXEL_LANES (threads a pixel, a power of two up to 32) and PER (the 8-channel pieces
// a thread takes: C / 8 / PIXEL_LANES rounded up).
//
// PIXEL_LANES neighbouring threads of a warp take one pixel's C channels, 8 (16 bytes) at a time: thread
// `lane` takes pieces lane, lane + PIXEL_LANES, ..., so a warp's load of a channel-last X is 32 / PIXEL_LANES
// runs of PIXEL_LANES * 16 contiguous bytes, every 32-byte sector whole. Each thread keeps its PER * 8 values
// in registers: the mean, then the mean of the squared deviations from it (two passes, as normalize_rows),
// each summed in FP32 and combined over the pixel's threads by shuffles. The values are widened to float as
// they are read (exact) and each output is rounded once, as it is stored.
//
// NaN and Inf: `nonfinite` (null: not watched) is set where a value as stored is NaN or Inf: an FP32 result
// rounded into FP16 past its range stores an infinity that FP32 would not have (ops/reduction/linked_kernel.py).

#include "half_bits.cuh"
#include "watch_flag.cuh"
#include "grid_dependency.cuh"

#define LANES 8
#define PIECES (C / LANES)
#define BLOCK_THREADS 256

#if X_CHANNEL_LAST
typedef unsigned short input_t;

// the 8 channels of piece `piece` of `pixel`, in one 16-byte load
__device__ __forceinline__ void read_piece(float (&v)[LANES], const input_t* __restrict__ x, long long pixel, int piece)
{
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(x + pixel * C + piece * LANES));
    const unsigned int words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = half_value<HALF_FORMAT>((unsigned short)(words[k] & 0xffffu));
        v[2 * k + 1] = half_value<HALF_FORMAT>((unsigned short)(words[k] >> 16));
    }
}
#else
typedef float input_t;

// the 8 channels of piece `piece` of `pixel` in NCHW, a plane apart
__device__ __forceinline__ void read_piece(float (&v)[LANES], const input_t* __restrict__ x, long long pixel, int piece)
{
    const long long at = (pixel / PLANE * C + piece * LANES) * PLANE + pixel % PLANE;
#pragma unroll
    for (int k = 0; k < LANES; ++k)
        v[k] = __ldg(x + at + (long long)k * PLANE);
}
#endif

#if Y_CHANNEL_LAST
typedef unsigned short output_t;

// the 8 channels of piece `piece` of `pixel`, rounded to the format, in one 16-byte store
__device__ __forceinline__ void write_piece(output_t* __restrict__ y, long long pixel, int piece, const float (&v)[LANES],
                                            unsigned char* nonfinite)
{
    unsigned int words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        words[k] = half_pair_bits<HALF_FORMAT>(v[2 * k], v[2 * k + 1]);
        if (nonfinite != nullptr && half_pair_nonfinite<HALF_FORMAT>(words[k])) *nonfinite = 1;
    }
    *reinterpret_cast<uint4*>(y + pixel * C + piece * LANES) = make_uint4(words[0], words[1], words[2], words[3]);
}
#else
typedef float output_t;

// the 8 channels of piece `piece` of `pixel` in NCHW, a plane apart
__device__ __forceinline__ void write_piece(output_t* __restrict__ y, long long pixel, int piece, const float (&v)[LANES],
                                            unsigned char* nonfinite)
{
    const long long at = (pixel / PLANE * C + piece * LANES) * PLANE + pixel % PLANE;
#pragma unroll
    for (int k = 0; k < LANES; ++k) {
        flag_nonfinite(nonfinite, v[k]);
        y[at + (long long)k * PLANE] = v[k];
    }
}
#endif

// the sum of v over the PIXEL_LANES threads of a pixel (an aligned part of the warp), in every one of them
__device__ __forceinline__ float pixel_sum(float v)
{
#pragma unroll
    for (int offset = PIXEL_LANES / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// grid: pixels * PIXEL_LANES threads (pixels = batch * PLANE), BLOCK_THREADS a block. Every thread of a warp
// runs the shuffles; those past the last pixel take no values.
AWAITS_PREVIOUS_GRID(normalize_channel_last)
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    normalize_channel_last(const input_t* __restrict__ x, const float* __restrict__ scale, const float* __restrict__ bias,
                           output_t* __restrict__ y, long long pixels, unsigned char* nonfinite)
{
    await_previous_grid();
    const long long thread = (long long)blockIdx.x * BLOCK_THREADS + threadIdx.x;
    const long long pixel = thread / PIXEL_LANES;
    const int lane = (int)(thread % PIXEL_LANES);
    float v[PER][LANES];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int piece = lane + k * PIXEL_LANES;
        if (pixel < pixels && piece < PIECES) {
            read_piece(v[k], x, pixel, piece);
        } else {
#pragma unroll
            for (int j = 0; j < LANES; ++j)
                v[k][j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < LANES; ++j)
            sum += v[k][j];
    }
    const float mean = pixel_sum(sum) / (float)C;
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        if (lane + k * PIXEL_LANES < PIECES) {  // a piece past the channels holds no deviation
#pragma unroll
            for (int j = 0; j < LANES; ++j) {
                const float d = v[k][j] - mean;
                squares = fmaf(d, d, squares);
            }
        }
    }
    const float variance = pixel_sum(squares) / (float)C;
    const float inv = 1.0f / sqrtf(variance + EPSILON);
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int piece = lane + k * PIXEL_LANES;
        if (pixel < pixels && piece < PIECES) {
            const float4* s = reinterpret_cast<const float4*>(scale + piece * LANES);
            const float4* b = reinterpret_cast<const float4*>(bias + piece * LANES);
            const float4 s0 = __ldg(s), s1 = __ldg(s + 1), b0 = __ldg(b), b1 = __ldg(b + 1);
            const float gain[LANES] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
            const float shift[LANES] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            float out[LANES];
#pragma unroll
            for (int j = 0; j < LANES; ++j)
                out[j] = (v[k][j] - mean) * inv * gain[j] + shift[j];
            write_piece(y, pixel, piece, out, nonfinite);
        }
    }
}
