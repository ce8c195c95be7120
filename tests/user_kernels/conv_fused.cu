// The tutorial's faster Conv: one thread per pooled output pixel of one image, computing
// every output map of it, so that each input value it loads feeds M multiply-adds (the
// starter loads one per multiply-add); the weights sit in __constant__ memory, where the
// unrolled loops address them with constants; and the Relu/Tanh and max pool after the Conv
// are fused in, so each thread writes M pooled values and nothing else.
//
// opplugin: weights=constant
// opplugin: fuses=epilogue
// opplugin: block=128
// opplugin: grid=cdiv(batch * POH * POW, BLOCK)

#if G != 1
#error reject: grouped convolution is not handled by this kernel
#endif
#if M > 64
#error reject: more than 64 output maps would not fit in registers
#endif

extern "C" __global__ void conv(const float* x, const float* w, const float* b, float* y, int batch)
{
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // over batch * POH * POW
    if (index >= (long long)batch * POH * POW) return;
    const int pw = index % POW;
    const int ph = (index / POW) % POH;
    const long long n = index / (POW * POH);
    const float* image = x + n * (C * H * W);

    float best[M];
#pragma unroll
    for (int m = 0; m < M; ++m) best[m] = __int_as_float(0xff800000);  // -inf
    for (int i = 0; i < PKH; ++i) {
        for (int j = 0; j < PKW; ++j) {
            const int oh = ph * PKH + i, ow = pw * PKW + j;
            float acc[M];
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m] = HAS_BIAS ? B_CONST[m] : 0.0f;
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int kh = 0; kh < KH; ++kh) {
                    const int ih = oh * SH - PH + kh * DH;
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw) {
                        const int iw = ow * SW - PW + kw * DW;
#if PADDED
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
#endif
                        const float v = image[(c * H + ih) * W + iw];
#pragma unroll
                        for (int m = 0; m < M; ++m) acc[m] += v * W_CONST[((m * C + c) * KH + kh) * KW + kw];
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < M; ++m) best[m] = (acc[m] > best[m] || acc[m] != acc[m]) ? acc[m] : best[m];  // NaN wins
        }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float v = best[m];
#if ACT == 1
        v = v < 0.0f ? 0.0f : v;
#elif ACT == 2
        v = tanhf(v);
#endif
        y[((n * M + m) * POH + ph) * POW + pw] = v;
    }
}
