"""The implicit-GEMM Conv kernels raise a watched step's NaN/Inf flag as they store their outputs
(`flags_nonfinite`), split over K or not; a CUDA graph passes them the step's flag instead of
checking each output in a pass of its own, and a poisoned chunk still takes the exact path."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_builders import save
from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.ops.conv.spec import ConvSpec
from opplugin.runtime import Runner
from resnet_block import resnet_block

pytestmark = pytest.mark.gpu

SPEC = ConvSpec(2, 96, 128, (14, 14), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, True)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("family", ["tc_3xtf32", "wg_3xtf32", "simt_gemm"])
def test_a_kernel_raises_its_flag_exactly_when_an_output_is_nan_or_inf(family, split):
    import cupy

    rng = np.random.default_rng(0)
    w = (rng.standard_normal(SPEC.weight_shape) / 30).astype(np.float32)
    b = rng.standard_normal(SPEC.out_channels).astype(np.float32)
    if family not in families.usable_families(SPEC, (w, b), Epilogue("Relu")):
        pytest.skip(f"{family} does not run on this GPU")  # wg_3xtf32: sm_90a only
    variant = dataclasses.replace(families.configure(SPEC, family, Epilogue("Relu")), splits=split)
    kernel = families.build_kernel(SPEC, variant.name(), (w, b), Epilogue("Relu"))
    assert kernel.flags_nonfinite
    x = rng.standard_normal((2, 96, 14, 14)).astype(np.float32)
    flag = cupy.zeros(4, dtype=cupy.bool_)  # a few bytes, the flag in the middle: no neighbour is touched
    for poison, expected in ((None, False), (np.inf, True), (np.nan, True)):
        fed = x.copy()
        if poison is not None:
            fed[1, 7, 5, 6] = poison
        inputs = [cupy.asarray(fed), cupy.asarray(w), cupy.asarray(b)]
        flag[...] = False
        [flagged] = kernel(inputs, nonfinite=flag[1:2].data.ptr)
        [plain] = kernel(inputs)
        cupy.cuda.runtime.deviceSynchronize()
        assert flag.get().tolist() == [False, expected, False, False], (variant.name(), poison)
        np.testing.assert_array_equal(cupy.asnumpy(flagged), cupy.asnumpy(plain))


def test_a_graph_passes_watched_steps_their_flags_and_a_poisoned_chunk_reruns_exactly(tmp_path):
    import onnxruntime as ort

    model = load_model(save(resnet_block(seed=3), tmp_path / "block.onnx"))
    runner = Runner(model, 8, "cuda", chunk=8, streams=1, variants={"Conv": "tc_3xtf32"})
    watched = list(runner.exact.watched)
    assert len(watched) == 3  # the three fused 3xTF32 Convs
    assert all(runner.executor._flags_itself(i, runner.kernels[runner.plan.steps[i].name]) for i in watched)
    clean = np.random.default_rng(4).standard_normal((8, 3, 12, 12)).astype(np.float32)
    runner.run({"x": clean})
    assert runner.run({"x": clean}).graphs  # captured, then replayed
    poisoned = clean.copy()
    poisoned[2, 1, 4, 7] = np.inf
    result = runner.run({"x": poisoned})
    assert result.graphs and result.exact_reruns == 1
    reference = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": poisoned})[0]
    np.testing.assert_array_equal(np.isnan(result.outputs["logits"]), np.isnan(reference))
    assert runner.run({"x": clean}).exact_reruns == 0  # the graph zeroes its flags each replay


def test_an_infinity_through_a_tensor_core_gemm_comes_out_as_onnxruntime_has_it(tmp_path):
    """3xTF32 turns an infinite operand into NaN; the step is watched and its chunk rerun on FP32 FMAs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((64, 48)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 48])], [w, b])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = load_model(save(proto, tmp_path / "fc.onnx"))
    runner = Runner(model, 64, "cuda", chunk=64, streams=1)
    [step] = runner.plan.plugin_steps
    assert runner.kernels[step.name].name.startswith(("gemm.tc_3xtf32", "gemm.wg_3xtf32"))
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[5, 9] = np.inf
    result = runner.run({"x": x})
    assert result.exact_reruns == 1
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isinf(reference[5]).any()
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
    np.testing.assert_array_equal(np.isinf(result.outputs["y"]), np.isinf(reference))
    np.testing.assert_allclose(result.outputs["y"], reference, rtol=1e-5, atol=1e-5)


def test_an_infinity_through_a_batched_tensor_core_matmul_comes_out_as_onnxruntime_has_it(tmp_path):
    """The batched product's 3xTF32 kernel is watched too, its chunk rerun on the FP32-FMA kernel."""
    import onnxruntime as ort
    from matmul_cases import fresh_inputs, matmul_model
    from onnx import TensorProto, helper

    proto = matmul_model((2, 3, 50, 64), (2, 3, 64, 50), "")
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 50, 50]))
    model = load_model(save(proto, tmp_path / "scores.onnx"))
    runner = Runner(model, 4, "cuda", chunk=4, streams=1)
    [step] = runner.plan.plugin_steps
    assert runner.kernels[step.name].name == "matmul.batched_3xtf32"
    feeds = fresh_inputs(proto, 4, 8)
    feeds["a"][3, 1, 20, 5] = np.inf
    result = runner.run(feeds)
    assert result.exact_reruns == 1
    reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.isinf(reference[3, 1, 20]).all()
    np.testing.assert_array_equal(np.isinf(result.outputs["y"]), np.isinf(reference))
    np.testing.assert_array_equal(np.isnan(result.outputs["y"]), np.isnan(reference))
