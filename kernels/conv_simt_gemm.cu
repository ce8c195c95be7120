// conv_simt_gemm: 2-D convolution (ONNX Conv, any group count) as an implicit GEMM on the
// FP32 FMA pipe, with the tiles streamed through a multi-stage shared-memory
// pipeline by cp.async. FP32-exact by construction: every output is a chain of
// plain FP32 fused multiply-adds, as cuDNN's FP32 mode computes it. The weights are
// read from global memory at call time, so no layer is too big for it.
//
// The product: Y[m][col] = sum_k W[m][k] * X[k][col], m an output map, col an
// output pixel of the batch (n, oh, ow), k = (c, kh, kw) over KDIM = C/G*KH*KW, the
// channels of m's group: one GEMM per group, a block's map tile inside one (MapTile).
// X is never built: each B-tile element is copied straight from the image
// (copy_b_slice in conv_implicit_tiles.cuh).
//
// What makes it fast:
// - A block computes a BM x BN tile of Y, each thread a TM x TN micro-tile of it in
//   registers (8x8: 64 accumulators). Per k a thread reads TM + TN operands from
//   shared memory and issues TM * TN FMAs, so the FMA pipe, not shared memory,
//   sets the pace. A thread's rows are ty + i * THREADS_M and its columns
//   q * GROUP_SPAN + 4 * tx + j (4-column groups).
// - The inner loop reads shared memory 16 bytes at a time (LDS.128): A as float4
//   along k from its [m][k] rows (one load serves 4 k steps), B as float4 along the
//   pixels of one k row.
// - The K loop walks BK-deep slices. STAGES slices are in flight at once:
//   cp.async copies slice i + STAGES - 1 from global to shared memory while the
//   threads multiply slice i, so load latency hides behind the FMAs, and the copies
//   bypass the registers. Weight rows are copied 16 bytes at a time when KDIM is a
//   multiple of 4 (A_VEC 4); a 1x1 stride-1 unpadded conv copies four neighbouring
//   pixels of a channel at once (B_VEC 4).
// - Each im2col index comes from compile-time shape constants: the (c, kh, kw)
//   split of a k is a lookup in the __constant__ table `taps`, the same k for the
//   whole warp (a broadcast), and a thread's columns are worked out once.
// - Bank conflicts: a warp reads A rows of 2 or 4 consecutive ty (THREADS_N is 16
//   or 8); rows A_STRIDE = BK + 4 floats apart start 20 banks on from each other,
//   so their float4s (at banks 0, 20, 8, 28 + 0..3) never share a bank, and the
//   lanes of one ty read one address (a broadcast). B lanes of one k row read
//   consecutive float4s (8 lanes: 128 bytes, every bank once), so B needs no pad;
//   its copies write consecutive words of a row, also conflict-free.
// - Layers whose output is too small to fill the GPU (512->512 at 7x7, batch 1)
//   split K over KSLICES blocks (grid z); conv_k_slices_reduce then adds the
//   slices in a fixed order, with the epilogue: the same result on every run.
// - The epilogue (conv_epilogue.cuh): bias, the residual operand r, then
//   ACTIVATION; no pool. Lanes of a warp store consecutive 4-pixel groups of a
//   map row: float4 stores when OUT_VEC (OH*OW % 4 == 0, so a group never
//   straddles two images and starts 16-byte aligned), else scalar ones.
// What limits it (ncu on an H100, VGG 512->512 3x3 at 14x14, batch 32, 128x64 tiles): the FMA
// pipe is 56% busy and the issue slots 73%; the rest of the instructions are the copies' address
// work and the shared-memory reads. 167 registers leave 3 blocks (12 warps) an SM; capping them
// at 128 for 4 blocks, or BK = 32, ran slower (less ILP per warp), so the tiles keep these.
//
// Macros: the shape macros (C, M, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW,
// HAS_BIAS, RESIDUAL, ACTIVATION, PROLOGUE, PROLOGUE_ACTIVATION) plus BM, BN, BK, TM, TN, STAGES, KSLICES, A_VEC,
// B_VEC, OUT_VEC, TAP_MASK, KPAD (rows of `taps`, at least KDIM rounded up to BK)
// and MIN_BLOCKS.
// Launch: block (NTHREADS = BM/TM * BN/TN), grid (ceil(batch*OH*OW / BN),
// G * ceil(M/G / BM), KSLICES), dynamic shared memory STAGES * (BM*(BK+4) + BK*BN) * 4
// bytes. With KSLICES > 1 the partial sums go to `partial` ([KSLICES][M][batch*OH*OW])
// and conv_k_slices_reduce (one thread per output) writes y. r is the residual
// operand ([batch][M][OH][OW]; null without RESIDUAL), pro the prologue's (s [batch][C], or a [C]
// then b [C]; null without PROLOGUE), x_image the floats between X's images (C*H*W unless X is a view).
// nonfinite: the step's NaN/Inf flag, as conv_tc_gemm's.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the pipelined SIMT implicit GEMM needs sm_80 or newer (cp.async)"
#endif

#include "conv_epilogue.cuh"

#define KTILES ((KDIM + BK - 1) / BK)
#define THREADS_M (BM / TM)
#define THREADS_N (BN / TN)
#define NTHREADS (THREADS_M * THREADS_N)
#define COL_GROUPS (TN / 4)           // 4-column groups per thread
#define GROUP_SPAN (BN / COL_GROUPS)  // columns between a thread's groups
#define A_STRIDE (BK + 4)
#define B_STRIDE BN
#define A_STAGE (BM * A_STRIDE)
#define B_STAGE (BK * B_STRIDE)

#include "conv_implicit_tiles.cuh"

