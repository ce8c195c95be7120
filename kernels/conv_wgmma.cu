// conv_wgmma: 2-D convolution (ONNX Conv, any group count) as an FP32-exact implicit GEMM on
// Hopper's asynchronous warpgroup MMA, wgmma (sm_90a alone; conv_tc_gemm is the path elsewhere).
//
// Why: conv_tc_gemm's 3xTF32 loop on mma.sync is bound by its instruction mix (ncu on VGG
// 512->512 at batch 32: 218 registers, 12.5% occupancy, issue slots half busy): each warp loads
// and splits its own operand fragments, and the MMAs wait on them. Here both operands stay in
// shared memory, where wgmma reads them through descriptors, and the work is split between
// warpgroups that do one thing each (as CUTLASS's Hopper kernels do):
// - producers (the first NTHREADS threads) gather a slice's weights and image values with
//   cp.async, split them into big + small parts, and hand the stage over through an mbarrier;
// - consumers (a warpgroup per 64 pixels) issue the slice's 12 wgmmas, wait, release the stage,
//   and add the slice's sums to their running sums.
// setmaxnreg moves registers from the producers, who need few, to the consumers' accumulators.
//
// The product, per group: Y[pixel][map] = sum_k X[pixel][k] * W[map][k], k = (c, kh, kw) over
// KDIM = C/G*KH*KW; a block has BN pixels (n, oh, ow) of the batch, 64 a consumer warpgroup
// (wgmma's M), and BM maps (wgmma's N: 64 or 128) inside one group (MapTile). The im2col gather's
// tap table, the K split, the prologue and the epilogue are conv_tc_gemm's (conv_implicit_tiles.cuh).
//
// Arithmetic (3xTF32, as conv_tc_gemm's SPLIT): each operand a = big + small. The tensor core
// reads an FP32 value as TF32 by dropping its low 13 bits, so the raw value is its own big part,
// and small = a - (a with those bits cleared), exact in FP32 (truncated to TF32 in turn). Per k8
// step, small*big, big*small and big*big go into `part`, the slice's sum, which is added to the
// running sum with a rounded FP32 add: a long K of truncating tensor-core adds would drift.
//
// Shared memory: STAGES stages, each the BM x BK weights and the BN x BK image values of a slice,
// then two buffers of small parts (one being written, one multiplied), all K-major in wgmma's
// 128-byte swizzle: a row's 32 k are one 128-byte line, its 16-byte quads permuted by row % 8, so
// that the tensor cores' reads of 8 rows at one k quad, and the copies' writes, spread over the banks.
// Then a `full` and an `empty` mbarrier per stage. Copies run LAG = STAGES - 2 slices ahead of the
// split, so that their latency hides behind LAG slices of multiplying.
//
// Accumulators (lane = 4*g + t; consumer warp w owns pixel rows 16w..16w+15): those of n8 block j
// are d[4j..4j+3] = [g][8j+2t], [g][8j+2t+1], [g+8][8j+2t], [g+8][8j+2t+1].
//
// Macros: the shape macros, BM, BN (a multiple of 64), BK, STAGES, KSLICES, A_VEC, B_VEC (1),
// TAP_MASK, KPAD. Launch: block (BN * 4), grid (ceil(batch*OH*OW / BN), G * ceil(M/G / BM),
// KSLICES), dynamic shared memory ((STAGES + 2) * (A_STAGE + B_STAGE) * 4 + STAGES * 16 + 1024) bytes.
// With KSLICES > 1 the partial sums go to `partial` and conv_k_slices_reduce finishes them.

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "conv_wgmma needs sm_90a (wgmma); conv_tc_gemm runs on other GPUs"
#endif

#include "conv_epilogue.cuh"

#define KTILES ((KDIM + BK - 1) / BK)
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
#define RAW (A_STAGE + B_STAGE)     // a slice's values: a stage; their small parts: a small buffer
#define LAG (STAGES - 2)            // slices copied ahead of the one being split
// value (row, k) of a K-major operand in wgmma's 128-byte swizzle: a row's BK = 32 values are one
// 128-byte line, its 16-byte quad q stored at quad q ^ (row % 8)
#define SWIZZLED_AT(row, k) ((row) * BK + ((((k) / 4) ^ ((row) % 8)) * 4) + (k) % 4)
#define A_AT(m, k) SWIZZLED_AT(m, k)
#define B_AT(row, column) SWIZZLED_AT(column, row)
// each warp copies 16 columns x 2 rows a turn: its stores then fill 16 banks twice
#define B_COLUMN_OF(thread) ((thread) / 32 * 16 + (thread) % 32 / 2)
#define B_ROW_OF(thread) ((thread) % 2)

