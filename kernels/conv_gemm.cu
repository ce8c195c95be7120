// conv_gemm: 2-D convolution (ONNX Conv, any group count G) as a tiled matrix
// product, per group g:
//
//   Y_g[MG x cols] = W_g[MG x KDIM] * X_g[KDIM x cols]   (+ bias per row)
//
// W_g is the filters of group g exactly as ONNX stores them ([M][C/G][KH][KW]
// flattened, read from global memory at call time); X_g is the unrolled input
// (row k = (c * KH + kh) * KW + kw, column = n * OH * OW + oh * OW + ow); Y_g's
// column is scattered back to NCHW order when it is stored. Two entry points
// share the tile code and differ only in where a tile of X_g comes from:
//
//   conv_gemm           reads X_g from the matrix conv_im2col.cu wrote to global
//                       memory (the im2col_gemm family; one chunk of images);
//   conv_implicit_gemm  gathers each element of X_g from the input image while
//                       loading the tile (the implicit_gemm family): no unrolled
//                       matrix in memory, so none of its KH*KW-fold traffic.
//
// Why it should be faster than a direct convolution: a block keeps a BK x BM
// tile of filters and a BK x BN tile of X_g in shared memory and each of its
// NT threads computes TM x TN outputs, so a value read from shared memory
// feeds TN (filter) or TM (input) multiply-adds, and a value read from global
// memory feeds BM or BN. The next tiles' global loads are issued into registers
// before the current tile's multiply-adds, so their latency is hidden.
// A thread's outputs are strided (rows ty + i*BM/TM, columns tx + j*BN/TN):
// the lanes of a warp read neighbouring shared-memory words (no bank
// conflicts) and store neighbouring output pixels (coalesced).
//
// Tile macros: BM x BN outputs per block, BK the K step, TM x TN per thread
// (NT = BM/TM * BN/TN threads); plus the shape macros (C, M, G, H, W, KH, KW,
// SH, SW, PH, PW, DH, DW, OH, OW, PADDED, HAS_BIAS). The tail of the last K
// step and the columns past the end are loaded as zeros.
// __launch_bounds__(NT, 2): at most 128 registers a thread, so two blocks share
// an SM (the host keeps BK x BN / NT, the prefetched values, small enough).
// Launch: block (NT), grid (ceil(cols / BN), ceil(MG / BM), G), where cols =
// images * OH * OW and `images` (the only run-time argument) the images covered.

#define CG (C / G)              // input channels per group
#define MG (M / G)              // output maps per group
#define KDIM (CG * KH * KW)     // the K of the product
#define P (OH * OW)             // output pixels of one image
#define NT ((BM / TM) * (BN / TN))

// Loading a BK x BN tile of X_g: a thread loads B_SLOTS columns (NT apart) in
// B_ROWS rows (B_ROW_STEP apart); its columns are the same for every K step.
#define B_SLOTS (BN >= NT ? BN / NT : 1)
#define B_ROW_STEP (NT > BN ? NT / BN : 1)
#define B_ROWS ((BK + B_ROW_STEP - 1) / B_ROW_STEP)
#define A_SLOTS ((BM * BK + NT - 1) / NT)  // filter values a thread loads per K step

// X_g from the unrolled matrix in global memory: row k of group g at row g*KDIM + k.
struct UnrolledColumns {
    const float* rows;  // row 0 of X_g
    int cols;
    int col[B_SLOTS];

    __device__ __forceinline__ UnrolledColumns(const float* unrolled, int cols_, int first_col)
        : rows(unrolled + (size_t)blockIdx.z * KDIM * cols_), cols(cols_)
    {
#pragma unroll
        for (int j = 0; j < B_SLOTS; ++j) col[j] = first_col + j * NT;
    }

    __device__ __forceinline__ float load(int k, int j) const
    {
        return (k < KDIM && col[j] < cols) ? __ldg(rows + (size_t)k * cols + col[j]) : 0.0f;
    }
};

// X_g gathered from the input: a column's image and window origin are worked out
// once; each element costs the (compile-time constant) split of k into c, kh, kw.
struct ImageColumns {
    const float* image[B_SLOTS];  // channel 0 of group g in the column's image
    int ih0[B_SLOTS];
    int iw0[B_SLOTS];
    bool valid[B_SLOTS];

