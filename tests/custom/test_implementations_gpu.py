"""Each kind of custom-op kernel on the GPU, against the op's float64 reference on fresh random
inputs with its outputs poisoned first, at the plan's batch and at a smaller chunk: a CUDA C file
and text, a CuPy function, ElementwiseKernel and RawKernel, an autotuned Triton kernel (each
configuration); the shipped example model checked with each, its custom steps inside the CUDA
graphs; and every broken kernel one line."""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from custom_models import swish_node, swish_op
from opplugin.custom import CudaSource, CuPy, DeclarationError, Triton
from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.user_kernels.source import UserKernelError
from opplugin.verify.check import check

pytestmark = pytest.mark.gpu
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
                                  reason="Triton and torch are not installed")


def example_ops():
    path = Path(__file__).resolve().parents[2] / "models" / "lenet86_swish_ops.py"
    spec = importlib.util.spec_from_file_location("lenet86_swish_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def against_reference(op, variant, shape=(6, 8, 12, 12), chunk=None, beta=2.5):
    """The largest difference from the reference of the variant's outputs (poisoned first) on a
    node planned at `shape`, called on `chunk` images of it (all of them where None)."""
    import cupy

    device = select_device("cuda")
    info = swish_node(op, shape[0], shape[1:], beta)
    rows = shape[0] if chunk is None else chunk
    x = np.random.default_rng(7).standard_normal((rows, *shape[1:])).astype(np.float32) * 3
    kernel = op.poisoned().build(info, device, variant)
    [y] = kernel([cupy.asarray(x)], None)
    [want] = op.call_reference("swish", [x], info.spec)
    assert y.shape == want.shape and y.dtype == np.float32
    return np.abs(cupy.asnumpy(y).astype(np.float64) - want).max()


CUDA_SWISH = '''extern "C" __global__ void swish2(const float* x, float* y, int batch) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < X_SIZE) y[i] = x[i] / (1.0f + expf(-ATTR_BETA * x[i]));
}
'''


def test_a_cuda_file_matches_the_reference(tmp_path):
    op = swish_op()
    (tmp_path / "swish.cu").write_text(CUDA_SWISH)
    op.implement(CudaSource(tmp_path / "swish.cu"))
    assert against_reference(op, "cuda:swish.cu") < 1e-5 and against_reference(op, "cuda:swish.cu", chunk=2) < 1e-5


def test_a_cuda_text_with_several_outputs_a_thread_and_its_own_grid_matches_the_reference():
    four = """extern "C" __global__ void swish2(const float* x, float* y, int batch) {
        long long first = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * BLOCK * OUTPUTS_PER_THREAD + threadIdx.x;
        for (int k = 0; k < OUTPUTS_PER_THREAD; ++k) {
            long long i = first + (long long)k * BLOCK;
            if (i < X_SIZE) y[i] = x[i] / (1.0f + expf(-ATTR_BETA * x[i]));
        }
    }
    """
    op = swish_op()
    op.implement(CudaSource(four, name="four", block=128, outputs_per_thread=4))
    op.implement(CudaSource(four, name="rows", block=128, outputs_per_thread=4,
                            grid=lambda batch, m: (-(-m["X_PER_IMAGE"] // (m["BLOCK"] * m["OUTPUTS_PER_THREAD"])), batch)))
    for variant in ("four", "rows"):
        assert against_reference(op, variant) < 1e-5 and against_reference(op, variant, chunk=1) < 1e-5


def test_a_cupy_function_and_a_raw_kernel_match_the_reference():
    import cupy

    op = swish_op()
    op.implement(CuPy(lambda x, beta: x / (1 + cupy.exp(-beta * x)), name="cupy"))
    raw = cupy.RawKernel('''extern "C" __global__ void swish_raw(const float* x, float* y, float beta, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] / (1.0f + expf(-beta * x[i]));
    }''', "swish_raw")
    op.implement(CuPy(raw, name="raw"))
    op.implement(CuPy(cupy.ElementwiseKernel("float32 x, float32 beta", "float32 y", "y = x / (1.0f + expf(-beta * x))",
                                             "swish_elementwise"), name="elementwise"))
    for variant in ("cupy", "raw", "elementwise"):
        assert against_reference(op, variant) < 1e-5 and against_reference(op, variant, chunk=2) < 1e-5


def test_a_kernel_that_leaves_outputs_unwritten_shows_nan_in_a_check():
    import cupy

    op = swish_op()
    half = cupy.RawKernel('''extern "C" __global__ void half(const float* x, float* y, float beta, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n / 2) y[i] = x[i];
    }''', "half")
    op.implement(CuPy(half, name="half"))
    assert np.isnan(against_reference(op, "half"))


def test_a_function_that_returns_the_wrong_shape_is_one_line():
    op = swish_op()
    op.implement(CuPy(lambda x, beta: x[:, :1], name="short"))
    with pytest.raises(DeclarationError, match=r"swish: com.example::Swish2 short returned y as float32 \[6, 1, 12, 12\]; "
                                               r"the declaration says float32 \[6, 8, 12, 12\]"):
        against_reference(op, "short")


def test_a_cuda_file_that_does_not_compile_names_its_line(tmp_path):
    op = swish_op()
    (tmp_path / "bad.cu").write_text(CUDA_SWISH.replace("ATTR_BETA", "ATTR_GAMMA"))
    op.implement(CudaSource(tmp_path / "bad.cu"))
    with pytest.raises(UserKernelError, match=rf"^{tmp_path / 'bad.cu'}:3: "):
        op.build(swish_node(op), select_device("cuda"), "cuda:bad.cu")


@needs_triton
def test_every_triton_configuration_matches_the_reference_and_a_broken_kernel_is_one_line():
    module = example_ops()
    op = module.swish
    variants = [v for v in op.variant_names() if v.startswith("triton:")]
    assert len(variants) == 2
    for variant in variants:
        assert against_reference(op, variant, beta=1.0) < 1e-5
    import triton
    import triton.language as tl

    swish_plain = module.swish_triton.fn  # the example's @triton.jit kernel, under other configurations
    swish_tuned = triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=1), triton.Config({"BLOCK": 512}, num_warps=4)],
                                  key=["n_elements"])(swish_plain)

    grid = lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),)  # noqa: E731
    tuned = swish_op()
    tuned.implement(Triton(swish_tuned, grid))
    tuned.implement(Triton(swish_plain, grid, BLOCK=256, name="triton:plain"))
    assert tuned.variant_names() == ["triton:swish_triton:BLOCK=128,w1,s3", "triton:swish_triton:BLOCK=512,w4,s3",
                                     "triton:plain"]
    for variant in tuned.variant_names():
        assert against_reference(tuned, variant) < 1e-5 and against_reference(tuned, variant, chunk=2) < 1e-5

    @triton.jit
    def broken(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
        tl.store(y_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)) + undefined_name)  # noqa: F821

    other = swish_op()
    other.implement(Triton(broken, grid=(1,), name="broken", BLOCK=64))
    with pytest.raises(DeclarationError, match=rf"^swish: com.example::Swish2 broken failed: {re.escape(__file__)}:\d+: "
                                               r".*undefined_name") as caught:
        other.build(swish_node(other), select_device("cuda"), "broken")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("variant", [None, "cuda:swish.cu", "cupy", "reference"])
