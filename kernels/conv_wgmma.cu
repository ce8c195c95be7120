// conv_wgmma: 2-D convolution (ONNX Conv, any group count whose groups have a multiple of 32
// input channels) as an FP32-exact implicit GEMM on Hopper's asynchronous warpgroup MMA, wgmma
// (sm_90a alone; conv_tc_gemm is the path elsewhere).
//
// Why: conv_tc_gemm's 3xTF32 loop on mma.sync is bound by its instruction mix (ncu on VGG
// 512->512 at batch 32: 218 registers, 12.5% occupancy, issue slots half busy): each warp loads
// and splits its own operand fragments, and the MMAs wait on them. Here both operands stay in
// shared memory, where wgmma reads them through descriptors, and the work is split between
// warpgroups that do one thing each (as CUTLASS's Hopper kernels do):
// - producers (the first NTHREADS threads) copy each slice's operands with 16-byte cp.async and
//   hand the stage over through an mbarrier;
// - consumers (a warpgroup per 64 pixels) issue the slice's 12 wgmmas, wait, release the stage,
//   and add the slice's sums to their running sums.
// setmaxnreg moves registers from the producers, who need few, to the consumers' accumulators.
//
// The operands arrive split and K-major, so that a producer only copies:
// - the weights, rearranged once at build time (WgmmaGemmKernel) to W[map][k] with
//   k = (kh*KW + kw)*CG + c, and their small parts beside them;
// - the image, rewritten channel-last by conv_split_channel_last before each call (after the
//   prologue), its values and their small parts: a slice of 32 k is one window tap's 32 channels,
//   128 contiguous bytes a pixel, so a pixel's slice is eight 16-byte copies and one test of
//   whether the tap lies inside the image. (ncu and timings of the NCHW gather this replaced, on
//   ResNet 128->128 at batch 32: the producers, one 4-byte copy and one __constant__ tap lookup a
//   value, then a split in shared memory, kept the consumers waiting; copying nothing ran the
//   kernel 1.97x faster.)
//
// The product, per group: Y[pixel][map] = sum_k X[pixel][k] * W[map][k] over KDIM = CG*KH*KW; a
// block has BN pixels (n, oh, ow) of the batch, 64 a consumer warpgroup (wgmma's M), and BM maps
// (wgmma's N: 64 or 128) inside one group (MapTile). The K split and the epilogue are
// conv_tc_gemm's (conv_implicit_tiles.cuh).
//
// Arithmetic (3xTF32, as conv_tc_gemm's SPLIT): each operand a = big + small. The tensor core
// reads an FP32 value as TF32 by dropping its low 13 bits, so the raw value is its own big part,
// and small = a - (a with those bits cleared), exact in FP32 (truncated to TF32 in turn). Per k8
// step, small*big, big*small and big*big go into `part`, the sum of a pair of slices, which is
// added to the running sum with a rounded FP32 add: a long K of truncating tensor-core adds would drift.
//
// Shared memory: STAGES stages, each the BM x BK weights, their small parts, the BN x BK image
// values and theirs, all K-major in wgmma's 128-byte swizzle: a row's 32 k are one 128-byte line,
// its 16-byte quads permuted by row % 8, so that the tensor cores' reads of 8 rows at one k quad,
// and the copies' writes of a row's 8 quads, spread over the banks. Then a `full` and an `empty`
// mbarrier per stage. Copies run LAG = STAGES - 1 slices ahead of the one being multiplied.
//
// Accumulators (lane = 4*g + t; consumer warp w owns pixel rows 16w..16w+15): those of n8 block j
// are d[4j..4j+3] = [g][8j+2t], [g][8j+2t+1], [g+8][8j+2t], [g+8][8j+2t+1].
//
// Macros: the shape macros, BM, BN (a multiple of 64), BK (32), STAGES, KSLICES, TAP_MASK (1),
// KPAD, PROLOGUE. Launch conv_split_channel_last first (see there), then conv_wgmma: block (BN *
// 4), grid (ceil(batch*OH*OW / BN), G * ceil(M/G / BM), KSLICES), dynamic shared memory (STAGES * 2
// * (BM + BN) * BK * 4 + STAGES * 16 + 1024) bytes. With KSLICES > 1 the partial sums go to
// `partial` and conv_k_slices_reduce finishes them. nonfinite: the step's NaN/Inf flag, as conv_tc_gemm's.

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "conv_wgmma needs sm_90a (wgmma); conv_tc_gemm runs on other GPUs"
#endif