static_assert(TN % 4 == 0 && THREADS_N >= 8, "a thread's columns are float4 groups; 8 lanes of a k row cover 128 bytes");
static_assert(NTHREADS >= BN / B_VEC && BK % (NTHREADS / (BN / B_VEC)) == 0, "copy_b_slice: whole B rows per pass");

__device__ __forceinline__ float lane_of(const float4& v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a constant after unrolling
}

// acc += this thread's TM x TN part of As x Bs for one BK slice
__device__ __forceinline__ void multiply_slice(float (&acc)[TM][TN], const float* As, const float* Bs, int tx, int ty)
{
#pragma unroll
    for (int k4 = 0; k4 < BK; k4 += 4) {
        float4 a[TM];  // 4 k steps of each of the thread's rows
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = *reinterpret_cast<const float4*>(As + (ty + i * THREADS_M) * A_STRIDE + k4);
#pragma unroll
        for (int step = 0; step < 4; ++step) {
            float4 b[COL_GROUPS];
#pragma unroll
            for (int q = 0; q < COL_GROUPS; ++q)
                b[q] = *reinterpret_cast<const float4*>(Bs + (k4 + step) * B_STRIDE + q * GROUP_SPAN + 4 * tx);
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const float ai = lane_of(a[i], step);
#pragma unroll
                for (int q = 0; q < COL_GROUPS; ++q) {
                    acc[i][4 * q + 0] = fmaf(ai, b[q].x, acc[i][4 * q + 0]);
                    acc[i][4 * q + 1] = fmaf(ai, b[q].y, acc[i][4 * q + 1]);
                    acc[i][4 * q + 2] = fmaf(ai, b[q].z, acc[i][4 * q + 2]);
                    acc[i][4 * q + 3] = fmaf(ai, b[q].w, acc[i][4 * q + 3]);
                }
            }
        }
    }
}

// Writes 4 sums of map m at columns col.. (bias, residual and activation unless K is split), flagging
// outputs that are NaN or Inf in nonfinite (null: not watched; as conv_tc_gemm's, see flag_nonfinite).
__device__ __forceinline__ void store_group(float4 sums, int m, int col, int total, const float* __restrict__ b,
                                            const float* __restrict__ r, float* __restrict__ y, float* __restrict__ partial,
                                            unsigned char* nonfinite)
{
#if KSLICES == 1
#if HAS_BIAS
    const float bias = b[m];
#else
    const float bias = 0.0f;
#endif
#if OUT_VEC
    if (col >= total) return;  // P % 4 == 0: the group is wholly inside or wholly past the batch
    const size_t at = (size_t)(col / P) * (M * P) + (size_t)m * P + col % P;
    const float4 res = residual4_at(r, at);
    const float4 v = make_float4(finish_output(sums.x + bias, res.x), finish_output(sums.y + bias, res.y),
                                 finish_output(sums.z + bias, res.z), finish_output(sums.w + bias, res.w));
    *reinterpret_cast<float4*>(y + at) = v;
    flag_nonfinite4(nonfinite, v);
#else
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (col + j >= total) return;
        const size_t at = (size_t)((col + j) / P) * (M * P) + (size_t)m * P + (col + j) % P;
        const float out = finish_output(lane_of(sums, j) + bias, residual_at(r, at));
        y[at] = out;
        flag_nonfinite(nonfinite, out);
    }
#endif
#else
    float* out = partial + ((size_t)blockIdx.z * M + m) * total + col;
#if OUT_VEC
    if (col < total) *reinterpret_cast<float4*>(out) = sums;
#else
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (col + j < total) out[j] = lane_of(sums, j);
#endif
#endif
}

extern "C" __global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS)
conv_simt_gemm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, const float* __restrict__ r,
               const float* __restrict__ pro, float* __restrict__ y, float* __restrict__ partial, int batch, int x_image,
               unsigned char* nonfinite)
{
    const int tx = threadIdx.x % THREADS_N;
    const int ty = threadIdx.x / THREADS_N;
    const MapTile maps;
    const int m0 = maps.first;
    const int col0 = blockIdx.x * BN;
    const int total = batch * P;
    const Columns cols(col0, total, maps.group, x_image);
    const SliceRun run;  // this block's share of K

    extern __shared__ float4 shared_tiles[];  // STAGES A slices, then STAGES B slices
    float* const As = reinterpret_cast<float*>(shared_tiles);
    float* const Bs = As + STAGES * A_STAGE;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // slice s lives in stage s % STAGES; STAGES - 1 slices are requested before the first multiply
    for (int s = 0; s < STAGES - 1 + run.count; ++s) {
        if (s >= STAGES - 1) {
            wait_copies<STAGES - 2>();  // slice s - STAGES + 1 has landed (this thread's copies)
            prologue_b_slice(Bs + (s - STAGES + 1) % STAGES * B_STAGE, pro, cols, (run.first + s - STAGES + 1) * BK);
            __syncthreads();            // ... and everyone's; the stage copied below is no longer read
        }
        if (s < run.count) {
            const int stage = s % STAGES;
            copy_weights(As + stage * A_STAGE, w, maps, (run.first + s) * BK);
            copy_b_slice(Bs + stage * B_STAGE, x, cols, (run.first + s) * BK);
        }
        commit_copies();  // an empty group keeps the count of groups in step
        if (s >= STAGES - 1) {
            const int stage = (s - STAGES + 1) % STAGES;
            multiply_slice(acc, As + stage * A_STAGE, Bs + stage * B_STAGE, tx, ty);
        }
    }
    wait_copies<0>();

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty + i * THREADS_M;
        if (m >= maps.end) continue;
#pragma unroll
        for (int q = 0; q < COL_GROUPS; ++q) {
            const float4 sums = make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]);
            store_group(sums, m, col0 + q * GROUP_SPAN + 4 * tx, total, b, r, y, partial, nonfinite);
        }
    }
}
