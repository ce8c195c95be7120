// What pool.cu and pool_channel_last.cu do alike: a max that keeps NaN, how values combine, the window's
// elements in order, and the count an average divides a window's sum by. The window's macros (KH, KW, DH,
// DW, PT, PL, H, W, PH_END, PW_END, COUNT_INCLUDE_PAD) come from opplugin/ops/pool/kernel.py.
#ifndef OPPLUGIN_POOL_WINDOW_CUH
#define OPPLUGIN_POOL_WINDOW_CUH

#define NEG_INF __int_as_float(0xff800000)

// m, with a NaN in v or m kept
__device__ __forceinline__ float nan_max(float m, float v)
{
    return (v > m || v != v) ? v : m;
}

// what the pool makes of two values (IS_MAX: the max, else their sum)
__device__ __forceinline__ float combine(float a, float b)
{
#if IS_MAX
    return nan_max(a, b);
#else
    return a + b;
#endif
}

#ifdef KH

// f(r, c) for each element of the window from (row0, col0) that lies in the input: rows, then columns (the
// order of an average's adds), the loops unrolled by the window's macros
template <typename F>
__device__ __forceinline__ void for_each_in_window(int row0, int col0, F f)
{
#pragma unroll
    for (int i = 0; i < KH; ++i) {
        const int r = row0 + i * DH;
        if (r < 0 || r >= H)
            continue;
#pragma unroll
        for (int j = 0; j < KW; ++j) {
            const int c = col0 + j * DW;
            if (c < 0 || c >= W)
                continue;
            f(r, c);
        }
    }
}

// The elements that count in the window from (row0, col0): the window clipped to the input, or with
// count_include_pad to the input and its pads (never ceil_mode's overhang)
__device__ __forceinline__ int window_count(int row0, int col0)
{
#if COUNT_INCLUDE_PAD
    const int lo_r = max(row0, -PT), lo_c = max(col0, -PL);
    const int hi_r = PH_END, hi_c = PW_END;
#else
    const int lo_r = max(row0, 0), lo_c = max(col0, 0);
    const int hi_r = H, hi_c = W;
#endif
    // rows row0 + i*DH (and columns likewise) that lie in [lo, hi)
    int rows = 0, cols = 0;
#pragma unroll
    for (int i = 0; i < KH; ++i)
        rows += (row0 + i * DH >= lo_r && row0 + i * DH < hi_r);
#pragma unroll
    for (int j = 0; j < KW; ++j)
        cols += (col0 + j * DW >= lo_c && col0 + j * DW < hi_c);
    return rows * cols;
}

#endif  // KH

#endif
