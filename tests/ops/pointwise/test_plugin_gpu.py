"""The pointwise compiler's generated kernels against the float64 oracle and onnxruntime CPU (GPU
tests, marker `gpu`).

Fresh random inputs with NaN, +inf and -inf planted, every output poisoned with NaN first; every
op, every operand form at a shape that vectorises (float4) and one that does not, casts and
float16 arithmetic, Where, BatchNormalization, a group of seven nodes with two outputs, an
input that is not 16-byte aligned, and `check` end to end on the device."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_builders import save
from opplugin.cli import main
from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.ops.pointwise.group import PointwiseGroup
from opplugin.plan.partition import make_plan
from pointwise_cases import (BINARY, OPERANDS, UNARY, assert_close, batchnorm_model, binary_model, cast_model, expand_model, feeds,
                             onnxruntime_outputs, se_gelu_model, unary_id, unary_model, where_model)
from resnet_block import resnet_block

pytestmark = pytest.mark.gpu

BATCH = 4
SHAPES = {"v1": (6, 5, 7), "v4": (6, 4, 8)}  # 5 * 7 elements a plane: no float4; 4 * 8: float4
RTOL, ATOL = 5e-6, 2e-6  # a few ulp of float32 through the CUDA math library's functions


def run_on_device(model, tmp_path, inputs, compare_onnxruntime=True, tolerance=(RTOL, ATOL), offset=0, sliced=0):
    """The plan's plugin step run on the device with poisoned outputs, against float64 and onnxruntime.
    `offset`: each input 4 bytes past a 16-byte boundary; `sliced`: each input with rows of the batch
    a channel slice of a NaN-filled buffer `sliced` channels wider (a Concat's buffer, read in place)."""
    import cupy

    device = select_device("cuda")
    plan = make_plan(load_model(save(model, tmp_path / "model.onnx")), BATCH, device)
    step = next(s for s in plan.steps if s.kind == "plugin")
    kernel = step.build(device)
    group = PointwiseGroup.of([step.node, *step.fused], step.inputs, step.outputs)
    arguments = []
    for name in step.inputs:
        host = inputs[name]
        if offset:  # the same values at an address 4 bytes past a 16-byte boundary
            buffer = cupy.empty(host.size + offset, host.dtype)
            view = buffer[offset:].reshape(host.shape)
            view[...] = cupy.asarray(host)
            arguments.append(view)
        elif sliced and host.ndim >= 2 and host.shape[0] == BATCH:
            buffer = cupy.full((BATCH, host.shape[1] + sliced, *host.shape[2:]), np.nan, host.dtype)
            view = buffer[:, 1:1 + host.shape[1]]
            view[...] = cupy.asarray(host)
            arguments.append(view)
        else:
            arguments.append(cupy.asarray(host))
    poisoned = [cupy.full(group.shape_at(t.shape, BATCH), np.nan, t.dtype) for _, t in group.outputs]
    if sliced:  # each output a channel slice of a wider NaN-filled buffer too, whose other channels stay NaN
        buffers = [cupy.full((y.shape[0], y.shape[1] + sliced, *y.shape[2:]), np.nan, y.dtype) for y in poisoned]
        poisoned = [b[:, 1:1 + y.shape[1]] for b, y in zip(buffers, poisoned)]
    outputs = kernel(arguments, None, out=poisoned)
    assert all(a is b for a, b in zip(outputs, poisoned))
    if sliced:
        assert all(cupy.isnan(b[:, :1]).all() and cupy.isnan(b[:, 1 + y.shape[1]:]).all() for b, y in zip(buffers, poisoned))
    got = [cupy.asnumpy(y) for y in outputs]
    exact = group.evaluate([inputs[n] for n in step.inputs])
    for ours, oracle, (_, tensor) in zip(got, exact, group.outputs):
        assert_close(ours, oracle.astype(tensor.dtype), *tolerance)
    if compare_onnxruntime:
        theirs = onnxruntime_outputs(model, inputs, step.outputs)
        for ours, other in zip(got, theirs):
            assert_close(ours, other, *tolerance)
    return step, kernel


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", UNARY, ids=unary_id)
def test_each_one_operand_op(case, shape, tmp_path):
    model = unary_model(*case, shape=SHAPES[shape])
    _, kernel = run_on_device(model, tmp_path, feeds(model, BATCH, seed=5, poison=True))
    assert kernel.name.startswith("pointwise.cuda.") and kernel.width == (4 if shape == "v4" else 1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_broadcast_every_operand_form(op, operand, shape, tmp_path):
    model = binary_model(op, operand, constant_first=operand in ("channel", "se_scale"), shape=SHAPES[shape])
    run_on_device(model, tmp_path, feeds(model, BATCH, seed=6, poison=True))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("operand", ["same", "se_scale"])
def test_tensors_whose_rows_lie_apart_are_read_and_written_in_place(operand, shape, tmp_path):
    """Inputs and outputs that are channel slices of wider buffers (a Concat's, read or written in place):
    the kernel takes their row strides."""
    from opplugin.ops.pointwise.plugin import rows_of_contiguous_runs
    import cupy

    model = binary_model("Mul", operand, shape=SHAPES[shape])
    assert rows_of_contiguous_runs(cupy.empty((BATCH, 9, 4, 8))[:, 2:5]) and not rows_of_contiguous_runs(cupy.empty((BATCH, 9, 4, 8))[:, :, 1:3])
    _, kernel = run_on_device(model, tmp_path, feeds(model, BATCH, seed=8, poison=True), sliced=4)
    assert kernel._row_strided and kernel._rows_apart_outputs  # the row strides are arguments


def test_an_input_off_the_16_byte_boundary_runs_unvectorised(tmp_path):
    model = binary_model("Mul", "se_scale", shape=SHAPES["v4"])
    _, kernel = run_on_device(model, tmp_path, feeds(model, BATCH, seed=7, poison=True), offset=1)
    assert kernel.width == 4  # compiled for float4, launched without it for this call


@pytest.mark.parametrize("via,then", [(np.float16, None), (np.float64, None), (np.float16, "Relu"), (np.float16, "Sigmoid")],
                         ids=["f16", "f64", "f16_relu", "f16_sigmoid"])
def test_casts_and_float16_arithmetic(via, then, tmp_path):
    model = cast_model(via, then, shape=SHAPES["v4"])
    inputs = feeds(model, BATCH, seed=8, poison=True)
    # onnxruntime's CPU provider computes a float16 node in float32 (see ops/pointwise/test_plugin.py): float16's tolerance
    tolerance = (2.0 ** -10, 2.0 ** -10) if then else (0, 0)
    run_on_device(model, tmp_path, inputs, tolerance=tolerance)


def test_where_with_a_bool_condition(tmp_path):
    model = where_model(shape=SHAPES["v4"])
    inputs = feeds(model, BATCH, seed=9, poison=True)
    inputs["cond"] = inputs["x"] < np.float32(0.25)
    run_on_device(model, tmp_path, inputs, compare_onnxruntime=False, tolerance=(0, 0))


@pytest.mark.parametrize("then_relu", [False, True], ids=["alone", "relu"])
def test_batchnormalization_as_a_per_channel_affine(then_relu, tmp_path):
    model = batchnorm_model(then_relu, shape=SHAPES["v1"])
    run_on_device(model, tmp_path, feeds(model, BATCH, seed=10, poison=True), tolerance=(1e-5, 1e-5))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("then_mul", [False, True], ids=["alone", "mul"])
def test_an_expand_by_a_constant_shape(then_mul, shape, tmp_path):
    model = expand_model(then_mul, shape=SHAPES[shape])
    run_on_device(model, tmp_path, feeds(model, BATCH, seed=12, poison=True), tolerance=(0, 0))


@pytest.mark.parametrize("shape", SHAPES)
def test_a_group_of_an_se_scale_and_a_written_out_gelu_with_two_outputs(shape, tmp_path):
    from onnx import helper

    model = se_gelu_model(SHAPES[shape])
    model.graph.output.append(helper.make_tensor_value_info("m", 1, ["N", *SHAPES[shape]]))  # to read it from onnxruntime too
    step, _ = run_on_device(model, tmp_path, feeds(model, BATCH, seed=11, poison=True))
    # seven nodes: Sigmoid, Mul and GELU written out (Div, Erf, Add, Mul, Mul), which loads as one Gelu node
    assert step.ops == ["Sigmoid", "Mul", "Gelu"] and step.outputs == ["m", "y"]


def test_check_passes_on_the_device(tmp_path):
    se = save(se_gelu_model(), tmp_path / "se.onnx")
    assert main(["check", se, "--batch", "5", "--device", "cuda"]) == 0
    # in chunks of 3 (the last one 1 row), each run of plugin steps replayed as a CUDA graph
    assert main(["check", se, "--batch", "7", "--device", "cuda", "--chunk", "3", "--cuda-graphs"]) == 0
    assert main(["check", save(resnet_block(), tmp_path / "block.onnx"), "--batch", "5", "--device", "cuda"]) == 0