    __device__ __forceinline__ ImageColumns(const float* x, int cols, int first_col)
    {
#pragma unroll
        for (int j = 0; j < B_SLOTS; ++j) {
            const int col = first_col + j * NT;
            valid[j] = col < cols;
            const int n = valid[j] ? col / P : 0;
            const int p = valid[j] ? col - n * P : 0;
            image[j] = x + ((size_t)n * C + blockIdx.z * CG) * (H * W);
            ih0[j] = (p / OW) * SH - PH;
            iw0[j] = (p % OW) * SW - PW;
        }
    }

    __device__ __forceinline__ float load(int k, int j) const
    {
        if (k >= KDIM || !valid[j]) return 0.0f;
        const int c = k / (KH * KW);
        const int kh = (k / KW) % KH;
        const int kw = k % KW;
        const int ih = ih0[j] + kh * DH;
        const int iw = iw0[j] + kw * DW;
#if PADDED
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) return 0.0f;
#endif
        return __ldg(image[j] + (c * H + ih) * W + iw);
    }
};

template <class Columns>
__device__ __forceinline__ void gemm_tile(const float* __restrict__ w, const float* __restrict__ b,
                                          float* __restrict__ y, int cols, const Columns columns)
{
    __shared__ float a_tile[BK][BM];  // filters, transposed: a_tile[k][m]
    __shared__ float b_tile[BK][BN];

    const int tid = threadIdx.x;
    const int g = blockIdx.z;
    const int m0 = blockIdx.y * BM;  // first map of the tile within group g
    const float* filters = w + (size_t)g * MG * KDIM;
    const int b_row0 = tid / BN;     // 0 when BN >= NT
    const int b_col = tid % BN;

    float a_next[A_SLOTS];
    float b_next[B_ROWS][B_SLOTS];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int s = 0; s < A_SLOTS; ++s) {
            const int e = tid + s * NT;  // maps fastest: shared-memory stores without conflicts
            const int m = m0 + e % BM;
            const int k = k0 + e / BM;
            a_next[s] = (e < BM * BK && m < MG && k < KDIM) ? __ldg(filters + m * KDIM + k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int row = b_row0 + r * B_ROW_STEP;
#pragma unroll
            for (int j = 0; j < B_SLOTS; ++j) b_next[r][j] = row < BK ? columns.load(k0 + row, j) : 0.0f;
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int s = 0; s < A_SLOTS; ++s) {
            const int e = tid + s * NT;
            if (e < BM * BK) a_tile[e / BM][e % BM] = a_next[s];
        }
#pragma unroll
        for (int r = 0; r < B_ROWS; ++r) {
            const int row = b_row0 + r * B_ROW_STEP;
#pragma unroll
            for (int j = 0; j < B_SLOTS; ++j)
                if (row < BK) b_tile[row][b_col + j * NT] = b_next[r][j];
        }
    };

    const int tx = tid % (BN / TN);
    const int ty = tid / (BN / TN);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    fetch(0);
    for (int k0 = 0; k0 < KDIM; k0 += BK) {
        store();
        __syncthreads();
        if (k0 + BK < KDIM) fetch(k0 + BK);  // in flight while this tile is multiplied
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[TM], v[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = a_tile[k][ty + i * (BM / TM)];
#pragma unroll
            for (int j = 0; j < TN; ++j) v[j] = b_tile[k][tx + j * (BN / TN)];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const int col = blockIdx.x * BN + tx + j * (BN / TN);
        if (col >= cols) continue;
        const int n = col / P;
        float* out = y + (size_t)n * M * P + (size_t)(g * MG) * P + (col - n * P);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + ty + i * (BM / TM);
            if (m >= MG) continue;
#if HAS_BIAS
            out[(size_t)m * P] = acc[i][j] + __ldg(b + g * MG + m);
#else
            out[(size_t)m * P] = acc[i][j];
#endif
        }
    }
}

// im2col_gemm's product for one chunk: `unrolled` from conv_im2col, `y` the chunk's first output.
extern "C" __global__ void __launch_bounds__(NT, 2)
conv_gemm(const float* __restrict__ w, const float* __restrict__ b, const float* __restrict__ unrolled,
          float* __restrict__ y, int images)
{
    const int cols = images * P;
    gemm_tile(w, b, y, cols, UnrolledColumns(unrolled, cols, blockIdx.x * BN + threadIdx.x % BN));
}

// implicit_gemm: the same product with X_g gathered from x on the fly.
extern "C" __global__ void __launch_bounds__(NT, 2)
conv_implicit_gemm(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                   float* __restrict__ y, int batch)
{
    const int cols = batch * P;
    gemm_tile(w, b, y, cols, ImageColumns(x, cols, blockIdx.x * BN + threadIdx.x % BN));
}
