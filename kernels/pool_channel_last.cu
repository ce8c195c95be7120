// ONNX 2-D pooling on tensors a run in FP16 or BF16 keeps channel-last in the format between its steps
// (opplugin/plan/channel_last.py): the format's bits, uint16 [N][H][W][C] (HALF_FORMAT 1 FP16, 2 BF16, as
// half_bits.cuh numbers them). X_CHANNEL_LAST and Y_CHANNEL_LAST (0 or 1) say which of X and Y are so;
// the other is float32 NCHW, as pool.cu has it. The shape and window macros are pool.cu's
// (opplugin/ops/pool/kernel.py); C is a multiple of 8.
//
// A thread pools LANES (8) neighbouring channels, 16 bytes of the format: a channel-last X comes in one
// 16-byte load a window element, a channel-last Y goes out in one 16-byte store. Values are widened to
// float as they are read (exact) and combined as pool.cu combines them, in the same order, with the same
// nan_max and the same divisor; they are rounded once, as they are stored. So a max is the max of the
// rounded values, which is the rounded max, and a window average is pool.cu's on the same values, rounded.
//
// pool_window_channel_last: one thread per output pixel and 8 channels. Over a channel-last X,
// neighbouring threads take neighbouring channel groups of one pixel, so a warp's loads of one window
// element are one 512-byte sweep; over an NCHW X, they take neighbouring output columns, as in pool.cu.
//
// pool_global_channel_last (the global pools, and ReduceMean over H and W): X channel-last, Y float32
// [N][C] (NCHW's order of an [N, C, 1, 1] output). A block takes GROUP_TILE channel groups of one image
// and BLOCK_THREADS / GROUP_TILE threads along its pixels; each thread combines its strided share of
// them, then one thread a channel combines the shares in order through shared memory.
//
// NaN and Inf: `nonfinite` (null: not watched) is set where a value as stored is NaN or Inf: a max pool's
// step is watched (runtime/exact.py), and an FP32 average rounded into FP16 past its range stores an
// infinity that FP32 would not have.

#include "half_bits.cuh"
#include "pool_window.cuh"
#include "watch_flag.cuh"
#include "grid_dependency.cuh"

#define LANES 8
#define GROUPS (C / LANES)

#if X_CHANNEL_LAST
typedef unsigned short input_t;

// the 8 channels of a channel-last X from element `at`, in one 16-byte load
__device__ __forceinline__ void read_lanes(float (&v)[LANES], const input_t* __restrict__ x, long long at)
{
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(x + at));
    const unsigned int words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = half_value<HALF_FORMAT>((unsigned short)(words[k] & 0xffffu));
        v[2 * k + 1] = half_value<HALF_FORMAT>((unsigned short)(words[k] >> 16));
    }
}
#else
typedef float input_t;

// the 8 channels of an NCHW X from element `at`, a plane apart
__device__ __forceinline__ void read_lanes(float (&v)[LANES], const input_t* __restrict__ x, long long at)
{
#pragma unroll
    for (int k = 0; k < LANES; ++k)
        v[k] = __ldg(x + at + (long long)k * (H * W));
}
#endif

#ifdef KH

#if Y_CHANNEL_LAST
typedef unsigned short output_t;

// the 8 channels of a channel-last Y at element `at`, rounded to the format, in one 16-byte store
__device__ __forceinline__ void write_lanes(output_t* __restrict__ y, long long at, const float (&v)[LANES], unsigned char* nonfinite)
{
    unsigned int words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned short low = half_bits<HALF_FORMAT>(v[2 * k]), high = half_bits<HALF_FORMAT>(v[2 * k + 1]);
        flag_nonfinite(nonfinite, half_value<HALF_FORMAT>(low));
        flag_nonfinite(nonfinite, half_value<HALF_FORMAT>(high));
        words[k] = (unsigned int)low | ((unsigned int)high << 16);
    }
    *reinterpret_cast<uint4*>(y + at) = make_uint4(words[0], words[1], words[2], words[3]);
}
#else
typedef float output_t;

// the 8 channels of an NCHW Y from element `at`, a plane apart
__device__ __forceinline__ void write_lanes(output_t* __restrict__ y, long long at, const float (&v)[LANES], unsigned char* nonfinite)
{
#pragma unroll
    for (int k = 0; k < LANES; ++k) {
        flag_nonfinite(nonfinite, v[k]);
        y[at + (long long)k * (OH * OW)] = v[k];
    }
}
#endif

