"""The runner on the CPU device: plugin steps run the numpy reference, the rest onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest

from opplugin.errors import DeviceError, InputError, PluginError
from opplugin.graph.model import load_model
from opplugin.gpu.device import select_device
from opplugin.runtime import Runner
from opplugin.gpu import cuda


def _inputs(batch, seed=0):
    return {"x": np.random.default_rng(seed).uniform(-1, 1, (batch, 3, 12, 12)).astype(np.float32)}


def _onnxruntime(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_swapped_model_matches_onnxruntime(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 6, "cpu")
    feeds = _inputs(6)
    first = runner.plan.plugin_steps[0]  # conv1, with the Relu and MaxPool the plan fuses into it
    result = runner.run(feeds, keep=tuple(first.outputs), step_times=True)
    np.testing.assert_allclose(result.outputs["y"], _onnxruntime(tiny_model_path, feeds), rtol=1e-5, atol=1e-6)
    record = runner.plan_record(6)
    assert result.kept[first.outputs[0]].shape == record.shapes[first.outputs[0]] == (6, 4, 6, 6)
    assert [t.name for t in result.times] == [step.name for step in runner.plan.steps]  # no copies on the CPU
    assert all(t.kind in ("plugin", "onnxruntime") for t in result.times)
    # one lane on the CPU: the steps ran one after another, each taking time, within the run
    spans = result.spans
    assert all(span.ms > 0 for span in spans)
    assert all(a.end_ms <= b.start_ms for a, b in zip(spans, spans[1:]))
    assert sum(t.ms for t in result.times) <= result.total_ms
    implementations = {step.name: step.implementation for step in record.steps}
    assert implementations["conv1"].startswith("conv.reference")
    assert "flatten" not in implementations and implementations["fc"] == "gemm.reference+softmax"  # fc reads the Flatten as a view


def test_profile_keeps_every_timed_reading(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 2, "cpu")
    seen = []
    profile = runner.profile(_inputs(2), warmup=1, repeat=3, progress=lambda *a: seen.append(a))
    assert len(profile.total_ms) == 3
    assert all(len(v) == 3 for v in profile.step_ms.values())
    assert profile.median("conv1") >= 0
    # progress counts images over every pass: 1 warm-up + 3 timed runs of 2 images
    assert seen[0] == ("warm-up", 2, 8) and seen[-1] == ("timed run", 8, 8)
    assert [done for _, done, _ in seen] == [2, 4, 6, 8]


def test_one_runner_takes_any_batch(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cpu")
    for batch in (1, 4, 9):
        feeds = _inputs(batch, seed=batch)
        result = runner.run(feeds)
        assert result.batch == batch and result.outputs["y"].shape == (batch, 5)
        np.testing.assert_allclose(result.outputs["y"], _onnxruntime(tiny_model_path, feeds), rtol=1e-5, atol=1e-6)
    assert runner.run(_inputs(9)).chunks == 3  # chunks of the runner's batch


def test_keep_names_only_tensors_that_cross_steps(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 2, "cpu")
    with pytest.raises(InputError, match="cannot keep"):
        runner.run(_inputs(2), keep=("logits",))  # inside an onnxruntime step


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"image": np.zeros((2, 3, 12, 12), np.float32)}, "do not match"),
        ({"x": np.ones((2, 3, 12, 12), np.float64)}, "float32"),
        ({"x": np.ones((2, 3, 12), np.float32)}, "rank"),
        ({"x": np.ones((2, 3, 11, 12), np.float32)}, "shape"),
        ({"x": np.ones((0, 3, 12, 12), np.float32)}, "at least 1"),
        ({"x": [[1.0]]}, "numpy array"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(tiny_model_path, feeds, message):
    runner = Runner(load_model(tiny_model_path), 2, "cpu")
    with pytest.raises(InputError, match=message):
        runner.run(feeds)


@pytest.mark.parametrize("batch", [0, -3, 2.5, True])
def test_a_runner_needs_a_positive_batch(tiny_model_path, batch):
    with pytest.raises(InputError, match="positive integer"):
        Runner(load_model(tiny_model_path), batch, "cpu")


def test_a_fixed_batch_model_runs_only_at_its_batch(tmp_path):
    from onnx_builders import save, single_conv

    path = save(single_conv((2, 3, 9, 9), (4, 3, 3, 3), {}, bias=False), tmp_path / "fixed.onnx")
    runner = Runner(load_model(path), 2, "cpu")
    assert not runner.layout.chunkable
    with pytest.raises(InputError, match="fixed batch of 2"):
        runner.run({"x": np.ones((3, 3, 9, 9), np.float32)})
    with pytest.raises(InputError, match="fixed batch of 2"):
        Runner(load_model(path), 5, "cpu")


def test_gpu_variant_on_the_cpu_is_a_clear_error(tiny_model_path):
    with pytest.raises(PluginError, match="needs a CUDA device"):
        Runner(load_model(tiny_model_path), 1, "cpu", variants={"Conv": "const"})


@pytest.mark.skipif(cuda.is_available(), reason="this machine has a CUDA device")
def test_asking_for_cuda_without_a_device():
    with pytest.raises(DeviceError, match="no CUDA device"):
        select_device("cuda")
    assert select_device("auto").kind == "cpu"


def test_unknown_device_name():
    with pytest.raises(DeviceError, match="unknown device"):
        select_device("tpu")


def test_conv_weights_from_graph_inputs_run_on_the_reference(tmp_path):
    from onnx_builders import save, single_conv

    path = save(single_conv((2, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 0, 0, 1], "strides": [2, 1]}, bias=True,
                            weights_as_input=True), tmp_path / "conv.onnx")
    runner = Runner(load_model(path), 2, "cpu")
    assert [s.name for s in runner.plan.plugin_steps] == ["conv"]
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 3, 9, 9)).astype(np.float32),
             "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], _onnxruntime(path, feeds), rtol=1e-5, atol=1e-5)


def test_cuda_graphs_need_a_device_and_leave_a_cpu_run_as_it_was(tiny_model_path):
    model = load_model(tiny_model_path)
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 3, 12, 12)).astype(np.float32)}
    plain, asked = Runner(model, 4, "cpu"), Runner(model, 4, "cpu", cuda_graphs=True)
    assert not asked.cuda_graphs and not asked.graph_failures()
    for _ in range(2):
        result = asked.run(feeds)
        assert not result.graphs
        np.testing.assert_array_equal(result.outputs["y"], plain.run(feeds).outputs["y"])


def test_a_runner_infers_shapes_only_at_the_two_probe_batches_and_plans_once(monkeypatch):
    import onnx.shape_inference

    from opplugin.runtime import runner as runner_module

    inferred, plans = [], []
    infer_shapes, make_plan = onnx.shape_inference.infer_shapes, runner_module.make_plan
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: inferred.append(1) or infer_shapes(*a, **k))
    monkeypatch.setattr(runner_module, "make_plan", lambda *a, **k: plans.append(a[1]) or make_plan(*a, **k))
    model = load_model("lenet86")
    runner = Runner(model, 10000, "cpu")
    assert runner.chunk < 10000 and plans == [runner.chunk]
    assert len(inferred) == 2  # batch 1 and 2: the chunk's shapes follow from them
    assert runner.plan.tensors == model.infer(runner.chunk)  # which infers for real, to compare
    assert len(inferred) == 3
