// conv_fp16: 2-D convolution (ONNX Conv, any group count G) in FP16 arithmetic,
// FP32 in and out. Opt-in only: the result is NOT FP32-exact.
//
// What: each thread computes two neighbouring output pixels of one row (ow and
// ow+1, a half2 pair) for MO output maps. Inputs are read as FP32 and converted
// on load: one cvt.rn.f16x2.f32 packs the two pixels' values of a tap into a
// half2. The filters sit in __constant__ memory as half2 {w, w} (the weight
// duplicated in both halves, [c][kh][kw][m] order), so one fma.rn.f16x2 does the
// multiply-add of both pixels for one map. Products are summed in half2 over
// FLUSH_ROWS filter rows (about 16 taps), then added to FP32 accumulators, and
// the bias is added and the result written in FP32.
//
// Why faster: per tap and pixel pair, one conversion plus MO packed FMAs replace
// 2 x MO FP32 FMAs, so the arithmetic issue count of the tap loop nearly halves
// (the flush to FP32 costs 4 instructions per map every FLUSH_ROWS rows).
// Memory traffic is unchanged: the input and output stay FP32. Measured on an
// H200 (batch 10000) it beats cuDNN but not the FP32 register-blocked const_rb
// (0.84 / 2.80 / 0.54 ms against 0.62 / 2.32 / 0.45 ms on lenet86 conv1, conv2
// and ece408_high), which reuses each input load across output rows; this
// kernel does not.
//
// Accuracy cost: inputs and weights rounded to FP16 (11-bit significand, unit
// roundoff 2^-11 ~ 4.9e-4) and each product and short partial sum rounded to
// FP16: a relative L2 error of about 6e-4 against an exact result on
// standard-normal data (order 1e-3; flushing once per channel instead would
// give 1.1e-3). Values beyond +-65504 overflow FP16 to infinity, and
// magnitudes below ~6e-5 lose precision (FP16 subnormals).
//
// Macros: the shared shape macros (C, M, G, H, W, KH, KW, SH, SW, PH, PW, DH, DW,
// OH, OW, PADDED, HAS_BIAS, BLOCK) plus MO (maps per thread; the last map group
// may be shorter), UNROLL_C and FLUSH_ROWS. Needs sm_53+ for f16x2 FMA; sm_80+
// converts a pair in one instruction.
//
// Launch: block (BLOCK), grid (ceil(batch * OH * ceil(OW/2) / BLOCK), ceil(M / MO)).

#define PAIRS ((OW + 1) / 2)              // pixel pairs per output row
#define SPAN ((KW - 1) * DW + SW + 1)     // input columns a pair reads in one filter row
#define GROUPS ((M + MO - 1) / MO)
// with pads, or with an odd OW (the last pair's second pixel does not exist),
// some columns a pair reads may lie outside the image
#define CHECK_COLUMNS (PADDED || (OW % 2) != 0)

__constant__ unsigned int filters[(C / G) * KH * KW * M];  // half2 {w, w}, [c][kh][kw][m]
#if HAS_BIAS
__constant__ float bias[M];
#endif

// half2 bits {lo, hi} from two floats, rounded to nearest
__device__ __forceinline__ unsigned int pack_half2(float lo, float hi)
{
    unsigned int packed;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
#else
    asm("{ .reg .f16 l, h;\n"
        "  cvt.rn.f16.f32 l, %1;\n"
        "  cvt.rn.f16.f32 h, %2;\n"
        "  mov.b32 %0, {l, h}; }"
        : "=r"(packed) : "f"(lo), "f"(hi));
#endif
    return packed;
}

__device__ __forceinline__ unsigned int fma_half2(unsigned int a, unsigned int b, unsigned int c)
{
    unsigned int d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// adds both halves of a half2 to two FP32 accumulators
__device__ __forceinline__ void flush_half2(unsigned int packed, float& lo, float& hi)
{
    float l, h;
    asm("{ .reg .f16 a, b;\n"
        "  mov.b32 {a, b}, %2;\n"
        "  cvt.f32.f16 %0, a;\n"
        "  cvt.f32.f16 %1, b; }"
        : "=f"(l), "=f"(h) : "r"(packed));
    lo += l;
    hi += h;
}

// Maps FIRST .. FIRST+COUNT-1 of the pixel pair whose window starts at (ih0, iw0).
// `out` points at map 0 of the pair's first pixel; `second`: the second pixel exists.
template <int FIRST, int COUNT>
__device__ __forceinline__ void conv_pair(const float* __restrict__ image, float* __restrict__ out,
                                          int ih0, int iw0, bool second)
{
    image += (FIRST / (M / G)) * ((C / G) * H * W);  // the host keeps a thread's maps in one group
    float acc0[COUNT], acc1[COUNT];  // FP32 sums of the first and the second pixel
    unsigned int part[COUNT];        // half2 partial sums since the last flush
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
        acc0[j] = 0.0f;
        acc1[j] = 0.0f;
        part[j] = 0u;
    }

#pragma unroll UNROLL_C
    for (int c = 0; c < C / G; ++c) {
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = ih0 + kh * DH;
            if (!PADDED || (unsigned)ih < (unsigned)H) {
                const float* row = image + (c * H + ih) * W + iw0;
                float v[SPAN];
#pragma unroll
                for (int i = 0; i < SPAN; ++i)
                    v[i] = (!CHECK_COLUMNS || (unsigned)(iw0 + i) < (unsigned)W) ? row[i] : 0.0f;
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
                    const unsigned int pair = pack_half2(v[kw * DW], v[kw * DW + SW]);
#pragma unroll
                    for (int j = 0; j < COUNT; ++j)
                        part[j] = fma_half2(pair, filters[((c * KH + kh) * KW + kw) * M + FIRST + j], part[j]);
                }
            }
            if ((kh + 1) % FLUSH_ROWS == 0 || kh == KH - 1) {
#pragma unroll
                for (int j = 0; j < COUNT; ++j) {
                    flush_half2(part[j], acc0[j], acc1[j]);
                    part[j] = 0u;
                }
            }
        }
    }

#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
#if HAS_BIAS
        acc0[j] += bias[FIRST + j];
        acc1[j] += bias[FIRST + j];
#endif
        out[(FIRST + j) * (OH * OW)] = acc0[j];
        if (second) out[(FIRST + j) * (OH * OW) + 1] = acc1[j];
    }
}

// Runs the copy of conv_pair for map group `group` (each copy sees its first map as a literal).
template <int GI>
__device__ __forceinline__ void pair_group(int group, const float* __restrict__ image, float* __restrict__ out,
                                           int ih0, int iw0, bool second)
{
    constexpr int first = GI * MO;
    constexpr int count = (M - first < MO) ? (M - first) : MO;
    if (group == GI) {
        conv_pair<first, count>(image, out, ih0, iw0, second);
    } else if constexpr (GI + 1 < GROUPS) {
        pair_group<GI + 1>(group, image, out, ih0, iw0, second);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
conv_fp16(const float* __restrict__ x, float* __restrict__ y, int batch)
{
    const int thread = blockIdx.x * BLOCK + threadIdx.x;  // over batch * OH * PAIRS
    if (thread >= batch * (OH * PAIRS)) return;
    const int n = thread / (OH * PAIRS);
    const int oh = (thread % (OH * PAIRS)) / PAIRS;
    const int ow = (thread % PAIRS) * 2;

    const float* image = x + (size_t)n * (C * H * W);
    float* out = y + (size_t)n * (M * OH * OW) + oh * OW + ow;
    pair_group<0>(blockIdx.y, image, out, oh * SH - PH, ow * SW - PW, ow + 1 < OW);
}
