// A strided copy, the one kernel behind Slice, Split, Transpose (where the innermost axis
// stays innermost) and the copies that cannot be views: for every coordinate c of the
// output's RANK axes, out[sum c_d * DST_STRIDES[d]] = in[SRC_BASE + sum c_d * SRC_STRIDES[d]].
// The strides are in elements (a negative one walks an axis backward: Slice with step < 0);
// DST_STRIDES are the output array's own, so the output may be a view into a larger buffer.
// OUT_DIMS gives the extent of axes 1..RANK-1 (the entry of axis 0 is unused: axis 0 takes
// what `total` leaves, so the batch stays a run-time argument). INDEX is int where every
// offset fits in 31 bits (cheaper division by the constant extents), else long long.
#ifndef INDEX
#define INDEX long long
#endif

constexpr int rank = RANK;
constexpr INDEX out_dims[RANK] = {OUT_DIMS};
constexpr INDEX src_strides[RANK] = {SRC_STRIDES};
constexpr INDEX dst_strides[RANK] = {DST_STRIDES};

extern "C" __global__ void __launch_bounds__(256) layout_gather(const float* __restrict__ in, float* __restrict__ out, long long total)
{
    const long long i = blockIdx.x * 256LL + threadIdx.x;
    if (i >= total) return;
    INDEX rest = (INDEX)i, src = SRC_BASE, dst = 0;
#pragma unroll
    for (int d = rank - 1; d > 0; --d) {
        const INDEX c = rest % out_dims[d];
        rest /= out_dims[d];
        src += c * src_strides[d];
        dst += c * dst_strides[d];
    }
    out[dst + rest * dst_strides[0]] = __ldg(in + src + rest * src_strides[0]);
}
