// Reductions and normalisations over one run of adjacent axes of a float32 tensor:
// reduce_rows (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2,
// ReduceSumSquare, ReduceLogSum), softmax_rows (Softmax, LogSoftmax)
// and normalize_rows (LayerNormalization, GroupNormalization, InstanceNormalization).
//
// The tensor is seen as (outer, EXTENT, INNER) (opplugin/ops/reduction/rows.py): element
// (o, r, i) at (o * EXTENT + r) * INNER + i, reduced over r. A group of TX x TY threads
// owns one o and TX neighbouring i; thread (tx, ty) takes r = ty, ty + TY, ... Neighbouring
// threads therefore read neighbouring addresses in both layouts:
// - INNER == 1 (the last axes: a softmax over classes, a LayerNorm over NHWC's channels):
//   TX = 1, and the TY threads sweep the row, a warp reading 32 consecutive floats;
// - INNER > 1 (a channel axis of NCHW: r strides by INNER): TX = 32 (fewer for a small
//   INNER), and a warp reads 32 consecutive i of one r, so strided rows stay coalesced.
// The TY partial results of a tx combine by warp shuffles, then (past a warp) through
// shared memory in a fixed order, so a result never depends on the run. A group may be
// smaller than a warp (8 threads along a short row: a sector each load), several a warp.
//
// Every shape constant is an NVRTC -D macro (ops/reduction/kernel.py): EXTENT, INNER,
// TX, TY, GPB (groups per block), TILES (groups per o: INNER / TX rounded up), PER (the
// r a thread takes: EXTENT / TY rounded up) and CACHE (1: a thread keeps its PER values
// in registers between passes; 0: later passes read them again, from L1/L2). The outer
// count (the batch times the axes before the run) is a run-time argument, as groups.
//
// Arithmetic is FP32. The normalisations are two-pass (the mean, then the mean of the
// squared deviations from it), the softmax subtracts the row's maximum before exp.
// NaN: a max keeps a NaN once seen, so a row with a NaN gives NaN, as sums do.

#define GROUP_THREADS (TX * TY)
#define BLOCK_THREADS (GROUP_THREADS * GPB)
#define ROW_ELEMENTS ((long long)EXTENT * INNER)
#define NEG_INF __int_as_float(0xff800000)
// the slots of a group's partial results in shared memory: one per ty when a warp holds a
// single ty (TX >= 32), else one per warp (its ty already combined by shuffles)
#if TX >= 32
#define SLOTS TY
#elif GROUP_THREADS > 32
#define SLOTS (GROUP_THREADS / 32)
#else
#define SLOTS 1
#endif
// a group of fewer than 32 threads is an aligned part of a warp: its shuffles stay inside it
#define FIRST_OFFSET (GROUP_THREADS >= 32 ? 16 : GROUP_THREADS / 2)

// how partial results combine: REDUCE_OP's codes (a mean sums, then divides by the extent)
#define COMBINE_SUM 0
#define COMBINE_MAX 2
#define COMBINE_MIN 3
#define COMBINE_PROD 4

__device__ __forceinline__ float nan_max(float m, float v)
{
    return (v > m || v != v) ? v : m;
}

__device__ __forceinline__ float nan_min(float m, float v)
{
    return (v < m || v != v) ? v : m;
}

template <int OP>
__device__ __forceinline__ float combine(float a, float b)
{
    return OP == COMBINE_MAX ? nan_max(a, b) : OP == COMBINE_MIN ? nan_min(a, b) : OP == COMBINE_PROD ? a * b : a + b;
}

// Where a thread works: its group's o and i, and whether that i exists.
struct Place {
    long long o;
    int i, tx, ty, group;
    bool valid;
};

__device__ __forceinline__ Place place(long long groups)
{
    Place p;
    p.group = threadIdx.x / GROUP_THREADS;
    const int local = threadIdx.x % GROUP_THREADS;
    p.tx = local % TX;
    p.ty = local / TX;
    const long long index = (long long)blockIdx.x * GPB + p.group;
    p.o = index / TILES;
    p.i = (int)(index % TILES) * TX + p.tx;
    p.valid = index < groups && p.i < INNER;
    return p;
}

// The combination of v over the TY threads of p's group that share p.tx, in every one of them.
// Every thread of the block calls it (the shuffles and barriers need them all).
template <int OP>
__device__ __forceinline__ float group_combine(float v, float* partial, const Place& p)
{
#if TX < 32
    // lanes tx, tx + TX, tx + 2 TX, ... of a warp (or of a smaller group) hold the same i
#pragma unroll
    for (int offset = FIRST_OFFSET; offset >= TX; offset >>= 1)
        v = combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, offset));
#endif
#if SLOTS > 1
    const int local = p.ty * TX + p.tx;
    const int slot = TX >= 32 ? p.ty : local / 32;
    if (TX >= 32 || local % 32 < TX)
        partial[(p.group * SLOTS + slot) * TX + p.tx] = v;
    __syncthreads();
    v = partial[p.group * SLOTS * TX + p.tx];
#pragma unroll
    for (int s = 1; s < SLOTS; ++s)
        v = combine<OP>(v, partial[(p.group * SLOTS + s) * TX + p.tx]);
    __syncthreads();  // before the next combine writes the slots again
#endif
    return v;
}

#if SLOTS > 1
#define PARTIAL_SPACE __shared__ float partial[GPB * SLOTS * TX]
#else
#define PARTIAL_SPACE float* partial = nullptr
#endif