#include "conv_implicit_tiles.cuh"

static_assert(BM == 64 || BM == 128, "a wgmma's N: 64 or 128 maps");
static_assert(BN % 64 == 0 && BK == 32 && B_VEC == 1, "64 pixels a warpgroup, a row's slice one 128-byte line, one pixel a copy");
static_assert(Columns::ROW_STEP == 2, "B_ROW_OF's two rows a turn");
static_assert(STAGES >= 3, "slices in flight, one being split and one being multiplied");

// The small parts of a slice's values (its RAW floats at `stage`, big parts as they are) into
// `small`, alike laid out; the producers share the work.
__device__ __forceinline__ void split_slice(const float* stage, float* small)
{
    static_assert(RAW / 4 % NTHREADS == 0, "every producer splits as many float4s");
    const float4* from = reinterpret_cast<const float4*>(stage);
    float4* to = reinterpret_cast<float4*>(small);
#pragma unroll
    for (int turn = 0; turn < RAW / 4 / NTHREADS; ++turn) {
        const int i = turn * NTHREADS + threadIdx.x;
        const float4 v = from[i];
        float4 s;
        s.x = v.x - __uint_as_float(__float_as_uint(v.x) & 0xffffe000u);
        s.y = v.y - __uint_as_float(__float_as_uint(v.y) & 0xffffe000u);
        s.z = v.z - __uint_as_float(__float_as_uint(v.z) & 0xffffe000u);
        s.w = v.w - __uint_as_float(__float_as_uint(v.w) & 0xffffe000u);
        to[i] = s;
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

// wgmma reads shared memory through the async proxy: make this thread's ordinary stores (and the
// cp.async copies it waited for) visible to it
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
// the producers alone (named barrier 1; __syncthreads is barrier 0)
__device__ __forceinline__ void producers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(NTHREADS) : "memory"); }

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

// Issues part = this consumer warpgroup's 64 pixels x BM maps of the slice at `stage` (its small parts at `small`).
__device__ __forceinline__ void issue_slice(float (&part)[ACC], const float* stage, const float* small)
{
    const int pixels = (threadIdx.x - NTHREADS) / 128 * 64;  // the warpgroup's first row of the image tile
    const float* image = stage + A_STAGE + B_AT(0, pixels);
    const float* image_small = small + A_STAGE + B_AT(0, pixels);
    pin(part);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
        const unsigned long long w_big = descriptor(stage + A_AT(0, kk));
        const unsigned long long w_small = descriptor(small + A_AT(0, kk));
        const unsigned long long x_big = descriptor(image + B_AT(kk, 0));
        const unsigned long long x_small = descriptor(image_small + B_AT(kk, 0));
        wgmma_tile(part, x_small, w_big, kk > 0);
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

// This thread's weight copies: consecutive threads on consecutive maps (the eight lanes of a 16-byte
// store phase then fill one 128-byte line), so every piece it copies lies in one map row (NTHREADS is a
// multiple of BM), so the row's address and whether it is inside the group are worked out once.
struct WeightCopies {
    static constexpr int PIECES = A_STAGE / A_VEC / NTHREADS;  // copies a slice
    static constexpr int K_STEP = NTHREADS / BM * A_VEC;       // k between them
    const float* row;  // the row's first weight, k = first_k
    int first_k;       // this thread's first k of a slice
    bool live;         // the map lies inside the group

    __device__ __forceinline__ WeightCopies(const float* __restrict__ w, const MapTile& maps)
    {
        static_assert(NTHREADS % BM == 0 && A_STAGE % (A_VEC * NTHREADS) == 0, "whole rows of pieces");
        const int m = threadIdx.x % BM;
        first_k = threadIdx.x / BM * A_VEC;
        live = maps.first + m < maps.end;
        row = w + (size_t)(live ? maps.first + m : maps.first) * KDIM + first_k;
    }

    __device__ __forceinline__ void copy(float* As, const float* __restrict__ w, int k0) const
    {
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
            const int k = k0 + first_k + i * K_STEP;
            const bool inside = live && k < KDIM;
            const float* from = inside ? row + k0 + i * K_STEP : w;
            float* to = As + A_AT(threadIdx.x % BM, first_k + i * K_STEP);
#if A_VEC == 4
            copy_async16(to, from, inside);
#else
            copy_async4(to, from, inside);
#endif
        }
    }
};

