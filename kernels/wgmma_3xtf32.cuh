// What the Hopper 3xTF32 GEMMs (conv_wgmma, gemm_wgmma) share: wgmma on operands in shared memory,
// fed by producer warpgroups through an mbarrier per stage (sm_90a alone).
//
// A block multiplies X_ROWS data rows (64 a consumer warpgroup: wgmma's M) by W_ROWS weight rows
// (wgmma's N: 64 or 128; also 8, 16, 24 or 32, a narrow map tile) over K, in BK = 32 deep slices:
// - producers (the first NTHREADS threads) copy each slice's operands with 16-byte cp.async and
//   hand the stage over through its `full` mbarrier (produce_slices, with the includer's copies);
// - consumers (the other NTHREADS) issue the slice's 12 wgmmas, wait, release the stage through
//   its `empty` mbarrier, and add the slice's sums to their running sums (consume_slices).
// setmaxnreg moves registers from the producers, who need few, to the consumers' accumulators.
//
// Arithmetic (3xTF32): each operand a = big + small. The tensor core reads an FP32 value as TF32 by
// dropping its low 13 bits, so the raw value is its own big part, and small = a - (a with those bits
// cleared), exact in FP32 (truncated to TF32 in turn): the operands arrive as values and small parts
// side by side. Per k8 step, small*big, big*small and big*big go into `part`, the sum of a pair of
// slices, which is added to the running sum with a rounded FP32 add: a long K of truncating
// tensor-core adds would drift.
//
// Shared memory: STAGES stages, each the W_ROWS x BK weights, their small parts, the X_ROWS x BK data
// values and theirs, all K-major in wgmma's 128-byte swizzle: a row's 32 k are one 128-byte line, its
// 16-byte quads permuted by row % 8, so that the tensor cores' reads of 8 rows at one k quad, and the
// copies' writes of a row's 8 quads, spread over the banks. Then a `full` and an `empty` mbarrier per
// stage. Copies run LAG = STAGES - 1 slices ahead of the one being multiplied.
//
// Accumulators (lane = 4*g + t; consumer warp w owns data rows 16w..16w+15): those of n8 block j are
// d[4j..4j+3] = [g][8j+2t], [g][8j+2t+1], [g+8][8j+2t], [g+8][8j+2t+1], for every N (W_ROWS / 8 blocks: PTX ISA,
// "Matrix Fragments for wgmma.mma_async.m64nNk16", accumulator D: N/2 registers a thread, d0..dN/2-1).
//
// With HALF_OPERANDS (1: FP16, 2: BF16) the operands arrive in that format, two bytes a
// value: a 128-byte line holds BK = 64 of them, one wgmma m64nNk16 per k16 step multiplies them with FP32
// accumulation, and there are no small parts (the stage is the weights and the data values alone) and no
// separate sums: the wgmmas add onto the running sums themselves. The swizzle, the descriptors and the
// accumulators' layout are the same in bytes.
//
// The includer defines W_ROWS, X_ROWS, BK and STAGES.
#ifndef OPPLUGIN_WGMMA_3XTF32_CUH
#define OPPLUGIN_WGMMA_3XTF32_CUH

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma needs sm_90a; the mma.sync kernels run on other GPUs"
#endif

#include "async_copy.cuh"
#include "tf32_small_part.cuh"

