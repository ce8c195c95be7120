// An FP32 value's small part for the wgmma 3xTF32 kernels: the value less the TF32 bits the tensor
// core keeps of it (the top 19), exact in FP32. The big part is the value itself, which wgmma truncates.
#ifndef OPPLUGIN_TF32_SMALL_PART_CUH
#define OPPLUGIN_TF32_SMALL_PART_CUH

__device__ __forceinline__ float small_part(float v) { return v - __uint_as_float(__float_as_uint(v) & 0xffffe000u); }

#endif
