"""Shape arithmetic folded at load: Shape > Gather > ... > Reshape, as the TorchScript
exporter writes a channel shuffle, plans with concrete shapes at any batch; what
depends on data values never folds."""
import numpy as np
import onnxruntime as ort

from onnx_builders import save
from opplugin.verify.check import check
from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner
from shape_models import channel_shuffle, reshape_to_data, view_by_gather

CPU = select_device("cpu")


def test_channel_shuffle_targets_fold_into_constants_that_hold_at_any_batch(tmp_path):
    model = load_model(save(channel_shuffle(), tmp_path / "shuffle.onnx"))
    ops = [n.op_type for n in model.nodes]
    assert "Shape" not in ops and "Gather" not in ops and "Concat" not in ops
    targets = [model.initializers[n.input[1]].tolist() for n in model.nodes if n.op_type == "Reshape"]
    assert targets == [[-1, 2, 2, 6, 6], [0, -1, 6, 6]]  # the batch's element: -1, or 0 beside a -1
    for batch in (1, 5):
        plan = make_plan(model, batch, CPU)
        pool = next(s for s in plan.plugin_steps if s.node.op_type == "GlobalAveragePool")
        assert pool.node.inputs[0].shape == (batch, 4, 6, 6)  # concrete H and W for the plugin after it
        # the whole shuffle on the device: two views and one Transpose kernel
        assert [s.node.op_type for s in plan.plugin_steps] == ["Conv", "Reshape", "Transpose", "Reshape", "GlobalAveragePool"]


def test_channel_shuffle_passes_check_in_chunks_of_another_batch(tmp_path):
    model = load_model(save(channel_shuffle(), tmp_path / "shuffle.onnx"))
    runner = Runner(model, 7, "cpu", chunk=3)  # chunks of 3, 3 and 1 images through one plan
    x = np.random.default_rng(4).uniform(-1, 1, (7, 4, 6, 6)).astype(np.float32)
    result = check(runner.run, runner.describe(7), {"x": x})
    assert result.passed, result.records
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], expected, rtol=1e-5, atol=1e-5)


def test_shapes_and_targets_read_from_data_do_not_fold(tmp_path):
    model = load_model(save(reshape_to_data(), tmp_path / "data.onnx"))
    assert model.simplification.constants_folded == {"Slice": 1, "Shape": 1}  # (C, H, W) of x
    ops = [n.op_type for n in model.nodes]
    assert ops == ["ReduceMax", "Mul", "Cast", "Add", "Unsqueeze", "Concat", "Reshape", "NonZero", "Shape", "Cast"]
    reshape = next(n for n in model.nodes if n.op_type == "Reshape")
    assert reshape.input[1] == "target" and "target" not in model.initializers
    x = np.random.default_rng(6).uniform(-1, 1, (2, 4, 6, 6)).astype(np.float32)
    runner = Runner(model, 2, "cpu")
    outputs = runner.run({"x": x}).outputs
    np.testing.assert_array_equal(outputs["r"], x)
    np.testing.assert_array_equal(outputs["y"], [4, x.size])


def test_a_gather_of_every_position_in_order_is_a_reshape_at_any_batch(tmp_path):
    """torch's as_strided of a contiguous tensor, exported as Gather at indices computed from the batch:
    a view, so the plan has no onnxruntime step and the Transpose after it gets concrete shapes."""
    model = load_model(save(view_by_gather(), tmp_path / "view.onnx"))
    ops = [n.op_type for n in model.nodes]
    assert ops == ["GlobalAveragePool", "Reshape", "Reshape", "Transpose", "Relu"]
    assert model.initializers[model.nodes[2].input[1]].tolist() == [-1, 6, 1, 1]
    x = np.random.default_rng(7).uniform(-1, 1, (7, 6, 5, 5)).astype(np.float32)
    runner = Runner(model, 7, "cpu", chunk=3)
    assert all(step.kind == "plugin" for step in runner.plan.steps)
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x}).outputs["y"], expected, rtol=1e-6, atol=1e-6)


def test_a_gather_that_reorders_stays_a_gather(tmp_path):
    model = load_model(save(view_by_gather(in_order=False), tmp_path / "gather.onnx"))
    assert "Gather" in [n.op_type for n in model.nodes]
    x = np.random.default_rng(8).uniform(-1, 1, (3, 6, 5, 5)).astype(np.float32)
    expected = ort.InferenceSession(model.original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Runner(model, 3, "cpu").run({"x": x}).outputs["y"], expected, rtol=1e-6, atol=1e-6)