// The thread's r (ty, ty + TY, ...) with k counting them; with CACHE its values are v[k],
// loaded once by LOAD_ROW, else each pass reads them again (from L1/L2).
#if CACHE
#define FOR_EACH_R(k, r) _Pragma("unroll") for (int k = 0, r = p.ty; k < PER; ++k, r += TY) if (p.valid && r < EXTENT)
#define VALUE(k, r) v[k]
#define LOAD_ROW(fill) \
    float v[PER]; \
    _Pragma("unroll") for (int k = 0; k < PER; ++k) { \
        const int r = p.ty + k * TY; \
        v[k] = p.valid && r < EXTENT ? __ldg(row + (long long)r * INNER) : (fill); \
    }
#else
#define FOR_EACH_R(k, r) for (int k = 0, r = p.ty; p.valid && r < EXTENT; ++k, r += TY)
#define VALUE(k, r) __ldg(row + (long long)(r) * INNER)
#define LOAD_ROW(fill)
#endif

#ifdef REDUCE_OP  // 0 sum, 1 mean, 2 max, 3 min, 4 product
// REDUCE_MAP: what the first stage applies to each input value (0 x, 1 |x|, 2 x * x); REDUCE_FINISH:
// what the last applies to its result (0 nothing, 1 sqrt, 2 log). A stage between passes sums on.
#ifndef REDUCE_MAP
#define REDUCE_MAP 0
#endif
#ifndef REDUCE_FINISH
#define REDUCE_FINISH 0
#endif

__device__ __forceinline__ float mapped(float v)
{
    return REDUCE_MAP == 1 ? fabsf(v) : REDUCE_MAP == 2 ? v * v : v;
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) reduce_rows(const float* __restrict__ x, float* __restrict__ y, long long groups)
{
    PARTIAL_SPACE;
    const Place p = place(groups);
    const float* row = x + p.o * ROW_ELEMENTS + p.i;
    const float start = REDUCE_OP == COMBINE_MAX ? NEG_INF : REDUCE_OP == COMBINE_MIN ? -NEG_INF : REDUCE_OP == COMBINE_PROD ? 1.0f : 0.0f;
    float acc = start;
    if (p.valid) {
#pragma unroll 4
        for (int r = p.ty; r < EXTENT; r += TY)
            acc = combine<REDUCE_OP>(acc, mapped(__ldg(row + (long long)r * INNER)));
    }
    acc = group_combine<REDUCE_OP>(acc, partial, p);
    if (REDUCE_OP == 1) acc /= (float)EXTENT;
    if (REDUCE_FINISH == 1) acc = sqrtf(acc);
    if (REDUCE_FINISH == 2) acc = logf(acc);
    if (p.valid && p.ty == 0)
        y[p.o * INNER + p.i] = acc;
}

#endif  // REDUCE_OP

#ifdef SOFTMAX_LOG  // 0 Softmax, 1 LogSoftmax

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) softmax_rows(const float* __restrict__ x, float* __restrict__ y, long long groups)
{
    PARTIAL_SPACE;
    const Place p = place(groups);
    const float* row = x + p.o * ROW_ELEMENTS + p.i;
    float* out = y + p.o * ROW_ELEMENTS + p.i;
    LOAD_ROW(NEG_INF)
    float top = NEG_INF;
    FOR_EACH_R(k, r) top = nan_max(top, VALUE(k, r));
    top = group_combine<COMBINE_MAX>(top, partial, p);
    float sum = 0.0f;
    FOR_EACH_R(k, r) sum += expf(VALUE(k, r) - top);
    sum = group_combine<COMBINE_SUM>(sum, partial, p);
#if SOFTMAX_LOG
    const float log_sum = logf(sum);
    FOR_EACH_R(k, r) out[(long long)r * INNER] = (VALUE(k, r) - top) - log_sum;
#else
    FOR_EACH_R(k, r) out[(long long)r * INNER] = expf(VALUE(k, r) - top) / sum;
#endif
}

#endif  // SOFTMAX_LOG

#ifdef EPSILON  // with NGROUPS and CHANNEL_SIZE: element r of row o has channel ((o % NGROUPS) * EXTENT + r) / CHANNEL_SIZE

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS)
normalize_rows(const float* __restrict__ x, const float* __restrict__ scale, const float* __restrict__ bias, float* __restrict__ y,
               long long groups)
{
    PARTIAL_SPACE;
    const Place p = place(groups);
    const float* row = x + p.o * ROW_ELEMENTS + p.i;
    float* out = y + p.o * ROW_ELEMENTS + p.i;
    LOAD_ROW(0.0f)
    float sum = 0.0f;
    FOR_EACH_R(k, r) sum += VALUE(k, r);
    const float mean = group_combine<COMBINE_SUM>(sum, partial, p) / (float)EXTENT;
    float squares = 0.0f;
    FOR_EACH_R(k, r) {
        const float d = VALUE(k, r) - mean;
        squares = fmaf(d, d, squares);
    }
    const float variance = group_combine<COMBINE_SUM>(squares, partial, p) / (float)EXTENT;
    const float inv = 1.0f / sqrtf(variance + EPSILON);
    const long long channel0 = (long long)(p.o % NGROUPS) * EXTENT;
    FOR_EACH_R(k, r) {
        const int c = (int)((channel0 + r) / CHANNEL_SIZE);
        out[(long long)r * INNER] = (VALUE(k, r) - mean) * inv * __ldg(scale + c) + __ldg(bias + c);
    }
}

#endif  // EPSILON
