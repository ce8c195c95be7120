// conv_tf32 / conv_3xtf32: 2-D convolution (ONNX Conv, group 1) as an implicit
// GEMM on the tensor cores, FP32 in and out. Opt-in only: NOT FP32-exact.
//
// What: the conv is the product Y[m][p] = sum_k Wt[m][k] * X[k][p] with
// M = output maps, p = output pixel over the whole batch (n, oh, ow) and
// k = (c, kh, kw) over K = C*KH*KW. X is never built: each lane gathers the input
// value of its fragment element straight from the image (implicit im2col).
// One warp computes MTILES x NT tiles of 16 maps x 8 pixels with
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (sm_80+): maps are padded
// to MTILES*16 and K to KSTEPS*8 with zero weights. Fragment layout of
// m16n8k8 (lane = 4*g + t): A (16x8 weights) a0 = [g][t], a1 = [g+8][t],
// a2 = [g][t+4], a3 = [g+8][t+4]; B (8x8 inputs) b0 = [t][g], b1 = [t+4][g];
// C (16x8) c0,c1 = [g][2t], [g][2t+1], c2,c3 = [g+8][2t], [g+8][2t+1].
// At block start the block converts the weights (read at call time, [M][K]) to
// TF32 and stores them in shared memory already in A-fragment order, so a warp
// loads each A fragment with one 16-byte shared load. The warps then walk the
// pixel tiles of the batch in a grid-stride loop.
//
// SPLIT 0 (conv_tf32): each operand rounded once with cvt.rna.tf32.f32 (10-bit
// mantissa, unit roundoff 2^-11): relative L2 error ~3e-4 on standard-normal
// data (measured 2.8e-4 to 2.9e-4 on the shipped convs, as cuDNN's TF32 mode),
// i.e. of the order of 1e-3 at worst.
// SPLIT 1 (conv_3xtf32): each operand a = big + small with big = tf32(a) and
// small = tf32(a - big); big*big + big*small + small*big (three MMAs, the small
// terms first) leaves out only small*small (~2^-22 relative) and the TF32
// rounding of small: close to FP32 accuracy (measured relative L2 2.4e-7 to
// 1.4e-6, growing with K), at three times the tensor work.
//
// Why faster: an m16n8k8 MMA performs 1024 multiply-adds per warp instruction,
// so arithmetic stops being a limit; the cost left is the gather of the input
// (two loads and one or two conversions per lane, tile and k-step), shared by
// all MTILES map tiles of the warp.
//
// Macros: the shared shape macros (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW,
// OH, OW, PADDED, HAS_BIAS, BLOCK) plus NT (8-pixel tiles per warp and
// iteration), SPLIT (0 or 1), UNROLL_K (unroll count of the k-step loop) and
// MIN_BLOCKS (resident blocks per SM asked of ptxas: it bounds the registers).
// Arguments: x [N][C][H][W], w [M][C][KH][KW], b [M] (null without a bias), y, batch.
//
// Launch: block (BLOCK), grid (min(ceil(ceil(batch*OH*OW / 8) / NT / WARPS), 8 blocks
// per SM), 1); static shared memory MTILES*KSTEPS*32*16 bytes (x2 for SPLIT).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the TF32 tensor-core variants need sm_80 or newer"
#endif

#define KDIM (C * KH * KW)          // the GEMM's K (group 1)
#define KSTEPS ((KDIM + 7) / 8)     // k-steps of 8
#define MTILES ((M + 15) / 16)      // 16-map tiles
#define PIXELS (OH * OW)
#define WARPS (BLOCK / 32)
#define A_FRAGMENTS (MTILES * KSTEPS * 32)  // one uint4 per lane, k-step and map tile

#if SPLIT
#define CONV_MMA conv_3xtf32
#else
#define CONV_MMA conv_tf32
#endif