#define NTHREADS (X_ROWS * 2)       // producers; as many consumers: a warpgroup per 64 data rows
#define BLOCK_THREADS (2 * NTHREADS)
#define ACC (W_ROWS / 2)            // accumulators a consumer thread: 64 x W_ROWS over a warpgroup's 128 threads
// setmaxnreg: a producer and consumer pair may hold the 512 registers the register file gives two
// threads of a 256-thread block, the 256 of a 512-thread one
#if BLOCK_THREADS <= 256
#define PRODUCER_REGISTERS 168
#define CONSUMER_REGISTERS 232
#else
#define PRODUCER_REGISTERS 56
#define CONSUMER_REGISTERS 200
#endif
#ifdef HALF_OPERANDS
typedef unsigned short operand_t;  // an FP16 or BF16 value's bits
#define PARTS 1                    // each operand as it is
#define K_STEP 16                  // the k of one wgmma
#else
typedef float operand_t;
#define PARTS 2  // each operand and its small part
#define K_STEP 8
#endif
#if HALF_OPERANDS == 2
#define WGMMA_SHAPE "k16.f32.bf16.bf16"
#elif defined(HALF_OPERANDS)
#define WGMMA_SHAPE "k16.f32.f16.f16"
#else
#define WGMMA_SHAPE "k8.f32.tf32.tf32"
#endif
#ifdef HALF_OPERANDS
#define WGMMA_TRANSPOSES ", 0, 0"  // both operands K-major (TF32's wgmma takes no such operands)
#else
#define WGMMA_TRANSPOSES ""
#endif
#define QUAD_VALUES (16 / (int)sizeof(operand_t))  // values in a 16-byte quad: 4 floats, 8 halves
#define A_STAGE (W_ROWS * BK)
#define B_STAGE (X_ROWS * BK)
#define STAGE (PARTS * (A_STAGE + B_STAGE))  // a slice: weights, (their small parts,) data values(, theirs)
#define LAG (STAGES - 1)                     // slices copied ahead of the one being multiplied
#define QUADS (BK / QUAD_VALUES)             // 16-byte copies a row of a slice
// value (row, k) of a K-major operand in wgmma's 128-byte swizzle: a row's BK values are one 128-byte
// line, its 16-byte quad q stored at quad q ^ (row % 8)
#define SWIZZLED_AT(row, k) ((row) * BK + ((((k) / QUAD_VALUES) ^ ((row) % 8)) * QUAD_VALUES) + (k) % QUAD_VALUES)

static_assert(W_ROWS == 64 || W_ROWS == 128 || (W_ROWS % 8 == 0 && W_ROWS <= 32), "a wgmma's N: 8 to 32, 64 or 128 weight rows");
static_assert(X_ROWS % 64 == 0 && BK * sizeof(operand_t) == 128, "64 data rows a warpgroup, a row's slice one 128-byte line");
static_assert(STAGES >= 2, "a slice in flight while one is multiplied");


// The descriptor of a K-major operand in the 128-byte swizzle whose k8 step starts at `tile`: the
// operand's rows in whole 1024-byte atoms of 8, the step 32 bytes into its lines; 8-row groups 1024
// bytes apart (stride); the leading offset unused (a row's k fit one line). This is the PTX ISA's canonical
// K-major 128-byte swizzled layout, ((8,m),(T,2k)):((8T,SBO),(1,T)), m = rows / 8, for any N: a narrow weight
// tile of 8 to 32 rows is 1 to 4 atoms. Base offset 0: each operand starts on a 1024-byte boundary (the stages
// are aligned, and W_ROWS * 128 bytes of weights, a multiple of 1024, come before the data rows).
__device__ __forceinline__ unsigned long long descriptor(const operand_t* tile)
{
    const unsigned long long at = (unsigned int)__cvta_generic_to_shared(tile);
    constexpr unsigned long long LEADING = 16, STRIDE = 1024, SWIZZLE_128B = 1;
    return ((at & 0x3FFFF) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32) | (SWIZZLE_128B << 62);
}

