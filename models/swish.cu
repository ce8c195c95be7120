// example.ops::Swish in CUDA C: y = x * sigmoid(beta * x), one thread per element.
// opplugin compiles it per node with the node's shapes and attributes as macros:
// X_SIZE (elements of X at the call's batch), ATTR_BETA (the node's beta), ...
// opplugin: block=256
extern "C" __global__ void swish(const float* x, float* y, int batch) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)X_SIZE) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-ATTR_BETA * v));
    }
}