// This thread's image copies: one column of the tile (Columns), rows first_row, first_row + 2, ...;
// the window's origin in x is worked out once.
struct ImageCopies {
    const float* origin;  // x at (image, the group's channel 0, ih0, iw0); only tap offsets inside the image are added

    __device__ __forceinline__ ImageCopies(const float* __restrict__ x, const Columns& cols) : origin(x + cols.origin) {}

    __device__ __forceinline__ void copy(float* Bs, const float* __restrict__ x, const Columns& cols, int k0) const
    {
#pragma unroll
        for (int i = 0; i < Columns::ROWS; ++i) {
            const int row = cols.first_row + 2 * i;
            const int2 tap = tap_at(k0 + row);
            const bool valid = tap_inside(cols, tap);
            copy_async4(Bs + B_AT(row, cols.column), valid ? origin + tap.x : x, valid);
        }
    }
};

// The producers' part: copy slice j while slices j - LAG + 1 .. j - 1 are in flight, then apply
// the prologue to slice j - LAG and split it into the small buffer that slice j - LAG - 2 left.
__device__ __forceinline__ void produce(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ pro,
                                        float* stages, float* smalls, unsigned long long* full, unsigned long long* empty,
                                        const MapTile& maps, const SliceRun& run, int col0, int total, int x_image)
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGISTERS));
    const Columns cols(col0, total, maps.group, x_image);
    const WeightCopies weights(w, maps);
    const ImageCopies image(x, cols);
    for (int j = 0; j < run.count + LAG; ++j) {
        if (j < run.count) {
            float* stage = stages + j % STAGES * RAW;
            if (j >= STAGES) barrier_wait(empty + j % STAGES, j / STAGES - 1);  // slice j - STAGES is multiplied
            weights.copy(stage, w, (run.first + j) * BK);
            image.copy(stage + A_STAGE, x, cols, (run.first + j) * BK);
        }
        commit_copies();  // an empty group keeps the count of groups in step
        const int ready = j - LAG;
        if (ready < 0) continue;
        float* stage = stages + ready % STAGES * RAW;
        wait_copies<LAG>();  // this thread's copies of slice `ready` have landed
        prologue_b_slice(stage + A_STAGE, pro, cols, (run.first + ready) * BK);
        if (ready >= 2) barrier_wait(empty + (ready - 2) % STAGES, (ready - 2) / STAGES);  // its small buffer is free
        producers_sync();  // every producer's copies have landed, prologue applied
        split_slice(stage, smalls + ready % 2 * RAW);
        publish_to_async_proxy();
        barrier_arrive(full + ready % STAGES);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, 1)
conv_wgmma(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, const float* __restrict__ r,
           const float* __restrict__ pro, float* __restrict__ y, float* __restrict__ partial, int batch, int x_image)
{
    extern __shared__ float4 shared_tiles[];
    // the swizzle's atoms are 1024 bytes, aligned so; the launch gives 1024 bytes to spare
    const unsigned int misaligned = shared_address(shared_tiles) % 1024;
    float* stages = reinterpret_cast<float*>(reinterpret_cast<char*>(shared_tiles) + (misaligned ? 1024 - misaligned : 0));
    float* smalls = stages + STAGES * RAW;
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smalls + 2 * RAW);
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
        produce(x, w, pro, stages, smalls, full, empty, maps, run, col0, total, x_image);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGISTERS));
    float acc[ACC], part[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
    for (int i = 0; i < run.count; ++i) {
        barrier_wait(full + i % STAGES, i / STAGES);
        issue_slice(part, stages + i % STAGES * RAW, smalls + i % 2 * RAW);
        wgmma_wait<0>();
        barrier_arrive(empty + i % STAGES);
        add_part(acc, part);
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
                if (m < maps.end) store_sum(y, partial, b, r, total, col, m, acc[4 * j + 2 * upper + q]);
            }
        }
    }
}
