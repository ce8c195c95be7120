// gemm_wgmma: Y = epilogue(A W^T) in 3xTF32 on Hopper's asynchronous warpgroup MMA (sm_90a alone;
// gemm_tc is the path elsewhere and for grids too small to fill the GPU). A is batch x K and W is
// N x K, both K-contiguous, FP32 in and out.
//
// Why: gemm_tc's warps load and split their own fragments from shared memory, so the 3xTF32 loop is
// bound by its instruction mix; here wgmma reads both operands from shared memory through
// descriptors, producer warpgroups do the copies, and consumer warpgroups only issue MMAs
// (wgmma_3xtf32.cuh: the pipeline, the arithmetic, the swizzle, the accumulators' layout).
//
// A block computes BM rows x BN columns of Y: the rows are the data rows (64 a consumer warpgroup),
// the columns the weight rows (one wgmma's N: 64 or 128). The operands arrive with their small parts
// beside them: W's (and W padded with zero rows to a multiple of BN and zero columns to KP, a multiple
// of BK) made once at build, A's by gemm_small_parts before each call. A's rows past the batch and k
// past K are copied as zeros, so K must be a multiple of 4 (16-byte copies of whole quads).
//
// The epilogue (gemm_epilogue.cuh: alpha, C, the activation, with RESIDUAL a tensor of Y's shape added
// last; null otherwise) runs on the accumulators; a lane's two neighbouring columns are stored as one
// float2 when N is even (store_pair). A column bias is read into registers before the products.
//
// A K split (SPLITS > 1) is for grids too small to fill the GPU (a transformer's projections at batch
// 1: 197 rows): block z of the grid's third axis walks the z-th run of K's slices and stores its raw
// sums to partial[z] (batch x N); gemm_split_reduce then adds the runs in order (the same sum on
// every run) and applies the epilogue.
//
// With HALF_OPERANDS (1 FP16, 2 BF16: wg_fp16, wg_bf16; opt-in, not FP32-exact) A and W arrive in that format,
// without small parts (the a_small and w_small arguments are null): W converted once at build, A by
// gemm_to_half (or the row prologue) before each call; BK is 64 and K a multiple of 8 (16-byte quads of eight values).
//
// Macros: N, K, KP, BM (a multiple of 64), BN (64 or 128), BK (32; 64 with HALF_OPERANDS), STAGES, SPLITS,
// HALF_OPERANDS and the epilogue's.
// Launch gemm_small_parts (block 256, any grid) over A first, then gemm_wgmma: block (4 * BM),
// grid (ceil(N / BN), ceil(batch / BM), SPLITS) with a K split, else any number of blocks along x (a block
// an SM: each takes every gridDim.x-th tile, columns first), dynamic shared memory (STAGES * 2 * (BM + BN) * BK
// * 4 + STAGES * 16 + 1024) bytes, y the partial sums when SPLITS > 1; then gemm_split_reduce
// (block 256, one thread per pair of neighbouring outputs). nonfinite: a byte raised where an output
// is NaN or Inf (null: the step is not watched; see watch_flag.cuh).
#include "gemm_epilogue.cuh"

#define W_ROWS BN  // Y's columns: wgmma's N
#define X_ROWS BM  // Y's rows: 64 a consumer warpgroup
#include "wgmma_3xtf32.cuh"
#include "grid_dependency.cuh"

#ifndef SPLITS
#define SPLITS 1
#endif
#define SLICES (KP / BK)
#define SLICES_PER_SPLIT ((SLICES + SPLITS - 1) / SPLITS)

static_assert(K % QUAD_VALUES == 0, "A's rows copied in 16-byte quads");
static_assert(KP % BK == 0 && KP >= K, "W's columns padded to whole slices");
static_assert((SPLITS - 1) * SLICES_PER_SPLIT < SLICES, "every run of the K split has a slice");

#ifdef HALF_OPERANDS
#include "half_bits.cuh"

// half[i] = a[i] in the format, for `count` values (a multiple of 4: K is)
AWAITS_PREVIOUS_GRID(gemm_to_half)
extern "C" __global__ void __launch_bounds__(256)
gemm_to_half(const float4* __restrict__ a, ushort4* __restrict__ half, size_t count)
{
    await_previous_grid();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count / 4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldg(a + i);
        half[i] = make_ushort4(half_bits<HALF_OPERANDS>(v.x), half_bits<HALF_OPERANDS>(v.y), half_bits<HALF_OPERANDS>(v.z),
                               half_bits<HALF_OPERANDS>(v.w));
    }
}
#else
// small[i] = small_part(a[i]) for `count` values (a multiple of 4: K is)
AWAITS_PREVIOUS_GRID(gemm_small_parts)
extern "C" __global__ void __launch_bounds__(256)
gemm_small_parts(const float4* __restrict__ a, float4* __restrict__ small, size_t count)
{
    await_previous_grid();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count / 4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldg(a + i);
        small[i] = make_float4(small_part(v.x), small_part(v.y), small_part(v.z), small_part(v.w));
    }
}
#endif

// A slice's copies for produce_slices: eight consecutive threads on a row's eight quads (one 128-byte
// line read, all 32 banks written), rows NTHREADS / 8 apart; the weight rows, then the data rows.
struct SliceCopies {
    static constexpr int ROW_STEP = NTHREADS / QUADS;
    const operand_t* __restrict__ a;
    const operand_t* __restrict__ a_small;  // null with HALF_OPERANDS
    const operand_t* __restrict__ w;
    const operand_t* __restrict__ w_small;
    int m0, n0, batch, first_slice;

