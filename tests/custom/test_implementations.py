"""A custom op's kernels, as far as a machine without a GPU can see them: a CUDA C file's macros
and contract, compiled by NVRTC alone with its errors at the file's own lines; a Triton kernel's
autotune configurations as variants; and every kind turned down on the CPU, so that the
reference runs there."""
import inspect

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from custom_models import ops_file, swish_node, swish_op
from opplugin.custom import CudaSource, CuPy, CustomOp, DeclarationError, Triton
from opplugin.custom.cuda_source import CudaSourceKernel, contract_for_node, node_macros
from opplugin.custom.cupy_impl import kernel_attributes
from opplugin.custom.triton_impl import TritonKernel, compile_message
from opplugin.user_kernels.compiler import Compiled
from opplugin.gpu.device import select_device
from opplugin.lab import nvrtc_check
from opplugin.registry import NodeInfo, TensorInfo
from opplugin.user_kernels.compiler import Rejected
from opplugin.user_kernels.source import UserKernelError

CPU = select_device("cpu")
needs_nvrtc = pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="NVRTC's Python bindings are not installed")


def test_a_cuda_file_gets_each_shape_and_attribute_as_a_macro_the_batch_read_at_run_time():
    op = CustomOp("com.example", "Scaled", inputs=["X", "bias?"], outputs=["Y"], attributes={"alpha": 0.5, "axes": [1, 2]},
                  reference=lambda x, bias=None, alpha=0.5, axes=None: x * alpha)
    node = helper.make_node("Scaled", ["x"], ["y"], name="scaled", domain="com.example")
    info = NodeInfo(node, [TensorInfo("x", (6, 3, 4), np.dtype(np.float32))], [TensorInfo("y", (6, 3, 4), np.dtype(np.float32))], {})
    info = NodeInfo(node, info.inputs, info.outputs, {}, spec=op.make_spec(info))
    macros = node_macros(op, info)
    assert macros["X_RANK"] == 3 and macros["X_DIM0"] == "(batch)" and macros["X_DIM1"] == 3 and macros["X_DIM2"] == 4
    assert macros["X_PER_IMAGE"] == 12 and macros["X_SIZE"] == "((long long)(batch) * 12LL)" and macros["Y_DIM0"] == "(batch)"
    assert macros["HAS_BIAS"] == 0 and macros["ATTR_ALPHA"] == 0.5
    assert macros["ATTR_AXES_COUNT"] == 2 and macros["ATTR_AXES_0"] == 1 and macros["ATTR_AXES_1"] == 2
    contract = contract_for_node(op, info)
    assert contract.signature == 'extern "C" __global__ void scaled(const float* x, const float* bias, float* y, int batch)'
    at_two = node_macros(op, info, batch=2)  # what a grid function and a grid directive see at a chunk of 2
    assert at_two["X_DIM0"] == 2 and at_two["X_SIZE"] == 24 and at_two["Y_DIM0"] == 2 and at_two["X_DIM1"] == 3


def test_a_tensor_whose_first_axis_is_not_the_batch_gets_its_planned_size_as_numbers():
    op = CustomOp("com.example", "Affine", inputs=["X", "W"], outputs=["Y"], attributes={"mode": "fast", "gain": 2},
                  reference=lambda x, w, mode="fast", gain=2: x * w)
    node = helper.make_node("Affine", ["x", "w"], ["y"], name="affine", domain="com.example")
    info = NodeInfo(node, [TensorInfo("x", (5, 3), np.dtype(np.float64)), TensorInfo("w", (3,), np.dtype(np.float64))],
                    [TensorInfo("y", (5, 3), np.dtype(np.float64))], {}, constants={"w": np.ones(3)})
    info = NodeInfo(node, info.inputs, info.outputs, {}, spec=op.make_spec(info), constants=info.constants)
    macros = node_macros(op, info)
    assert macros["W_DIM0"] == 3 and macros["W_SIZE"] == 3 and macros["W_PER_IMAGE"] == 1 and macros["X_DIM0"] == "(batch)"
    assert macros["ATTR_GAIN"] == 2 and "ATTR_MODE" not in macros  # text attributes have no macro
    assert contract_for_node(op, info, "affine_kernel").signature == (
        'extern "C" __global__ void affine_kernel(const double* x, const double* w, double* y, int batch)')


