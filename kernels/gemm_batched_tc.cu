// matmul_batched_tc: MatMul of any rank as gemm_batched.cu computes it (C[j] = A[j] (M x K) x
// B[j] (K x N) for each output matrix j, all row-major, the leading axes broadcast as numpy does,
// an activation fused), on the tensor cores in 3xTF32: an error of FP32's order against float64
// (tf32_mma.cuh), at several times the rate of FP32 FMAs. Attention's two products run here: the
// scores Q K^T and their weighted sum of V.
//
// A block computes a 64 x 64 tile of C[j] with 8 warps of 32 x 16; STAGES slices of 32 k of both
// operands are in flight through cp.async (16-byte copies where a row's length is a multiple of 4,
// else 4-byte ones; past M, N or K they write zeros). A's tile is stored [m][k], B's [k][n] as B
// lies, rows padded by 4 and 8 floats so that a warp's fragment loads hit 32 banks.
//
// Macros: the shapes as gemm_batched.cu's (M, N, K, BATCH_RANK, OUT_DIM<i>, A_STRIDE<i>, B_STRIDE<i>),
// STAGES and the activation. Launch: block 256, grid (ceil(N / 64), ceil(M / 64), matrices),
// dynamic shared memory STAGES * (64 * 36 + 32 * 72) * 4 bytes. nonfinite: a byte raised where an
// output is NaN or Inf (null: not watched): 3xTF32 turns an infinite operand into NaN, so the
// runner watches this kernel and reruns such chunks on gemm_batched.cu.
#include "activation.cuh"
#include "watch_flag.cuh"
#include "matmul_batch_axes.cuh"

#define BM 64
#define BN 64
#define BK 32
#define WM 32
#define WN 16
#define SPLIT 1
#define WARPS_N (BN / WN)
#define NTHREADS ((BM / WM) * WARPS_N * 32)
#define A_STRIDE (BK + 4)
#define B_STRIDE (BN + 8)
#define A_STAGE (BM * A_STRIDE)
#define B_STAGE (BK * B_STRIDE)
#define KTILES ((K + BK - 1) / BK)
#define B_K_STEP B_STRIDE  // B's tile as B lies, [k][n]
#define B_N_STEP 1
#include "tf32_mma.cuh"

static_assert(NTHREADS == 256, "the launch's block");
static_assert(STAGES >= 2, "a slice in flight while one is multiplied");

// the ROWS x COLS tile at (row0, col0) of a row-major matrix `length` floats a row into shared memory
// `stride` floats a row, zero past `rows` and `cols`: 16-byte copies where VEC (`length` a multiple of 4)
template <int ROWS, int COLS, bool VEC>
__device__ __forceinline__ void copy_tile(float* tile, int stride, const float* __restrict__ from, int length, int row0, int rows,
                                          int col0, int cols)
{
    if (VEC) {
#pragma unroll
        for (int i = threadIdx.x; i < ROWS * COLS / 4; i += NTHREADS) {
            const int r = i / (COLS / 4), col = col0 + i % (COLS / 4) * 4;
            const bool valid = row0 + r < rows && col < cols;
            copy_async16(tile + r * stride + (col - col0), valid ? from + (long long)(row0 + r) * length + col : from, valid);
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < ROWS * COLS; i += NTHREADS) {
            const int r = i / COLS, col = col0 + i % COLS;
            const bool valid = row0 + r < rows && col < cols;
            copy_async4(tile + r * stride + (col - col0), valid ? from + (long long)(row0 + r) * length + col : from, valid);
        }
    }
}

// slice k0 of A[j]'s rows [m0, m0 + BM) and B[j]'s columns [n0, n0 + BN) into shared memory
__device__ __forceinline__ void copy_slice(float* As, float* Bs, const float* __restrict__ a, const float* __restrict__ b,
                                           int m0, int n0, int k0)
{
    copy_tile<BM, BK, K % 4 == 0>(As, A_STRIDE, a, K, m0, M, k0, K);
    copy_tile<BK, BN, N % 4 == 0>(Bs, B_STRIDE, b, N, k0, K, n0, N);
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
matmul_batched_tc(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int first,
                  unsigned char* nonfinite)
{
    extern __shared__ float4 shared_tiles[];
    float* As = reinterpret_cast<float*>(shared_tiles);
    float* Bs = As + STAGES * A_STAGE;
    locate_matrix(first, a, b, c);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int warp = threadIdx.x / 32;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;

    float acc[MT][NT][4];
    const auto copy = [&](float* as, float* bs, int k0) { copy_slice(as, bs, a, b, m0, n0, k0); };
    pipelined_product(acc, As, Bs, B_STAGE, KTILES, copy, warp_m, warp_n);

    for_each_output_pair(acc, m0, n0, warp_m, warp_n, M, [&](int m, int n, float first, float second) {
        const float pair[2] = {first, second};
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            if (n + q < N) {
                const float out = opplugin_activation(pair[q]);
                c[(long long)m * N + n + q] = out;
                flag_nonfinite(nonfinite, out);
            }
        }
    });
}