// threads: batch * OH * OW * GROUPS
AWAITS_PREVIOUS_GRID(pool_window_channel_last)
extern "C" __global__ void __launch_bounds__(256)
    pool_window_channel_last(const input_t* __restrict__ x, output_t* __restrict__ y, long long threads, unsigned char* nonfinite)
{
    await_previous_grid();
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= threads)
        return;
#if X_CHANNEL_LAST
    const int group = (int)(index % GROUPS);
    const long long pixel = index / GROUPS;
    const int ow = (int)(pixel % OW);
    const int oh = (int)((pixel / OW) % OH);
    const long long n = pixel / (OW * OH);
#else
    const int ow = (int)(index % OW);
    const int oh = (int)((index / OW) % OH);
    const long long plane = index / (OW * OH);
    const int group = (int)(plane % GROUPS);
    const long long n = plane / GROUPS;
#endif
    const int first = group * LANES;
    const int row0 = oh * SH - PT;
    const int col0 = ow * SW - PL;
    float acc[LANES];
#pragma unroll
    for (int k = 0; k < LANES; ++k)
        acc[k] = IS_MAX ? NEG_INF : 0.0f;
    for_each_in_window(row0, col0, [&](int r, int c) {
        float v[LANES];
#if X_CHANNEL_LAST
        read_lanes(v, x, ((n * H + r) * W + c) * C + first);
#else
        read_lanes(v, x, ((n * C + first) * H + r) * W + c);
#endif
#pragma unroll
        for (int k = 0; k < LANES; ++k)
            acc[k] = combine(acc[k], v[k]);
    });
#if !IS_MAX
    const float count = (float)window_count(row0, col0);
#pragma unroll
    for (int k = 0; k < LANES; ++k)
        acc[k] = acc[k] / count;
#endif
#if Y_CHANNEL_LAST
    write_lanes(y, ((n * OH + oh) * OW + ow) * C + first, acc, nonfinite);
#else
    write_lanes(y, ((n * C + first) * OH + oh) * OW + ow, acc, nonfinite);
#endif
}

#endif  // KH

#ifdef GROUP_TILE

#if !X_CHANNEL_LAST || Y_CHANNEL_LAST
#error "a global pool reads X channel-last and writes Y in float32"
#endif

#define PLANE (H * W)
#define BLOCK_THREADS 256
#define PIXEL_THREADS (BLOCK_THREADS / GROUP_TILE)
#define TILE_CHANNELS (GROUP_TILE * LANES)

// blocks: batch * TILES, TILES = ceil(GROUPS / GROUP_TILE)
AWAITS_PREVIOUS_GRID(pool_global_channel_last)
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
    pool_global_channel_last(const input_t* __restrict__ x, float* __restrict__ y, unsigned char* nonfinite)
{
    await_previous_grid();
    __shared__ float shares[PIXEL_THREADS][TILE_CHANNELS];
    const long long n = blockIdx.x / TILES;
    const int tile = blockIdx.x % TILES;
    const int along = threadIdx.x / GROUP_TILE;  // of the plane's pixels
    const int group = tile * GROUP_TILE + threadIdx.x % GROUP_TILE;
    float acc[LANES];
#pragma unroll
    for (int k = 0; k < LANES; ++k)
        acc[k] = IS_MAX ? NEG_INF : 0.0f;
    if (along < PIXEL_THREADS && group < GROUPS) {
#pragma unroll 4
        for (int p = along; p < PLANE; p += PIXEL_THREADS) {  // loads of 4 pixels in flight
            float v[LANES];
            read_lanes(v, x, (n * PLANE + p) * C + group * LANES);
#pragma unroll
            for (int k = 0; k < LANES; ++k)
                acc[k] = combine(acc[k], v[k]);
        }
    }
    if (along < PIXEL_THREADS) {
#pragma unroll
        for (int k = 0; k < LANES; ++k)
            shares[along][(threadIdx.x % GROUP_TILE) * LANES + k] = acc[k];
    }
    __syncthreads();
    const int channel = tile * TILE_CHANNELS + threadIdx.x;  // one thread a channel of the tile, the shares in order
    if (threadIdx.x >= TILE_CHANNELS || channel >= C)
        return;
    float total = shares[0][threadIdx.x];
    for (int s = 1; s < PIXEL_THREADS; ++s)
        total = combine(total, shares[s][threadIdx.x]);
#if !IS_MAX
    total = total / (float)PLANE;
#endif
    flag_nonfinite(nonfinite, total);
    y[n * C + channel] = total;
}

#endif  // GROUP_TILE
