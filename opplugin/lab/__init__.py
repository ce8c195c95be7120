"""The kernel lab: measuring kernels, apart from the runtime that runs them.

trial        the one loop bench and tune share: build, screen for spills, run into a
             poisoned output, check against float64, time with CUDA events
format_bound the element bound a Conv computed in FP16 or BF16 is checked within
bench        `opplugin bench`: every family and the peers, with the roofline
cnn_layers   the Conv layers of real CNNs that `bench --suite cnn` times
bench_precision  the Conv suites in FP16 or BF16: each Conv's candidate, its bound, cuDNN's name
gemm_bench   `bench --suite gemm`: each Gemm family against cuBLAS
e2e          `bench --e2e`: whole models end to end beside their peers
e2e_torch    its PyTorch peers: eager, in one CUDA graph, torch.compile in one CUDA graph
e2e_onnxruntime  its onnxruntime CUDA peers, without and with the provider's CUDA graphs
e2e_table    its tables: the fastest peer, opplugin's ratio to it, the floor
model_floor  a whole model's FLOPs and bytes, and the floor they give on this device
tune         `opplugin tune`: every configuration of each Conv step, the fastest kept
user_trial   a --kernel file's Conv kernel through the trial, beside the families
peers        cuDNN through PyTorch, onnxruntime's CUDA provider
torch_precision  a PyTorch peer in a run's precision: TF32's switches, FP16/BF16 channels_last conversions
streams      one Conv host to host, serial and over several streams
scaling      `bench --scaling`: one batch split over 1 to N devices, images/s and efficiency
scaling_text its table and its picture
bench_text   the bench's tables
roofline     this device's measured copy bandwidth and FP32 rate
nvrtc_check  every Conv variant compiled without a GPU (opplugin.gpu.nvrtc), ptxas's figures

Nothing a run needs imports the lab (tests/test_layering.py): not the runtime, the ops,
the user kernels' run side, check, data or report.
"""