#include "conv_epilogue.cuh"

#define KTILES (KDIM / BK)
#define NTHREADS (BN * 2)           // producers; as many consumers: a warpgroup per 64 pixels
#define BLOCK_THREADS (2 * NTHREADS)
#define ACC (BM / 2)                // accumulators a consumer thread: 64 x BM over a warpgroup's 128 threads
// setmaxnreg: a producer and consumer pair may hold the 512 registers the register file gives two
// threads of a 256-thread block, the 256 of a 512-thread one
#if BLOCK_THREADS <= 256
#define PRODUCER_REGISTERS 168
#define CONSUMER_REGISTERS 232
#else
#define PRODUCER_REGISTERS 56
#define CONSUMER_REGISTERS 200
#endif
#define A_STAGE (BM * BK)
#define B_STAGE (BN * BK)
#define STAGE (2 * (A_STAGE + B_STAGE))  // a slice: weights, their small parts, image values, theirs
#define LAG (STAGES - 1)                 // slices copied ahead of the one being multiplied
#define QUADS (BK / 4)                   // 16-byte copies a row of a slice
// value (row, k) of a K-major operand in wgmma's 128-byte swizzle: a row's BK = 32 values are one
// 128-byte line, its 16-byte quad q stored at quad q ^ (row % 8)
#define SWIZZLED_AT(row, k) ((row) * BK + ((((k) / 4) ^ ((row) % 8)) * 4) + (k) % 4)

#include "conv_implicit_tiles.cuh"

static_assert(BM == 64 || BM == 128, "a wgmma's N: 64 or 128 maps");
static_assert(BN % 64 == 0 && BK == 32, "64 pixels a warpgroup, a row's slice one 128-byte line");
static_assert(CG % BK == 0, "a slice is 32 channels of one window tap");
static_assert(TAP_MASK, "a bit per window tap");
static_assert(STAGES >= 2, "a slice in flight while one is multiplied");

__device__ __forceinline__ float small_part(float v) { return v - __uint_as_float(__float_as_uint(v) & 0xffffe000u); }

// The prologue on an image value of channel c of image n (conv_implicit_tiles.cuh says which;
// prologue_b_slice there applies the same arithmetic to the NCHW gather).
__device__ __forceinline__ float prologue_value(float v, const float* __restrict__ pro, int n, int c)
{
#if PROLOGUE == 1
    return v * __ldg(pro + (size_t)n * C + c);
#elif PROLOGUE == 2
    return PROLOGUE_ACTIVATION(fmaf(v, __ldg(pro + c), __ldg(pro + C + c)));
#else
    return v;
#endif
}

// big, small = X after the prologue, channel-last ([batch][H*W][C]), and its small parts; X's images
// lie x_image floats apart. A block transposes 32 channels x 32 pixels of one image through shared
// memory, so that both its reads (along pixels) and its writes (along channels) are coalesced.
// Launch: block (32, 8), grid (batch * ceil(H*W / 32), C / 32).
extern "C" __global__ void __launch_bounds__(256)
conv_split_channel_last(const float* __restrict__ x, const float* __restrict__ pro, float* __restrict__ big,
                        float* __restrict__ small, int x_image)
{
    constexpr int PIXEL_TILES = (H * W + 31) / 32;
    __shared__ float tile[32][33];  // [channel][pixel], a column apart in banks
    const int n = blockIdx.x / PIXEL_TILES;
    const int p0 = blockIdx.x % PIXEL_TILES * 32;
    const int c0 = blockIdx.y * 32;
    const float* image = x + (size_t)n * x_image;
#pragma unroll
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int p = p0 + threadIdx.x;
        tile[i][threadIdx.x] = p < H * W ? prologue_value(image[(size_t)(c0 + i) * (H * W) + p], pro, n, c0 + i) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int p = p0 + i;
        if (p >= H * W) continue;
        const float v = tile[threadIdx.x][i];
        const size_t at = ((size_t)n * (H * W) + p) * C + c0 + threadIdx.x;
        big[at] = v;
        small[at] = small_part(v);
    }
}

