// NaN and Inf flags for the runtime's exact path (opplugin/runtime/nonfinite.py): one launch per
// watched float32 output. Every thread that meets a NaN or an Inf sets the flag byte (cleared just
// before on the same stream); the same value from many threads is no race.
extern "C" __global__ void opplugin_flag_nonfinite(const float* __restrict__ x, long long n, unsigned char* flag)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        if (!isfinite(x[i])) {
            *flag = 1;
            return;
        }
    }
}
