"""The CUDA toolchain: the device, NVRTC compiles, the kernel cache, parallel compiles, recorded launches."""
