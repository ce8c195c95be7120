// cp.async (sm_80+): copies from global to shared memory that bypass the registers, so a
// kernel can stage the next slices of its operands while it multiplies the current one.
// A copy whose `valid` is false writes zeros and reads nothing: tile edges cost no branch.
#ifndef OPPLUGIN_ASYNC_COPY_CUH
#define OPPLUGIN_ASYNC_COPY_CUH

__device__ __forceinline__ void copy_async4(float* shared, const float* global, bool valid)
{
    const unsigned int to = (unsigned int)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(global), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void copy_async16(float* shared, const float* global, bool valid)
{
    const unsigned int to = (unsigned int)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(global), "r"(valid ? 16 : 0));
}

// 16 bytes of which the first `bytes` (0 to 16, a multiple of 4) are read and the rest zero-filled:
// a vector copy at a tile's edge, where a row ends inside the four floats
__device__ __forceinline__ void copy_async16_part(float* shared, const float* global, int bytes)
{
    const unsigned int to = (unsigned int)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(global), "r"(bytes));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }

// wait until at most PENDING of this thread's committed groups are still in flight
template <int PENDING>
__device__ __forceinline__ void wait_copies()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

#endif