// The descriptor of a K-major operand in the 128-byte swizzle whose k8 step starts at `tile`: the
// operand's rows in whole 1024-byte atoms of 8, the step 32 bytes into its lines; 8-row groups 1024
// bytes apart (stride); the leading offset unused (a row's k fit one line).
__device__ __forceinline__ unsigned long long descriptor(const float* tile)
{
    const unsigned long long at = (unsigned int)__cvta_generic_to_shared(tile);
    constexpr unsigned long long LEADING = 16, STRIDE = 1024, SWIZZLE_128B = 1;
    return ((at & 0x3FFFF) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32) | (SWIZZLE_128B << 62);
}

// wgmma reads shared memory through the async proxy: make the cp.async copies this thread waited
// for visible to it
__device__ __forceinline__ void publish_to_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory"); }

// The stage hand-over: an mbarrier per stage and direction, its phase flipping each time all
// `count` threads of one side have arrived.
__device__ __forceinline__ unsigned int shared_address(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void barrier_init(unsigned long long* bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(unsigned long long* bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void barrier_wait(unsigned long long* bar, int phase)
{
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(shared_address(bar)), "r"(phase & 1) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulators across the asynchronous wgmmas.
__device__ __forceinline__ void pin(float (&d)[ACC])
{
#pragma unroll
    for (int i = 0; i < ACC; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= a x b: a the warpgroup's 64 x 8 pixels, b the BM x 8 weights, both behind descriptors;
// `accumulate` 0 overwrites d.
__device__ __forceinline__ void wgmma_n64(float (&d)[32], unsigned long long a, unsigned long long b, int accumulate)
{
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
        " %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n128(float (&d)[64], unsigned long long a, unsigned long long b, int accumulate)
{
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
        " %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(accumulate));
}


__device__ __forceinline__ void wgmma_tile(float (&d)[ACC], unsigned long long a, unsigned long long b, int accumulate)
{
#if BM == 128
    wgmma_n128(d, a, b, accumulate);
#else
    wgmma_n64(d, a, b, accumulate);
#endif
}

// Issues part (+)= this consumer warpgroup's 64 pixels x BM maps of the slice at `stage` (`adds`: onto
// what part holds, else over it).
__device__ __forceinline__ void issue_slice(float (&part)[ACC], const float* stage, bool adds)
{
    const int pixels = (threadIdx.x - NTHREADS) / 128 * 64;  // the warpgroup's first row of the image tile
    const float* image = stage + 2 * A_STAGE + SWIZZLED_AT(pixels, 0);
    pin(part);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
        const unsigned long long w_big = descriptor(stage + SWIZZLED_AT(0, kk));
        const unsigned long long w_small = descriptor(stage + A_STAGE + SWIZZLED_AT(0, kk));
        const unsigned long long x_big = descriptor(image + SWIZZLED_AT(0, kk));
        const unsigned long long x_small = descriptor(image + B_STAGE + SWIZZLED_AT(0, kk));
        wgmma_tile(part, x_small, w_big, adds || kk > 0);
        wgmma_tile(part, x_big, w_small, 1);
        wgmma_tile(part, x_big, w_big, 1);
    }
    wgmma_commit();
}

__device__ __forceinline__ void add_part(float (&acc)[ACC], float (&part)[ACC])
{
    pin(part);
#pragma unroll
    for (int j = 0; j < ACC; ++j) acc[j] += part[j];
}

// This thread's weight copies: eight consecutive threads on a row's eight quads (one 128-byte line
// read, all 32 banks written), rows NTHREADS / 8 apart.
struct WeightCopies {
    static constexpr int ROW_STEP = NTHREADS / QUADS;
    static constexpr int TURNS = BM / ROW_STEP;
    int quad, first_row;

    __device__ __forceinline__ WeightCopies() : quad(threadIdx.x % QUADS), first_row(threadIdx.x / QUADS)
    {
        static_assert(BM % ROW_STEP == 0, "whole turns of rows");
    }

    __device__ __forceinline__ void copy(float* stage, const float* __restrict__ w_big, const float* __restrict__ w_small,
                                         const MapTile& maps, int k0) const
    {
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
            const int m = first_row + turn * ROW_STEP;
            const bool inside = maps.first + m < maps.end;
            const size_t from = inside ? (size_t)(maps.first + m) * KDIM + k0 + quad * 4 : 0;
            const int to = SWIZZLED_AT(m, quad * 4);
            copy_async16(stage + to, w_big + from, inside);
            copy_async16(stage + A_STAGE + to, w_small + from, inside);
        }
    }
};

// This thread's image copies: eight consecutive threads on a pixel's eight quads of the slice's 32
// channels, pixels NTHREADS / 8 apart; where each of its pixels' windows lies in the channel-last
// image, and which of their taps lie inside it, worked out once.
struct PixelCopies {
    static constexpr int PIXEL_STEP = NTHREADS / QUADS;
    static constexpr int TURNS = BN / PIXEL_STEP;
    long long origin[TURNS];  // (image, ih0, iw0, the group's channel 0 + this quad's); ih0, iw0 may be negative (pads)
    TapBits inside[TURNS];    // bit kh*KW + kw: that tap of the pixel's window lies inside the image
    int quad, first_pixel;

    __device__ __forceinline__ PixelCopies(int col0, int total, int group) : quad(threadIdx.x % QUADS), first_pixel(threadIdx.x / QUADS)
    {
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
            const int col = col0 + first_pixel + turn * PIXEL_STEP;
            const bool live = col < total;
            const int n = live ? col / P : 0;
            const int p = live ? col % P : 0;
            const int ih0 = (p / OW) * SH - PH;
            const int iw0 = (p % OW) * SW - PW;
            origin[turn] = ((long long)(n * H + ih0) * W + iw0) * C + group * CG + quad * 4;
            TapBits bits = 0;
#pragma unroll
            for (int j = 0; j < KH * KW; ++j) {
                const bool in = (unsigned)(ih0 + (j / KW) * DH) < (unsigned)H && (unsigned)(iw0 + (j % KW) * DW) < (unsigned)W;
                bits |= (TapBits)(in && live) << j;
            }
            inside[turn] = bits;
        }
    }

    __device__ __forceinline__ void copy(float* stage, const float* __restrict__ x_big, const float* __restrict__ x_small, int k0) const
    {
        const int tap = k0 / CG;  // the slice's window tap and first channel
        const int kh = tap / KW;
        const long long offset = ((long long)(kh * DH) * W + (tap - kh * KW) * DW) * C + (k0 - tap * CG);
#pragma unroll
        for (int turn = 0; turn < TURNS; ++turn) {
            const bool valid = (inside[turn] >> tap) & 1;
            const long long from = valid ? origin[turn] + offset : 0;
            const int to = SWIZZLED_AT(first_pixel + turn * PIXEL_STEP, quad * 4);
            copy_async16(stage + 2 * A_STAGE + to, x_big + from, valid);
            copy_async16(stage + 2 * A_STAGE + B_STAGE + to, x_small + from, valid);
        }
    }
};

// The producers' part: hand slice j - LAG over once this thread's copies of it have landed (each
// producer arrives for its own), then copy slice j while slices j - LAG + 1 .. j - 1 are in flight.
// The hand-over comes first: the consumers may need that slice to release the stage slice j goes to.
__device__ __forceinline__ void produce(const float* __restrict__ x_big, const float* __restrict__ x_small,
                                        const float* __restrict__ w_big, const float* __restrict__ w_small, float* stages,
                                        unsigned long long* full, unsigned long long* empty, const MapTile& maps,
                                        const SliceRun& run, int col0, int total)
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS));
    const WeightCopies weights;
    const PixelCopies image(col0, total, maps.group);
    for (int j = 0; j < run.count + LAG; ++j) {
        const int ready = j - LAG;
        if (ready >= 0) {
            wait_copies<LAG - 1>();  // of the j groups committed, all but the newest LAG - 1: slice `ready`'s
            publish_to_async_proxy();
            barrier_arrive(full + ready % STAGES);
        }
        if (j < run.count) {
            float* stage = stages + j % STAGES * STAGE;
            if (j >= STAGES) barrier_wait(empty + j % STAGES, j / STAGES - 1);  // slice j - STAGES is multiplied
            const int k0 = (run.first + j) * BK;
            weights.copy(stage, w_big, w_small, maps, k0);
            image.copy(stage, x_big, x_small, k0);
        }
        commit_copies();  // an empty group keeps the count of groups in step
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, 1)
conv_wgmma(const float* __restrict__ x_big, const float* __restrict__ x_small, const float* __restrict__ w_big,
           const float* __restrict__ w_small, const float* __restrict__ b, const float* __restrict__ r,
           float* __restrict__ y, float* __restrict__ partial, int batch, unsigned char* nonfinite)
{
    extern __shared__ float4 shared_tiles[];
    // the swizzle's atoms are 1024 bytes, aligned so; the launch gives 1024 bytes to spare
    const unsigned int misaligned = shared_address(shared_tiles) % 1024;
    float* stages = reinterpret_cast<float*>(reinterpret_cast<char*>(shared_tiles) + (misaligned ? 1024 - misaligned : 0));
    unsigned long long* full = reinterpret_cast<unsigned long long*>(stages + STAGES * STAGE);
    unsigned long long* empty = full + STAGES;
    const int total = batch * P;
    const int col0 = blockIdx.x * BN;
    const MapTile maps;
    const int m0 = maps.first;
    const SliceRun run;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            barrier_init(full + s, NTHREADS);
            barrier_init(empty + s, NTHREADS);
        }
    }
    __syncthreads();
    if (threadIdx.x < NTHREADS) {
        produce(x_big, x_small, w_big, w_small, stages, full, empty, maps, run, col0, total);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS));
    float acc[ACC], part[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
    // Slices go to part in pairs: the second's wgmmas are issued before the first's are waited for,
    // so that the tensor cores have work across the turn; each stage is released as its wgmmas end.
    for (int i = 0; i < run.count; ++i) {
        const bool opens = i % 2 == 0;  // a pair's first slice
        barrier_wait(full + i % STAGES, i / STAGES);
        issue_slice(part, stages + i % STAGES * STAGE, !opens);
        if (!opens) {
            wgmma_wait<1>();
            barrier_arrive(empty + (i - 1) % STAGES);
        }
        if (!opens || i == run.count - 1) {
            wgmma_wait<0>();
            barrier_arrive(empty + i % STAGES);
            add_part(acc, part);
        }
    }

    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const int row0 = (threadIdx.x - NTHREADS) / 32 * 16;  // this warp's 16 pixels of the tile
#pragma unroll
    for (int upper = 0; upper < 2; ++upper) {
        const int col = col0 + row0 + g + 8 * upper;
        if (col >= total) continue;
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const int m = m0 + 8 * j + 2 * t + q;
                if (m < maps.end) store_sum(y, partial, b, r, nonfinite, total, col, m, acc[4 * j + 2 * upper + q]);
            }
        }
    }
}
