"""The built-in ops, one folder each: ONNX semantics, numpy reference, epilogue,
variant choice and CUDA families (their sources are in the top-level kernels/)."""
