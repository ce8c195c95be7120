// A starter Relu kernel for opplugin: one thread per element.
//
// Run it:   opplugin check MODEL --kernel Relu=THIS_FILE.cu
//
// THE CONTRACT
//
// Entry point: the runner launches, for every Relu node of the model,
//
//     extern "C" __global__ void relu(const float* x, float* y, int batch)
//
//   x, y   the input and the output, each batch * N_PER_IMAGE floats; every element of y must be written
//   batch  images in this call (everything else is a macro)
//
// Macros, defined for each node: N_PER_IMAGE (elements of one image), BLOCK, OUTPUTS_PER_THREAD.
// Directives ("// opplugin: key=value" lines): block=N, outputs_per_thread=N, grid=X, Y, Z
// (arithmetic on the macros and `batch`), as for the Conv starter (`opplugin new conv`).
// Rejecting a shape: `#error reject: <reason>` under an #if; that node stays in onnxruntime.
//
// Note: a Relu that has its own kernel is no longer fused into the Conv before it.
//
// opplugin: block=256

extern "C" __global__ void relu(const float* x, float* y, int batch)
{
    const long long index = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= (long long)batch * N_PER_IMAGE) return;
    const float v = x[index];
    y[index] = v < 0.0f ? 0.0f : v;  // NaN stays NaN, as in onnxruntime
}
