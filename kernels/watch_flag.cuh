// Raise a watched step's NaN/Inf flag (a byte the runtime zeroed; null: not watched) for the
// values a kernel stores. Kernels that do not carry NaN and Inf as onnxruntime does (3xTF32) are
// watched (runtime/exact.py); flagging as they store costs a compare per output, not a pass over them.
#ifndef OPPLUGIN_WATCH_FLAG_CUH
#define OPPLUGIN_WATCH_FLAG_CUH

__device__ __forceinline__ void flag_nonfinite(unsigned char* flag, float v)
{
    if (flag != nullptr && !isfinite(v)) *flag = 1;
}

__device__ __forceinline__ void flag_nonfinite2(unsigned char* flag, float2 v)
{
    if (flag != nullptr && !(isfinite(v.x) && isfinite(v.y))) *flag = 1;
}

__device__ __forceinline__ void flag_nonfinite4(unsigned char* flag, float4 v)
{
    if (flag != nullptr && !(isfinite(v.x) && isfinite(v.y) && isfinite(v.z) && isfinite(v.w))) *flag = 1;
}

#endif
