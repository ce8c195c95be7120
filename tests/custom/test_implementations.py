"""A custom op's kernels, as far as a machine without a GPU can see them: a CUDA C file's macros
and contract, compiled by NVRTC alone with its errors at the file's own lines; a Triton kernel's
autotune configurations as variants; and every kind turned down on the CPU, so that the
reference runs there."""
import numpy as np
import pytest
from onnx import helper

from custom_models import swish_op
from opplugin.custom import CudaSource, CuPy, CustomOp, Triton
from opplugin.custom.cuda_source import compile_offline, contract_for_node, node_macros
from opplugin.gpu.device import select_device
from opplugin.lab import nvrtc_check
from opplugin.registry import NodeInfo, TensorInfo
from opplugin.user_kernels.compiler import Rejected
from opplugin.user_kernels.source import UserKernelError

CPU = select_device("cpu")
needs_nvrtc = pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="NVRTC's Python bindings are not installed")


def swish_node(op, batch=4, shape=(8, 5, 5), beta=2.5):
    node = helper.make_node("Swish2", ["x"], ["y"], name="swish", domain="com.example", beta=beta)
    info = NodeInfo(node, [TensorInfo("x", (batch, *shape), np.dtype(np.float32))],
                    [TensorInfo("y", (batch, *shape), np.dtype(np.float32))], {"beta": beta})
    return NodeInfo(info.node, info.inputs, info.outputs, info.attributes, spec=op.make_spec(info))


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


def test_every_kind_of_implementation_is_turned_down_on_the_cpu_and_the_reference_runs(tmp_path):
    op = swish_op()
    source = tmp_path / "swish.cu"
    source.write_text('extern "C" __global__ void swish2(const float* x, float* y, int batch) {}\n')
    op.implement(CudaSource(source))
    op.implement(CuPy(lambda x, beta: x, name="cupy"))
    info = swish_node(op)
    notes = op.variant_notes(info, CPU)
    assert notes["reference"] is None and all("needs a GPU" in notes[v] for v in ("cuda:swish.cu", "cupy"))
    assert op.default_variant(info, CPU) == "reference"


class FakeConfig:
    def __init__(self, block, warps, stages=3):
        self.kwargs, self.num_warps, self.num_stages = {"BLOCK": block}, warps, stages


class FakeJit:
    __name__ = "swish_kernel"
    arg_names = ["x_ptr", "y_ptr", "n_elements", "beta", "BLOCK"]


class FakeAutotuner:
    def __init__(self):
        self.fn, self.configs = FakeJit(), [FakeConfig(256, 2), FakeConfig(1024, 4)]


def test_each_triton_autotune_configuration_is_a_variant_of_its_own():
    tuned = Triton(FakeAutotuner(), grid=lambda meta: (1,))
    assert tuned.variants() == ["triton:swish_kernel:BLOCK=256,w2,s3", "triton:swish_kernel:BLOCK=1024,w4,s3"]
    plain = Triton(FakeJit(), grid=(1,))
    assert plain.variants() == ["triton:swish_kernel"]
    op = swish_op()
    op.implement(tuned)
    with pytest.raises(Exception, match="two implementations named"):
        op.implement(Triton(FakeAutotuner(), grid=(1,)))


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
    compile_offline(CudaSource(good), op, info)
    with pytest.raises(UserKernelError) as caught:
        compile_offline(CudaSource(broken), op, info)
    assert str(caught.value).splitlines()[0].startswith(f"{broken}:4: ") and "ATTR_GAMMA" in str(caught.value).splitlines()[0]
    with pytest.raises(Rejected, match="16 channels only"):
        compile_offline(CudaSource(picky), op, info)


@needs_nvrtc
def test_a_cuda_file_with_the_wrong_signature_is_told_the_one_it_needs(tmp_path):
    op = swish_op()
    wrong = tmp_path / "wrong.cu"
    wrong.write_text('extern "C" __global__ void swish2(const float* x, float* y) {}\n')
    with pytest.raises(UserKernelError, match=r'wrong signature for swish2: it must be extern "C" __global__ void '
                                              r'swish2\(const float\* x, float\* y, int batch\)'):
        compile_offline(CudaSource(wrong), op, swish_node(op))