__device__ __forceinline__ unsigned int to_tf32(float v)
{
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// d += a * b on one 16x8x8 tile
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint4& a, unsigned int b0, unsigned int b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float weight_at(const float* __restrict__ w, int row, int col)
{
    return (row < M && col < KDIM) ? w[row * KDIM + col] : 0.0f;  // zero padding
}

// One lane's input value for GEMM row k of the pixel whose window starts at
// image + origin (row ih0, column iw0); 0 for padded k and outside the image.
struct Tap {
    int offset;  // c*H*W + kh*DH*W + kw*DW
    int dh, dw;  // kh*DH, kw*DW
    bool valid;  // k < KDIM
};

__device__ __forceinline__ Tap tap_of(int k)
{
    const int c = k / (KH * KW);
    const int kh = (k % (KH * KW)) / KW;
    const int kw = k % KW;
    return {c * (H * W) + kh * DH * W + kw * DW, kh * DH, kw * DW, k < KDIM};
}

extern "C" __global__ void __launch_bounds__(BLOCK, MIN_BLOCKS)
CONV_MMA(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
         float* __restrict__ y, int batch)
{
    __shared__ uint4 a_big[A_FRAGMENTS];
#if SPLIT
    __shared__ uint4 a_small[A_FRAGMENTS];
#endif
    for (int i = threadIdx.x; i < A_FRAGMENTS; i += BLOCK) {
        const int lane = i % 32;
        const int ks = (i / 32) % KSTEPS;
        const int mt = i / (32 * KSTEPS);
        const int row = mt * 16 + lane / 4;
        const int col = ks * 8 + lane % 4;
        const float v[4] = {weight_at(w, row, col), weight_at(w, row + 8, col),
                            weight_at(w, row, col + 4), weight_at(w, row + 8, col + 4)};
        unsigned int big[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) big[r] = to_tf32(v[r]);
        a_big[i] = make_uint4(big[0], big[1], big[2], big[3]);
#if SPLIT
        a_small[i] = make_uint4(to_tf32(v[0] - __uint_as_float(big[0])), to_tf32(v[1] - __uint_as_float(big[1])),
                                to_tf32(v[2] - __uint_as_float(big[2])), to_tf32(v[3] - __uint_as_float(big[3])));
#endif
    }
    __syncthreads();

    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int total = batch * PIXELS;             // GEMM columns
    const int warp_tiles = ((total + 7) / 8 + NT - 1) / NT;

    // warp-uniform loop: every lane reaches each mma.sync
    for (int wt = blockIdx.x * WARPS + threadIdx.x / 32; wt < warp_tiles; wt += gridDim.x * WARPS) {
        // this lane's B column in each pixel tile: pixel (wt*NT + j)*8 + g
        const float* origin[NT];
#if PADDED
        int ih0[NT], iw0[NT];
#endif
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int p = (wt * NT + j) * 8 + g;
            const int q = p < total ? p : 0;  // a dead pixel (past the batch) reads image 0; it is never stored
            const int n = q / PIXELS;
            const int oh = (q % PIXELS) / OW;
            const int ow = q % OW;
            origin[j] = x + (size_t)n * (C * H * W) + (oh * SH - PH) * W + (ow * SW - PW);
#if PADDED
            ih0[j] = oh * SH - PH;
            iw0[j] = ow * SW - PW;
#endif
        }

        float acc[MTILES][NT][4];
#pragma unroll
        for (int mt = 0; mt < MTILES; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[mt][j][r] = 0.0f;

#pragma unroll UNROLL_K
        for (int ks = 0; ks < KSTEPS; ++ks) {
            const Tap lo = tap_of(ks * 8 + t);      // B row t
            const Tap hi = tap_of(ks * 8 + t + 4);  // B row t + 4
            uint4 a[MTILES];
#if SPLIT
            uint4 a_lo[MTILES];
#endif
#pragma unroll
            for (int mt = 0; mt < MTILES; ++mt) {
                a[mt] = a_big[(mt * KSTEPS + ks) * 32 + lane];
#if SPLIT
                a_lo[mt] = a_small[(mt * KSTEPS + ks) * 32 + lane];
#endif
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#if PADDED
                const bool in_lo = lo.valid && (unsigned)(ih0[j] + lo.dh) < (unsigned)H && (unsigned)(iw0[j] + lo.dw) < (unsigned)W;
                const bool in_hi = hi.valid && (unsigned)(ih0[j] + hi.dh) < (unsigned)H && (unsigned)(iw0[j] + hi.dw) < (unsigned)W;
#else
                const bool in_lo = lo.valid, in_hi = hi.valid;
#endif
                const float v_lo = in_lo ? origin[j][lo.offset] : 0.0f;
                const float v_hi = in_hi ? origin[j][hi.offset] : 0.0f;
                const unsigned int b_lo = to_tf32(v_lo), b_hi = to_tf32(v_hi);
#if SPLIT
                const unsigned int s_lo = to_tf32(v_lo - __uint_as_float(b_lo));
                const unsigned int s_hi = to_tf32(v_hi - __uint_as_float(b_hi));
#endif
#pragma unroll
                for (int mt = 0; mt < MTILES; ++mt) {
#if SPLIT
                    mma_tf32(acc[mt][j], a_lo[mt], b_lo, b_hi);  // small x big
                    mma_tf32(acc[mt][j], a[mt], s_lo, s_hi);     // big x small
#endif
                    mma_tf32(acc[mt][j], a[mt], b_lo, b_hi);     // big x big
                }
            }
        }

        // C fragment: maps mt*16 + g (+8), pixels tile*8 + 2t (+1)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int col = 0; col < 2; ++col) {
                const int p = (wt * NT + j) * 8 + 2 * t + col;
                if (p >= total) continue;
                float* out = y + (size_t)(p / PIXELS) * (M * PIXELS) + p % PIXELS;
#pragma unroll
                for (int mt = 0; mt < MTILES; ++mt) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int m = mt * 16 + g + 8 * half;
                        if (m >= M) continue;
                        float v = acc[mt][j][2 * half + col];
#if HAS_BIAS
                        v += b[m];
#endif
                        out[(size_t)m * PIXELS] = v;
                    }
                }
            }
        }
    }
}
