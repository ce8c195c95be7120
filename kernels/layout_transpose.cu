// Transpose where the input's innermost axis moves (NCHW -> NHWC, a matrix transpose): a
// 32 x 32 tile through shared memory, so that both the reads (along the input's innermost
// axis) and the writes (along the output's innermost axis, input axis P) are coalesced.
// The other axes (OTHERS of them, in input order) are walked by blockIdx.y: their extents
// OTHER_DIMS (the first one's unused: it takes what `others` leaves, so the batch stays a
// run-time argument), their strides in the input and in the output. IN_STRIDE_P and
// OUT_STRIDE_P, IN_STRIDE_LAST (1 for a contiguous input) and OUT_STRIDE_LAST are the
// strides of the two tiled axes; the output strides are the output array's own, so it
// may be a view into a larger buffer. EXTENT_P and EXTENT_LAST are the tiled extents.
#define TILE 32
#define ROWS 8

#if OTHERS > 0
constexpr long long other_dims[OTHERS] = {OTHER_DIMS};
constexpr long long other_in[OTHERS] = {OTHER_IN_STRIDES};
constexpr long long other_out[OTHERS] = {OTHER_OUT_STRIDES};
#endif

extern "C" __global__ void __launch_bounds__(TILE * ROWS) layout_transpose(const float* __restrict__ in, float* __restrict__ out,
                                                                           long long extent_p, long long others)
{
    __shared__ float tile[TILE][TILE + 1];  // +1: the column reads hit 32 different banks
    const long long tiles_last = (EXTENT_LAST + TILE - 1) / TILE;
    const long long p0 = (blockIdx.x / tiles_last) * TILE, l0 = (blockIdx.x % tiles_last) * TILE;
    for (long long z = blockIdx.y; z < others; z += gridDim.y) {
        long long src = 0, dst = 0;
#if OTHERS > 0
        long long rest = z;
#pragma unroll
        for (int d = OTHERS - 1; d > 0; --d) {
            const long long c = rest % other_dims[d];
            rest /= other_dims[d];
            src += c * other_in[d];
            dst += c * other_out[d];
        }
        src += rest * other_in[0];
        dst += rest * other_out[0];
#endif
#pragma unroll
        for (int k = 0; k < TILE; k += ROWS) {
            const long long p = p0 + threadIdx.y + k, l = l0 + threadIdx.x;
            if (p < extent_p && l < EXTENT_LAST)
                tile[threadIdx.y + k][threadIdx.x] = __ldg(in + src + p * IN_STRIDE_P + l * IN_STRIDE_LAST);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; k += ROWS) {
            const long long l = l0 + threadIdx.y + k, p = p0 + threadIdx.x;
            if (p < extent_p && l < EXTENT_LAST)
                out[dst + l * OUT_STRIDE_LAST + p * OUT_STRIDE_P] = tile[threadIdx.x][threadIdx.y + k];
        }
        __syncthreads();  // the tile is refilled for the next z
    }
}