def test_every_kind_of_implementation_is_turned_down_on_the_cpu_and_the_reference_runs(tmp_path):
    op = swish_op()
    source = tmp_path / "swish.cu"
    source.write_text('extern "C" __global__ void swish2(const float* x, float* y, int batch) {}\n')
    op.implement(CudaSource(source))
    op.implement(CuPy(lambda x, beta: x, name="cupy"))
    op.implement(Triton(FakeJit(), grid=(1,)))
    info = swish_node(op)
    notes = op.variant_notes(info, CPU)
    assert notes["reference"] is None and all("needs a GPU" in notes[v] for v in ("cuda:swish.cu", "cupy"))
    expected = ("Triton is not installed" if not _importable("triton") else
                "triton:swish_kernel needs torch, which is not installed" if not _importable("torch") else "triton:swish_kernel needs a GPU")
    assert notes["triton:swish_kernel"] == expected
    assert op.default_variant(info, CPU) == "reference"


def _importable(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


class FakeConfig:
    """triton.Config's members that opplugin reads."""

    def __init__(self, block, warps, stages=3, num_ctas=1, maxnreg=None):
        self.kwargs, self.num_warps, self.num_stages, self.num_ctas, self.maxnreg = {"BLOCK": block}, warps, stages, num_ctas, maxnreg
        self.pre_hook = None

    def all_kwargs(self):
        options = {"num_warps": self.num_warps, "num_ctas": self.num_ctas, "num_stages": self.num_stages, "maxnreg": self.maxnreg}
        return {**self.kwargs, **{k: v for k, v in options.items() if v is not None}}


class FakeJit:
    """A @triton.jit function's members that opplugin reads: launched as fn[grid](*args, **keywords)."""

    __name__ = "swish_kernel"
    arg_names = ["x_ptr", "y_ptr", "n_elements", "beta", "BLOCK"]

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **keywords: self.launches.append((grid, args, keywords))


class FakeAutotuner:
    """@triton.autotune's wrapper: like triton.runtime.Autotuner it has arg_names of its own."""

    def __init__(self, configs=None):
        self.fn, self.configs = FakeJit(), configs or [FakeConfig(256, 2), FakeConfig(1024, 4)]
        self.arg_names = self.fn.arg_names
        self.reset_to_zero = ["y_ptr"]


def test_each_triton_autotune_configuration_is_a_variant_of_its_own():
    tuned = Triton(FakeAutotuner(), grid=lambda meta: (1,))
    assert tuned.variants() == ["triton:swish_kernel:BLOCK=256,w2,s3", "triton:swish_kernel:BLOCK=1024,w4,s3"]
    plain = Triton(FakeJit(), grid=(1,))
    assert plain.variants() == ["triton:swish_kernel"]
    assert isinstance(tuned.function, FakeJit)  # the jit function under the autotuner is what is launched
    capped = Triton(FakeAutotuner([FakeConfig(128, 8, 2, num_ctas=2, maxnreg=64)]), grid=(1,), name="capped")
    assert capped.variants() == ["capped:BLOCK=128,w8,s2,c2,r64"]
    op = swish_op()
    op.implement(tuned)
    with pytest.raises(Exception, match="two implementations named"):
        op.implement(Triton(FakeAutotuner(), grid=(1,)))
    with pytest.raises(DeclarationError, match="BLOCK is both an autotune meta-parameter and a keyword of Triton"):
        Triton(FakeAutotuner(), grid=(1,), BLOCK=64)


class FakeTensor:
    def __init__(self, n):
        self.n = n

    def numel(self):
        return self.n


def test_a_triton_launch_gets_the_attributes_it_names_the_element_count_and_its_configuration():
    op = swish_op()
    tuned = Triton(FakeAutotuner(), grid=lambda meta: (meta["n_elements"] // meta["BLOCK"],))
    op.implement(tuned)
    info = swish_node(op)
    kernel = TritonKernel(tuned, op, info, "triton:swish_kernel:BLOCK=1024,w4,s3", tuned.configs[1], poison=True)
    assert kernel.zeroed == [0]  # the autotuner's reset_to_zero names the output y_ptr
    x, y = FakeTensor(800), FakeTensor(800)
    kernel._launch([x], [y], 4)
    [(grid, args, keywords)] = tuned.function.launches
    assert grid is tuned.grid and args == (x, y)
    assert keywords == {"beta": 2.5, "n_elements": 800, "BLOCK": 1024, "num_warps": 4, "num_ctas": 1, "num_stages": 3}
    plain = Triton(FakeJit(), grid=(3,), BLOCK=128, num_warps=2)
    TritonKernel(plain, op, info, "triton:swish_kernel", None, poison=False)._launch([x], [y], 4)
    assert plain.function.launches == [((3,), (x, y), {"beta": 2.5, "n_elements": 800, "BLOCK": 128, "num_warps": 2})]


def test_a_triton_launch_gets_the_shapes_a_cuda_file_gets_as_macros_at_the_calls_batch():
    """A Conv-like kernel reads its image size and list attributes as plain integers, by name."""
    op = swish_op()
    jit = FakeJit()
    jit.arg_names = ["x_ptr", "y_ptr", "X_DIM0", "X_DIM1", "X_DIM3", "Y_SIZE", "batch", "beta", "X_RANK"]
    plain = Triton(jit, grid=(1,))
    op.implement(plain)
    kernel = TritonKernel(plain, op, swish_node(op), "triton:swish_kernel", None, poison=False)
    x, y = FakeTensor(2 * 200), FakeTensor(2 * 200)
    kernel._launch([x], [y], 2)
    kernel._launch([x], [y], 3)
    assert [keywords for _grid, _args, keywords in jit.launches] == [
        {"X_DIM0": 2, "X_DIM1": 8, "X_DIM3": 5, "Y_SIZE": 400, "batch": 2, "beta": 2.5, "X_RANK": 4},
        {"X_DIM0": 3, "X_DIM1": 8, "X_DIM3": 5, "Y_SIZE": 600, "batch": 3, "beta": 2.5, "X_RANK": 4}]


def fake_triton_kernel(x_ptr, y_ptr, n_elements):  # stands for a @triton.jit function's Python source
    offsets = undefined_name  # noqa: F821
    return offsets


class FakeCompilationError(Exception):
    """triton.compiler.errors.CompilationError's members: the kernel's source, the AST node, the message."""

    def __init__(self, lineno, message):
        self.src, self.node, self.error_message = "...", type("Node", (), {"lineno": lineno, "col_offset": 4})(), message
        super().__init__(f"at {lineno}:4:\n    offsets = undefined_name\n    ^\n{message}")


def test_a_triton_compile_error_is_one_line_at_the_kernel_file_and_line():
    jit = type("JITFunction", (), {"fn": staticmethod(fake_triton_kernel), "arg_names": ["x_ptr", "y_ptr", "n_elements"]})()
    message = compile_message(FakeCompilationError(2, "NameError('undefined_name is not defined')"), jit)
    line = inspect.getsourcelines(fake_triton_kernel)[1] + 1
    assert message == f"{__file__}:{line}: NameError('undefined_name is not defined')"
    assert compile_message(ValueError("first\nsecond"), jit) == "ValueError: first"
    jit.src = "def fake_triton_kernel(x_ptr, y_ptr, n_elements): ..."  # Triton's own copy: the error is in another function
    assert compile_message(FakeCompilationError(3, "TypeError('bad')"), jit) == "line 3 of a function fake_triton_kernel calls: TypeError('bad')"


GOOD = '''// opplugin: block=128
extern "C" __global__ void swish2(const float* x, float* y, int batch) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < X_SIZE) y[i] = x[i] / (1.0f + expf(-ATTR_BETA * x[i]));
}
'''


@needs_nvrtc
def test_a_cuda_file_compiles_without_a_gpu_and_its_errors_name_its_lines(tmp_path):
    op = swish_op()
    good, broken, picky = tmp_path / "good.cu", tmp_path / "broken.cu", tmp_path / "picky.cu"
    good.write_text(GOOD)
    broken.write_text(GOOD.replace("expf(-ATTR_BETA", "expf(-ATTR_GAMMA"))
    picky.write_text("#if X_DIM1 != 16\n#error reject: 16 channels only\n#endif\n" + GOOD)
    info = swish_node(op)
    CudaSource(good).compile_offline(op, info)
    with pytest.raises(UserKernelError) as caught:
        CudaSource(broken).compile_offline(op, info)
    assert str(caught.value).splitlines()[0].startswith(f"{broken}:4: ") and "ATTR_GAMMA" in str(caught.value).splitlines()[0]
    with pytest.raises(Rejected, match="16 channels only"):
        CudaSource(picky).compile_offline(op, info)


@needs_nvrtc
def test_a_cuda_file_with_the_wrong_signature_is_told_the_one_it_needs(tmp_path):
    op = swish_op()
    wrong = tmp_path / "wrong.cu"
    wrong.write_text('extern "C" __global__ void swish2(const float* x, float* y) {}\n')
    with pytest.raises(UserKernelError, match=r'wrong signature for swish2: it must be extern "C" __global__ void '
                                              r'swish2\(const float\* x, float\* y, int batch\)'):
        CudaSource(wrong).compile_offline(op, swish_node(op))


def test_a_cuda_text_compiles_with_its_own_launch_and_its_errors_name_its_lines():
    op = swish_op()
    info = swish_node(op)
    text = CudaSource(GOOD.replace("// opplugin: block=128\n", ""), entry="swish2", block=64, outputs_per_thread=2)
    assert text.name == "cuda" and text.path == "<cuda>"
    launch = text.source(op, info).launch
    assert (launch.block, launch.outputs_per_thread) == (64, 2)
    assert CudaSource(GOOD, block=64).source(op, info).launch.block == 128  # the file's directive wins
    with pytest.raises(DeclarationError, match="block must be a whole number from 1 to 1024"):
        CudaSource(GOOD, block=2048)
    with pytest.raises(UserKernelError, match=r"^<cuda>: no entry point: it must define extern \"C\" __global__ void swish2"):
        CudaSource(GOOD.replace("swish2", "swish3")).source(op, info)


@needs_nvrtc
def test_a_cuda_text_that_does_not_compile_names_its_own_line():
    op = swish_op()
    broken = CudaSource(GOOD.replace("x[i] / ", "x[i] / undefined_value / "), name="inline")
    with pytest.raises(UserKernelError) as caught:
        broken.compile_offline(op, swish_node(op))
    first = str(caught.value).splitlines()[0]
    assert first.startswith("<inline>:4: ") and "undefined_value" in first
    CudaSource(GOOD, name="good").compile_offline(op, swish_node(op))


class FakeModule:
    def get_function(self, name):
        return name


def test_a_cuda_kernel_grid_covers_the_first_output_or_is_the_users():
    op = swish_op()
    info = swish_node(op)  # 4 x 8 x 5 x 5: 200 elements an image

    def kernel(implementation, variant="cuda"):
        source = implementation.source(op, info)
        return CudaSourceKernel(implementation, op, info, variant, source, Compiled(FakeModule(), ()), poison=False)

    plain = kernel(CudaSource(GOOD.replace("// opplugin: block=128\n", ""), block=100, outputs_per_thread=2))
    assert plain.grid(3, 600) == (3,) and plain.functions == ["swish2"]
    seen = {}

    def grid(batch, macros):
        seen.update(macros)
        return (macros["X_DIM1"], batch)

    chosen = kernel(CudaSource(GOOD, grid=grid))
    assert chosen.grid(3, 600) == (8, 3)
    assert seen["X_DIM0"] == 3 and seen["X_SIZE"] == 600 and seen["BLOCK"] == 128 and seen["ATTR_BETA"] == 2.5
    directive = kernel(CudaSource("// opplugin: grid=cdiv(X_SIZE, BLOCK), 2\n" + GOOD, grid=grid))
    assert directive.grid(3, 600) == (5, 2)  # the file's grid directive over the constructor's grid
    with pytest.raises(DeclarationError, match="the grid function gave"):
        kernel(CudaSource(GOOD, grid=lambda batch, macros: (0.5,))).grid(3, 600)


class FakeParameter:
    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype


class FakeElementwiseKernel:
    """A cupy.ElementwiseKernel's members that opplugin reads: `in_params` and `nin`."""

    def __init__(self, *params):
        self.in_params, self.nin = tuple(FakeParameter(n, d) for n, d in params), len(params)


def test_a_cupy_elementwise_kernel_gets_attributes_positionally_by_name_else_in_order():
    x = np.zeros(3, np.float64)
    by_name = FakeElementwiseKernel(("x", np.float32), ("gain", np.int32), ("beta", np.float32))
    values = kernel_attributes(by_name, [x], {"beta": 2.5, "gain": 3})
    assert values == [3, 2.5] and [type(v) for v in values] == [np.int32, np.float32]
    in_order = FakeElementwiseKernel(("x", None), ("a", None), ("b", None))  # type placeholders: T
    values = kernel_attributes(in_order, [x], {"beta": 2.5, "count": 7})
    assert values == [2.5, 7] and [type(v) for v in values] == [np.float64, np.int32]  # a float in the input's dtype
    assert kernel_attributes(FakeElementwiseKernel(("x", np.float32)), [x], {"beta": 2.5}) == []


def test_a_grid_given_for_a_cupy_function_that_is_no_raw_kernel_is_refused_when_built():
    op = swish_op()
    implementation = CuPy(lambda x, beta: x, name="cupy", grid=(4,))
    op.implement(implementation)
    with pytest.raises(DeclarationError, match=r"swish: com.example::Swish2 cupy: grid is a RawKernel's"):
        implementation.build(op, swish_node(op), CPU, "cupy", poison=False)


# --- opplugin new for any op --------------------------------------------------------------


def test_new_writes_a_starter_for_any_onnx_op_and_for_a_declared_one(tmp_path, capsys):
    from opplugin.cli import main

    softmax = tmp_path / "softmax.cu"
    assert main(["new", "softmax", str(softmax)]) == 0
    text = softmax.read_text()
    assert 'extern "C" __global__ void softmax(const float* input, float* output, int batch)' in text
    assert "ATTR_AXIS" in text and 'CudaSource("softmax.cu")' in text
    swish = tmp_path / "swish.cu"
    ops = str(Path(__file__).resolve().parents[2] / "models" / "lenet86_swish_ops.py")
    assert main(["new", "example.ops::Swish", str(swish), "--ops", ops]) == 0
    assert 'extern "C" __global__ void swish(const float* x, float* y, int batch)' in swish.read_text()
    assert "inputs=['X'], outputs=['Y']" in swish.read_text()
    assert main(["new", "other.ops::Thing", str(tmp_path / "t.cu"), "--ops", ops]) == 2
    assert capsys.readouterr().err.strip().endswith(f"no declaration for other.ops::Thing in {ops}")


@needs_nvrtc
def test_a_starter_compiles_as_written_for_the_op_it_was_made_for(tmp_path):
    from opplugin.cli import main

    op = swish_op()
    path = tmp_path / "swish2.cu"
    assert main(["new", "com.example::Swish2", str(path), "--ops", str(ops_file(tmp_path))]) == 0
    CudaSource(path).compile_offline(op, swish_node(op))


@needs_nvrtc
def test_without_a_gpu_plan_and_check_compile_a_custom_ops_cuda_file_and_stop_at_its_error(tmp_path, capsys):
    from opplugin.cli import main

    models = Path(__file__).resolve().parents[2] / "models"
    assert main(["plan", "lenet86_swish", "--ops", str(models / "lenet86_swish_ops.py")]) == 0
    assert "relu1: cuda:swish.cu compiles (NVRTC alone, sm_90; it runs on a GPU)" in capsys.readouterr().out
    broken = tmp_path / "swish.cu"
    broken.write_text((models / "swish.cu").read_text().replace("ATTR_BETA", "ATTR_GAMMA"))
    declarations = (models / "lenet86_swish_ops.py").read_text().replace('Path(__file__).with_name("swish.cu")', repr(str(broken)))
    ops = ops_file(tmp_path, declarations, "broken_ops.py")
    assert main(["check", "lenet86_swish", "--ops", str(ops), "--batch", "4"]) == 2
    assert capsys.readouterr().err.splitlines()[0] == f'{broken}:9: identifier "ATTR_GAMMA" is undefined'