def test_the_shipped_example_passes_check_with_each_kernel_inside_the_cuda_graph(variant):
    op = example_ops().swish
    variants = {op.op_type: variant} if variant else None
    runner = Runner(load_model("lenet86_swish"), 512, "cuda", variants, ops=[op])
    from opplugin.inputs.feeds import make_inputs

    feeds = make_inputs(runner.plan.model, 512).feeds
    runner.run(feeds)
    result = check(runner.run, runner.plan_record(512), feeds)
    assert result.passed
    swish_steps = [s.name for s in runner.plan.plugin_steps if s.node.op_key == op.op_type]
    assert len(swish_steps) == 3
    if variant != "reference":  # the reference synchronises: its run stays eager, and says why
        assert runner.graph_failures() == {}



def test_bench_custom_times_every_kernel_of_the_example_beside_its_reference(tmp_path, capsys):
    import json

    from opplugin.cli import main

    ops = str(Path(__file__).resolve().parents[2] / "models" / "lenet86_swish_ops.py")
    report = tmp_path / "bench.json"
    assert main(["bench", "--custom", "lenet86_swish", "--ops", ops, "--batches", "64", "--repeat", "3",
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "lenet86_swish at batch 64" in out and "float64 reference on the host" in out
    [batch] = json.loads(report.read_text())["batches"]
    assert len(batch["steps"]) == 3
    for step in batch["steps"]:
        assert all(i["status"] == "ok" and i["ms"] > 0 for i in step["implementations"])


def test_sanitize_checks_every_cuda_and_triton_kernel_of_a_declaration(capsys):
    from opplugin.cli import main

    ops = str(Path(__file__).resolve().parents[2] / "models" / "lenet86_swish_ops.py")
    assert main(["check", "lenet86_swish", "--ops", ops, "--batch", "4", "--sanitize"]) == 0
    out = capsys.readouterr().out
    assert "--sanitize: memcheck, initcheck found nothing in cuda:swish.cu" in out
    if importlib.util.find_spec("triton") is not None and importlib.util.find_spec("torch") is not None:
        assert "triton:swish_triton:BLOCK=1024,w4,s3" in out


def test_sanitize_finds_a_declared_cuda_kernel_writing_out_of_bounds(tmp_path, capsys):
    from custom_models import example_with_cuda_file
    from opplugin.cli import main

    ops, source = example_with_cuda_file(tmp_path, lambda text: text.replace("y[i] = v", "y[i + 64] = v"))
    assert main(["check", "lenet86_swish", "--ops", str(ops), "--batch", "4", "--sanitize"]) == 2
    out, err = capsys.readouterr()
    assert "Invalid __global__ write of size 4 bytes" in out and "swish.cu:9" in out and "y[i + 64] = v" in out
    assert err.startswith(f"{source}: compute-sanitizer found") and err.count("\n") == 1


def test_watch_follows_a_declarations_cuda_file(tmp_path):
    from custom_models import example_with_cuda_file
    from user_kernel_fixtures import watch_through_an_edit

    ops, source = example_with_cuda_file(tmp_path)
    code, text = watch_through_an_edit(["lenet86_swish", "--batch", "200", "--ops", str(ops)], source,
                                       "y[i] = v / ", "y[i] = 1.0f + v / ")
    assert code == 0 and f"watching {source}" in text
    first, second = text.split("after the edit:")
    assert "relu1 (Swish.cuda:swish.cu): error" in first and "pass" in first
    assert "FAIL" in second


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
                    reason="Triton and torch are not installed")
def test_the_shipped_triton_conv_runs_every_conv_of_resnet18_and_passes_check(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "tools/export_models.py", "--out", str(tmp_path), "resnet18"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    if done.returncode:
        pytest.skip(f"torchvision's resnet18 could not be exported here: {done.stderr.strip().splitlines()[-1:]}")
    from opplugin.custom import load_ops
    from opplugin.inputs.feeds import make_inputs

    [conv] = load_ops(root / "models" / "conv_triton_ops.py")
    runner = Runner(load_model(str(tmp_path / "resnet18.onnx")), 4, "cuda", ops=[conv])
    convs = [s for s in runner.plan.plugin_steps if s.node.op_type == "Conv"]
    assert len(convs) == 20 and all(runner.kernels[s.name].name.startswith("Conv.triton:conv_triton") for s in convs)
    feeds = make_inputs(runner.plan.model, 4).feeds
    assert check(runner.run, runner.plan_record(4), feeds).passed