    __device__ __forceinline__ void copy(operand_t* stage, int j) const
    {
        static_assert(BM % ROW_STEP == 0 && BN % ROW_STEP == 0, "whole turns of rows");
        const int column = threadIdx.x % QUADS * QUAD_VALUES, first_row = threadIdx.x / QUADS;
        const int k = (first_slice + j) * BK + column;
#pragma unroll
        for (int row = first_row; row < BN; row += ROW_STEP) {
            const size_t from = (size_t)(n0 + row) * KP + k;
            const int to = SWIZZLED_AT(row, column);
            copy_quad(stage + to, w + from, true);
            if (PARTS > 1) copy_quad(stage + A_STAGE + to, w_small + from, true);
        }
#pragma unroll
        for (int row = first_row; row < BM; row += ROW_STEP) {
            const bool valid = m0 + row < batch && k < K;
            const size_t from = valid ? (size_t)(m0 + row) * K + k : 0;
            const int to = SWIZZLED_AT(row, column);
            copy_quad(stage + PARTS * A_STAGE + to, a + from, valid);
            if (PARTS > 1) copy_quad(stage + PARTS * A_STAGE + B_STAGE + to, a_small + from, valid);
        }
    }
};

AWAITS_PREVIOUS_GRID(gemm_wgmma)
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, 1)
gemm_wgmma(const operand_t* __restrict__ a, const operand_t* __restrict__ a_small, const operand_t* __restrict__ w,
           const operand_t* __restrict__ w_small, const float* __restrict__ bias, const float* __restrict__ residual, float* __restrict__ y,
           int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    extern __shared__ float4 shared_tiles[];
    // the tiles of Y, columns first; a block takes every (gridDim.x * gridDim.y)-th, from its own: one with the
    // K split's grid, several where the grid is one block an SM (persistent)
    constexpr int COLUMN_TILES = (N + BN - 1) / BN;
    const int tiles = COLUMN_TILES * ((batch + BM - 1) / BM), tile_step = gridDim.x * gridDim.y;
    const int first_tile = blockIdx.y * gridDim.x + blockIdx.x;
    const int first_slice = blockIdx.z * SLICES_PER_SPLIT;
    const int slices = min(SLICES_PER_SPLIT, SLICES - first_slice);
    unsigned long long *full, *empty;
    operand_t* stages = stage_memory(shared_tiles, full, empty);

    if (threadIdx.x < NTHREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS));
        // the producers run ahead into the next tile while the consumers finish this one's epilogue
        for (int tile = first_tile, before = 0; tile < tiles; tile += tile_step, before += slices) {
            const SliceCopies copies{a, a_small, w, w_small, tile / COLUMN_TILES * BM, tile % COLUMN_TILES * BN, batch, first_slice};
            produce_slices(copies, slices, stages, full, empty, before);
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS));
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = (threadIdx.x - NTHREADS) / 32 * 16;  // this warp's 16 rows of the tile
#if SPLITS > 1
    y += (size_t)blockIdx.z * batch * N;  // this run's partial sums
#endif
    for (int tile = first_tile, before = 0; tile < tiles; tile += tile_step, before += slices) {
        const int m0 = tile / COLUMN_TILES * BM, n0 = tile % COLUMN_TILES * BN;
#if BIAS == 1 && SPLITS == 1
        // this lane's bias columns, read before the products so that their latency hides behind them (read in
        // the epilogue, they were the kernel's longest wait: ncu's stall samples at ViT-S's QKV shape in FP16)
        float2 column_bias[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int n = n0 + 8 * j + 2 * t;
            column_bias[j] = make_float2(n < N ? bias[n] : 0.0f, n + 1 < N ? bias[n + 1] : 0.0f);
        }
#endif
        float acc[ACC];
        consume_slices(acc, slices, stages, full, empty, before);
#pragma unroll
        for (int upper = 0; upper < 2; ++upper) {
            const int m = m0 + row0 + g + 8 * upper;
            if (m >= batch) continue;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int n = n0 + 8 * j + 2 * t;
                const float sum0 = acc[4 * j + 2 * upper], sum1 = acc[4 * j + 2 * upper + 1];
#if SPLITS > 1
                store_sum_pair(y, m, n, sum0, sum1);
#elif BIAS == 1
                if (n < N) store_pair(y, nonfinite, m, n, gemm_finish(sum0, column_bias[j].x), gemm_finish(sum1, column_bias[j].y), residual);
#else
                store_output_pair(y, bias, nonfinite, m, n, sum0, sum1, residual);
#endif
            }
        }
    }
}

// y = epilogue(the K split's partial sums added in order), a thread per pair of neighbouring outputs
AWAITS_PREVIOUS_GRID(gemm_split_reduce)
extern "C" __global__ void __launch_bounds__(256)
gemm_split_reduce(const float* __restrict__ partial, const float* __restrict__ bias, const float* __restrict__ residual,
                  float* __restrict__ y, int batch, unsigned char* nonfinite)
{
    await_previous_grid();
    constexpr int PAIRS = (N + 1) / 2;
    const size_t pair = blockIdx.x * (size_t)blockDim.x + threadIdx.x, outputs = (size_t)batch * N;
    if (pair >= (size_t)batch * PAIRS) return;
    const int m = (int)(pair / PAIRS), n = (int)(pair % PAIRS) * 2;
    const float* at = partial + (size_t)m * N + n;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int z = 0; z < SPLITS; ++z, at += outputs) {
        sum0 += at[0];
        if (n + 1 < N) sum1 += at[1];
    }
    store_output_pair(y, bias, nonfinite, m, n, sum0, sum1, residual);
}
