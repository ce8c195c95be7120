// Helpers of the generated pointwise kernels (opplugin/ops/pointwise/codegen.py): loads that
// convert each stored type to the type computed in (float; bool for a Where's condition),
// stores that convert back, V neighbouring elements at a time, and the functions the op
// table's expressions call (opplugin/ops/pointwise/ops.py, and activation.cuh's table).
#include "activation.cuh"

// float16 as its bits: no cuda_fp16.h needed, so the source compiles offline as it is
struct opplugin_half { unsigned short bits; };

__device__ __forceinline__ float opplugin_to_compute(float v) { return v; }
__device__ __forceinline__ float opplugin_to_compute(double v) { return (float)v; }  // rounds to nearest
__device__ __forceinline__ bool opplugin_to_compute(bool v) { return v; }
__device__ __forceinline__ float opplugin_to_compute(opplugin_half v)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

__device__ __forceinline__ void opplugin_from_compute(float& out, float v) { out = v; }
__device__ __forceinline__ void opplugin_from_compute(double& out, float v) { out = v; }
__device__ __forceinline__ void opplugin_from_compute(opplugin_half& out, float v)
{
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out.bits) : "f"(v));
}

// a float16 node's result: its op in float, rounded to float16 (and back, to compute on)
__device__ __forceinline__ float opplugin_round_half(float v)
{
    opplugin_half h;
    opplugin_from_compute(h, v);
    return opplugin_to_compute(h);
}

// V neighbours along a contiguous innermost axis (16-byte aligned at V = 4: the host checks)
template <int V, typename R, typename T>
__device__ __forceinline__ void opplugin_load_row(R (&v)[V], const T* __restrict__ p)
{
#pragma unroll
    for (int l = 0; l < V; ++l)
        v[l] = opplugin_to_compute(p[l]);
}

template <>
__device__ __forceinline__ void opplugin_load_row<4, float, float>(float (&v)[4], const float* __restrict__ p)
{
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
}

// one element shared by the V neighbours (the innermost axis broadcasts)
template <int V, typename R, typename T>
__device__ __forceinline__ void opplugin_load_same(R (&v)[V], const T* __restrict__ p)
{
    const R x = opplugin_to_compute(p[0]);
#pragma unroll
    for (int l = 0; l < V; ++l)
        v[l] = x;
}

template <int V, typename T>
__device__ __forceinline__ void opplugin_store_row(T* __restrict__ p, const float (&v)[V])
{
#pragma unroll
    for (int l = 0; l < V; ++l)
        opplugin_from_compute(p[l], v[l]);
}

template <>
__device__ __forceinline__ void opplugin_store_row<4, float>(float* __restrict__ p, const float (&v)[4])
{
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// an output that broadcasts along the innermost axis: the first of the V neighbours writes it
template <int V, typename T>
__device__ __forceinline__ void opplugin_store_first(T* __restrict__ p, const float (&v)[V])
{
    opplugin_from_compute(p[0], v[0]);
}

// min and max that propagate NaN from either side, as onnxruntime's Min and Max do
__device__ __forceinline__ float opplugin_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ float opplugin_max(float a, float b) { return (a > b || a != a) ? a : b; }

// log(1 + e^v) without overflow: log1p(e^-|v|) + max(v, 0), NaN kept
__device__ __forceinline__ float opplugin_softplus(float v)
{
    return log1pf(expf(-fabsf(v))) + (v > 0.0f ? v : (v != v ? v : 0.0f));
}
