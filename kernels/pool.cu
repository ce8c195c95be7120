// ONNX 2-D pooling on an N x C x H x W float32 tensor: MaxPool and AveragePool
// (pool_window), GlobalMaxPool and GlobalAveragePool (pool_global).
//
// Every shape constant arrives as an NVRTC -D macro (opplugin/ops/pool/kernel.py):
// C, H, W, OH, OW, the window KH, KW, strides SH, SW, dilations DH, DW, the start
// pads PT, PL, and for an average the padded extent PH_END, PW_END that
// count_include_pad counts; IS_MAX picks the reduction. The batch is a run-time
// argument. With the window fixed at compile time the kernel-offset loops unroll
// fully and the output index splits into (plane, row, column) by constant
// divisions (multiply and shift), so a thread's work is its loads and nothing else.
//
// Why it is fast: pooling reads each input element about KH*KW / (SH*SW) times and
// does one operation per read, so it is bound by memory. One thread per output,
// neighbouring threads on neighbouring output columns: a warp's loads for one kernel
// offset are one strided sweep of an input row, and the overlap between windows is
// served by L1/L2, so DRAM sees the input about once and the output once.
//
// The global pools give each (n, c) plane PLANE_THREADS threads (a warp, or a block
// for large planes): each thread accumulates its strided share of the plane in float,
// then a shuffle tree (and, across warps, shared memory) combines them. The order of
// every add is fixed by the macros, so a result never depends on the run.
//
// NaN and Inf: a max keeps a NaN once seen (`v > m || v != v`), so any window holding
// a NaN pools to NaN; +inf wins over the rest. onnxruntime keeps or drops a NaN by its
// place in the window, so the runner watches a max pool's output and reruns a chunk
// that holds NaN or Inf on onnxruntime (runtime/exact.py). Averages follow IEEE: NaN,
// or +inf and -inf in one window, give NaN, as in onnxruntime.

#include "pool_window.cuh"

#ifdef KH

extern "C" __global__ void pool_window(const float* __restrict__ x, float* __restrict__ y, long long outputs)
{
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= outputs)
        return;
    const int ow = (int)(index % OW);
    const int oh = (int)((index / OW) % OH);
    const long long plane = index / (OW * OH);
    const float* in = x + plane * (H * W);
    const int row0 = oh * SH - PT;
    const int col0 = ow * SW - PL;
#if IS_MAX
    float acc = NEG_INF;
#else
    float acc = 0.0f;
#endif
    for_each_in_window(row0, col0, [&](int r, int c) { acc = combine(acc, __ldg(in + r * W + c)); });
#if !IS_MAX
    acc = acc / (float)window_count(row0, col0);
#endif
    y[index] = acc;
}

#endif  // KH

#ifdef PLANE_THREADS

#define PLANE (H * W)
#define BLOCK_THREADS 256
#define PLANES_PER_BLOCK (BLOCK_THREADS / PLANE_THREADS)

// a fixed butterfly over the 32 lanes: every lane ends with the same value
__device__ __forceinline__ float warp_combine(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) pool_global(const float* __restrict__ x, float* __restrict__ y, long long planes)
{
    const long long plane = (long long)blockIdx.x * PLANES_PER_BLOCK + threadIdx.x / PLANE_THREADS;
    const int lane = threadIdx.x % PLANE_THREADS;
#if PLANE_THREADS == 32
    if (plane >= planes)  // whole warps leave, so the shuffles below see full warps
        return;
#endif
    const float* in = x + plane * PLANE;
#if IS_MAX
    float acc = NEG_INF;
#else
    float acc = 0.0f;
#endif
    for (int i = lane; i < PLANE; i += PLANE_THREADS)
        acc = combine(acc, __ldg(in + i));
    acc = warp_combine(acc);
#if PLANE_THREADS > 32
    // one block per plane (the grid has exactly `planes` blocks): warp results through shared memory
    __shared__ float partial[PLANE_THREADS / 32];
    if (lane % 32 == 0)
        partial[lane / 32] = acc;
    __syncthreads();
    if (lane >= 32)
        return;
    acc = lane < PLANE_THREADS / 32 ? partial[lane] : (IS_MAX ? NEG_INF : 0.0f);
    acc = warp_combine(acc);
#endif
    if (lane == 0)
#if IS_MAX
        y[plane] = acc;
#else
        y[plane] = acc / (float)PLANE;
#endif
}

#endif  // PLANE_THREADS
