// Pad (ONNX modes constant, reflect, edge): for every output coordinate c, each axis d reads
// input coordinate c_d - BEGINS[d]; outside [0, IN_DIMS[d]) a constant pad writes VALUE,
// reflect mirrors about the edge (without repeating it), edge repeats the edge element.
// Strides in elements; DST_STRIDES are the output array's own (it may be a view).
// OUT_DIMS' entry of axis 0 is unused (axis 0 takes what `total` leaves); IN_DIMS' entry
// of axis 0 is read only where axis 0 is padded (PAD_AXIS0 1), so the batch stays a run-time argument.
#define MODE_CONSTANT 0
#define MODE_REFLECT 1
#define MODE_EDGE 2

constexpr int rank = RANK;
constexpr long long out_dims[RANK] = {OUT_DIMS};
constexpr long long in_dims[RANK] = {IN_DIMS};
constexpr long long begins[RANK] = {BEGINS};
constexpr long long src_strides[RANK] = {SRC_STRIDES};
constexpr long long dst_strides[RANK] = {DST_STRIDES};

extern "C" __global__ void __launch_bounds__(256) layout_pad(const float* __restrict__ in, float* __restrict__ out, long long total)
{
    const long long i = blockIdx.x * 256LL + threadIdx.x;
    if (i >= total) return;
    long long rest = i, src = 0, dst = 0;
    bool inside = true;
#pragma unroll
    for (int d = rank - 1; d >= 0; --d) {
        const long long c = d > 0 ? rest % out_dims[d] : rest;
        if (d > 0) rest /= out_dims[d];
        dst += c * dst_strides[d];
        long long s = c - begins[d];
        if ((d > 0 || PAD_AXIS0) && (s < 0 || s >= in_dims[d])) {
#if MODE == MODE_REFLECT
            s = s < 0 ? -s : 2 * (in_dims[d] - 1) - s;
#elif MODE == MODE_EDGE
            s = s < 0 ? 0 : in_dims[d] - 1;
#else
            inside = false;
#endif
        }
        src += s * src_strides[d];
    }
    out[dst] = inside ? __ldg(in + src) : VALUE;
}