// A 16-byte quad of operand values into a stage (zeros where not `valid`); copy_async16 moves bytes, typed as floats
__device__ __forceinline__ void copy_quad(operand_t* to, const operand_t* from, bool valid)
{
    copy_async16(reinterpret_cast<float*>(to), reinterpret_cast<const float*>(from), valid);
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

// d (+)= a x b: a the warpgroup's 64 x 8 data rows, b the W_ROWS x 8 weights, both behind
// descriptors; `accumulate` 0 overwrites d.
__device__ __forceinline__ void wgmma_n64(float (&d)[32], unsigned long long a, unsigned long long b, int accumulate)
{
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64" WGMMA_SHAPE " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
        " %32, %33, p, 1, 1" WGMMA_TRANSPOSES ";\n}\n"
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
        "wgmma.mma_async.sync.aligned.m64n128" WGMMA_SHAPE " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
        " %64, %65, p, 1, 1" WGMMA_TRANSPOSES ";\n}\n"
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

// The narrow tiles' wgmma_n8 .. wgmma_n32, made by one macro: the N/2 accumulators are the asm's operands %0 ..
// %(N/2 - 1), listed an n8 block (four) at a time; the descriptors and the accumulate flag follow them as
// operands A, B and P (their numbers, spelled out: the asm string takes them as text).
#define WGMMA_REGISTERS_8 "%0, %1, %2, %3"
#define WGMMA_REGISTERS_16 WGMMA_REGISTERS_8 ", %4, %5, %6, %7"
#define WGMMA_REGISTERS_24 WGMMA_REGISTERS_16 ", %8, %9, %10, %11"
#define WGMMA_REGISTERS_32 WGMMA_REGISTERS_24 ", %12, %13, %14, %15"
#define WGMMA_BLOCK(j) "+f"(d[4 * (j)]), "+f"(d[4 * (j) + 1]), "+f"(d[4 * (j) + 2]), "+f"(d[4 * (j) + 3])
#define WGMMA_OPERANDS_8 WGMMA_BLOCK(0)
#define WGMMA_OPERANDS_16 WGMMA_OPERANDS_8, WGMMA_BLOCK(1)
#define WGMMA_OPERANDS_24 WGMMA_OPERANDS_16, WGMMA_BLOCK(2)
#define WGMMA_OPERANDS_32 WGMMA_OPERANDS_24, WGMMA_BLOCK(3)
#define WGMMA_NARROW(N, A, B, P)                                                                                          \
    __device__ __forceinline__ void wgmma_n##N(float (&d)[N / 2], unsigned long long a, unsigned long long b, int accumulate) \
    {                                                                                                                     \
        static_assert(A == N / 2 && B == A + 1 && P == B + 1, "the operands after the accumulators");                    \
        asm volatile("{\n.reg .pred p;\n"                                                                                 \
                     "setp.ne.b32 p, %" #P ", 0;\n"                                                                       \
                     "wgmma.mma_async.sync.aligned.m64n" #N WGMMA_SHAPE " {" WGMMA_REGISTERS_##N "}, %" #A ", %" #B        \
                     ", p, 1, 1" WGMMA_TRANSPOSES ";\n}\n"                                                                 \
                     : WGMMA_OPERANDS_##N                                                                                 \
                     : "l"(a), "l"(b), "r"(accumulate));                                                                  \
    }
WGMMA_NARROW(8, 4, 5, 6)
WGMMA_NARROW(16, 8, 9, 10)
WGMMA_NARROW(24, 12, 13, 14)
WGMMA_NARROW(32, 16, 17, 18)

#define WGMMA_OF_(n) wgmma_n##n
#define WGMMA_OF(n) WGMMA_OF_(n)  // wgmma_n<n> of n's value (W_ROWS: the includer's BM or BN)

__device__ __forceinline__ void wgmma_tile(float (&d)[ACC], unsigned long long a, unsigned long long b, int accumulate)
{
    WGMMA_OF(W_ROWS)(d, a, b, accumulate);
}

// Issues part (+)= this consumer warpgroup's 64 data rows x W_ROWS weight rows of the slice at
// `stage` (`adds`: onto what part holds, else over it).
__device__ __forceinline__ void issue_slice(float (&part)[ACC], const operand_t* stage, bool adds)
{
    const int rows = (threadIdx.x - NTHREADS) / 128 * 64;  // the warpgroup's first row of the data tile
    const operand_t* data = stage + PARTS * A_STAGE + SWIZZLED_AT(rows, 0);
    pin(part);
    wgmma_fence();
#ifdef HALF_OPERANDS
#pragma unroll
    for (int kk = 0; kk < BK; kk += K_STEP)
        wgmma_tile(part, descriptor(data + SWIZZLED_AT(0, kk)), descriptor(stage + SWIZZLED_AT(0, kk)), adds || kk > 0);
#else
#pragma unroll
    for (int kk = 0; kk < BK; kk += K_STEP) {
        const unsigned long long w_big = descriptor(stage + SWIZZLED_AT(0, kk));
        const unsigned long long w_small = descriptor(stage + A_STAGE + SWIZZLED_AT(0, kk));
        const unsigned long long x_big = descriptor(data + SWIZZLED_AT(0, kk));
        const unsigned long long x_small = descriptor(data + B_STAGE + SWIZZLED_AT(0, kk));
        wgmma_tile(part, x_small, w_big, adds || kk > 0);
        wgmma_tile(part, x_big, w_small, 1);
        wgmma_tile(part, x_big, w_big, 1);
    }
#endif
    wgmma_commit();
}

__device__ __forceinline__ void add_part(float (&acc)[ACC], float (&part)[ACC])
{
    pin(part);
#pragma unroll
    for (int j = 0; j < ACC; ++j) acc[j] += part[j];
}

// The producers' part: hand slice j - LAG over once this thread's copies of it have landed (each
// producer arrives for its own), then copy slice j (copies.copy(stage, j)) while slices j - LAG + 1
// .. j - 1 are in flight. The hand-over comes first: the consumers may need that slice to release
// the stage slice j goes to. `before`: the slices this block's earlier tiles passed through the stages.
template <class Copies>
__device__ __forceinline__ void produce_slices(const Copies& copies, int count, operand_t* stages, unsigned long long* full,
                                               unsigned long long* empty, int before = 0)
{
    for (int j = 0; j < count + LAG; ++j) {
        const int ready = j - LAG;
        if (ready >= 0) {
            wait_copies<LAG - 1>();  // of the j groups committed, all but the newest LAG - 1: slice `ready`'s
            publish_to_async_proxy();
            barrier_arrive(full + (before + ready) % STAGES);
        }
        if (j < count) {
            const int at = before + j;  // the stages turn on across a persistent block's tiles
            if (at >= STAGES) barrier_wait(empty + at % STAGES, at / STAGES - 1);  // slice at - STAGES is multiplied
            copies.copy(stages + at % STAGES * STAGE, j);
        }
        commit_copies();  // an empty group keeps the count of groups in step
    }
}

// The consumers' part: acc = the sum over `count` slices. Slices go to part in pairs: the second's
// wgmmas are issued before the first's are waited for, so that the tensor cores have work across the
// turn; each stage is released as its wgmmas end. `before`: as produce_slices'.
__device__ __forceinline__ void consume_slices(float (&acc)[ACC], int count, operand_t* stages, unsigned long long* full,
                                               unsigned long long* empty, int before = 0)
{
#ifdef HALF_OPERANDS
    // FP16 and BF16 products accumulate in FP32 in the tensor cores themselves: no separate sums, and each
    // slice's wgmmas stay queued behind the next one's, a stage released as soon as its wgmmas end
    if (count <= 0) {  // a K split's last run that K does not reach adds nothing
#pragma unroll
        for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
        return;
    }
    for (int i = 0; i < count; ++i) {
        const int at = before + i;
        barrier_wait(full + at % STAGES, at / STAGES);
        issue_slice(acc, stages + at % STAGES * STAGE, i > 0);
        wgmma_wait<1>();
        if (i > 0) barrier_arrive(empty + (at - 1) % STAGES);
    }
    wgmma_wait<0>();
    barrier_arrive(empty + (before + count - 1) % STAGES);
    pin(acc);
#else
    float part[ACC];
#pragma unroll
    for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
    for (int i = 0; i < count; ++i) {
        const bool opens = i % 2 == 0;  // a pair's first slice
        const int at = before + i;
        barrier_wait(full + at % STAGES, at / STAGES);
        issue_slice(part, stages + at % STAGES * STAGE, !opens);
        if (!opens) {
            wgmma_wait<1>();
            barrier_arrive(empty + (at - 1) % STAGES);
        }
        if (!opens || i == count - 1) {
            wgmma_wait<0>();
            barrier_arrive(empty + at % STAGES);
            add_part(acc, part);
        }
    }
#endif
}

// The stages in dynamic shared memory, aligned to the swizzle's 1024-byte atoms (the launch gives
// 1024 bytes to spare), then the mbarriers, initialised; every thread of the block calls it.
__device__ __forceinline__ operand_t* stage_memory(float4* shared_tiles, unsigned long long*& full, unsigned long long*& empty)
{
    const unsigned int misaligned = shared_address(shared_tiles) % 1024;
    operand_t* stages = reinterpret_cast<operand_t*>(reinterpret_cast<char*>(shared_tiles) + (misaligned ? 1024 - misaligned : 0));
    full = reinterpret_cast<unsigned long long*>(stages + STAGES * STAGE);
    empty = full + STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            barrier_init(full + s, NTHREADS);
            barrier_init(empty + s, NTHREADS);
        }
    }
    __syncthreads();
    return stages;
}

#endif
