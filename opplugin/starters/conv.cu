// A starter Conv kernel for opplugin: one thread per output element.
//
// Run it:   opplugin check lenet86 --kernel Conv=THIS_FILE.cu
//           opplugin run   lenet86 --kernel Conv=THIS_FILE.cu
//           opplugin bench --kernel Conv=THIS_FILE.cu
//
// THE CONTRACT
//
// Entry point: the runner launches, for every Conv node of the model,
//
//     extern "C" __global__ void conv(const float* x, const float* w, const float* b, float* y, int batch)
//
//   x  the input,    [batch][C][H][W]
//   w  the weights,  [M][C/G][KH][KW]
//   b  the bias,     [M] (when HAS_BIAS is 1; otherwise the pointer is w again and must not be read)
//   y  the output,   [batch][M][POH][POW]; every element must be written
//   batch  images in this call (it changes from call to call; everything else is a macro)
//
// Macros, defined for each node before this file is compiled (NVRTC, one module per node):
//   C, M, G            input channels, output maps, groups
//   H, W, OH, OW       input and output height and width
//   KH, KW             filter height and width
//   SH, SW             strides;   PH, PW  pads at the top and left;   DH, DW  dilations
//   HAS_BIAS           1 when the node has a bias
//   PADDED             1 when any pad is not 0 (without pads no bounds test is needed)
//   POH, POW           the size written: OH, OW unless the kernel fuses a max pool (below)
//   ACT, PKH, PKW      the fused epilogue: activation (0 none, 1 Relu, 2 Tanh), max pool window
//   BLOCK              threads per block (the `block` directive)
//   OUTPUTS_PER_THREAD the `outputs_per_thread` directive
//
// Directives: comment lines starting with "// opplugin:" (the runner reads them, NVRTC ignores them).
//   weights=constant   the runner declares __constant__ float W_CONST[M*(C/G)*KH*KW] and B_CONST[M]
//                      and uploads the node's weights into them; read those instead of w and b.
//                      Default (weights=pointer): read w and b from global memory.
//   block=N            threads per block (default 256)
//   outputs_per_thread=N   the grid gets one thread per N output elements (default 1)
//   grid=X, Y, Z       the grid itself, as arithmetic on the macros and `batch`, e.g.
//                      grid=cdiv(OW, 16), cdiv(OH, 16), batch * M   (cdiv rounds up)
//   fuses=epilogue     this kernel applies ACT and the PKH x PKW max pool itself; otherwise
//                      (the default) the runner applies them as a separate step, and `plan` says so.
//                      A fused residual Add or another activation always runs as that separate step.
//
// Rejecting a shape: a shape this kernel cannot run falls back to opplugin's built-in choice
// when the source stops with an #error whose text starts with "reject:", e.g.
//     #if KH != KW
//     #error reject: square filters only
//     #endif
// The reason shows in `opplugin plan`.
//
// opplugin: block=256

#if G != 1
#error reject: grouped convolution is not handled by this starter
#endif

extern "C" __global__ void conv(const float* x, const float* w, const float* b, float* y, int batch)
{
    // one thread per output element, in the order of y: [n][m][oh][ow]
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (long long)batch * M * OH * OW) return;
    const int ow = index % OW;
    const int oh = (index / OW) % OH;
    const int m = (index / (OW * OH)) % M;
    const int n = index / ((long long)OW * OH * M);

    float acc = 0.0f;
    for (int c = 0; c < C; ++c) {
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = oh * SH - PH + kh * DH;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = ow * SW - PW + kw * DW;
                if (iw < 0 || iw >= W) continue;
                acc += x[(((long long)n * C + c) * H + ih) * W + iw] * w[((m * C + c) * KH + kh) * KW + kw];
            }
        }
    }
#if HAS_BIAS
    acc += b[m];
#endif
    y[index] = acc;
}
