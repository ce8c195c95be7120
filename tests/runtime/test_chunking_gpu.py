"""Chunks, streams, pinned memory and hard inputs on the GPU: results identical to
one piece, copies accounted for, NaN as onnxruntime has it, clear errors."""
import gc
import os
import tempfile

import numpy as np
import onnxruntime as ort
import pytest

from opplugin.gpu import cuda, dependent_launch
from opplugin.verify.check import compare
from opplugin.errors import KernelCompileError, OutOfDeviceMemory
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from nonfinite_cases import UnfusedConv, nan_through_fused_steps_without_pool, poisoned

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def lenet():
    model = load_model("lenet86")
    runner = Runner(model, 3000, "cuda", streams=3)
    return model, runner


def _onnxruntime(model, feeds, providers=("CPUExecutionProvider",)):
    session = ort.InferenceSession(model.proto.SerializeToString(), providers=list(providers))
    return session.run(None, feeds)[0]


def _assert_same_run(runner, actual, expected):
    """Bit for bit, except that onnxruntime's CUDA provider lets cuBLAS pick its GEMM
    algorithm per batch size, so its Gemm steps round differently per chunk size."""
    if runner.ort_on_gpu:
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-7)
    else:
        np.testing.assert_array_equal(actual, expected)


def test_chunked_runs_on_several_streams_are_identical_to_one_piece(lenet):
    model, runner = lenet
    feeds = make_inputs(model, 3000).feeds
    keep = tuple(o for step in runner.plan.plugin_steps for o in step.outputs)
    runner.chunk = 3000
    whole = runner.run(feeds, keep=keep)
    assert whole.chunks == 1
    for chunk in (512, 97):
        runner.chunk = chunk
        chunked = runner.run(feeds, keep=keep)
        assert chunked.chunks == runner.chunks_for(3000) > 3000 // chunk and chunked.streams == 3  # a halving tail
        for name in keep:  # the plugin steps: bit for bit, whatever the chunk
            np.testing.assert_array_equal(chunked.kept[name], whole.kept[name])
        _assert_same_run(runner, chunked.outputs["probabilities"], whole.outputs["probabilities"])
    assert compare(whole.outputs["probabilities"], _onnxruntime(model, feeds))["passed"]


def test_pinned_input_goes_up_without_staging_and_gives_the_same_result(lenet):
    model, runner = lenet
    runner.chunk = 512
    pageable = make_inputs(model, 3000)
    pinned = make_inputs(model, 3000, pinned=True)
    assert pinned.pinned and cuda.is_pinned(pinned.feeds["input"]) and not cuda.is_pinned(pageable.feeds["input"])
    slow, fast = runner.run(pageable.feeds, step_times=True), runner.run(pinned.feeds, step_times=True)
    np.testing.assert_array_equal(slow.outputs["probabilities"], fast.outputs["probabilities"])
    assert fast.input_pinned and not slow.input_pinned
    assert "stage H2D input" in [t.name for t in slow.times]
    assert "stage H2D input" not in [t.name for t in fast.times] and "copy H2D input" in [t.name for t in fast.times]
    for result in (slow, fast):
        assert result.copy_ms > 0 and result.copy_hidden_ms >= 0 and result.copy_exposed_ms >= 0
        assert result.copy_hidden_ms + result.copy_exposed_ms <= result.copy_ms + 1e-6
        assert result.total_ms > 0


def test_a_batch_beyond_the_runners_runs_in_more_chunks(lenet):
    model, runner = lenet
    runner.chunk = 1000
    feeds = make_inputs(model, 4500, "random", seed=9, pinned=True).feeds
    result = runner.run(feeds)
    assert result.batch == 4500 and result.chunks == runner.chunks_for(4500) == 7  # 1000 x 3, then 750, 375, 250, 125
    verdict = compare(result.outputs["probabilities"], _onnxruntime(model, feeds))
    assert verdict["passed"], verdict


def test_out_of_memory_halves_the_chunk_then_fails_clearly(lenet):
    import cupy

    model, runner = lenet
    feeds = make_inputs(model, 2000).feeds
    runner.chunk = 2000
    expected = runner.run(feeds).outputs["probabilities"]
    pool = cupy.get_default_memory_pool()
    # arrays of earlier tests that wait in reference cycles would be freed inside the
    # run, giving it room beyond the limits set here: collect them first
    gc.collect()
    pool.free_all_blocks()
    try:
        # room for a few hundred images' tensors, not for 2,000
        pool.set_limit(size=pool.used_bytes() + 24 * 2**20)
        runner.chunk, runner.chunk_retries = 2000, 0
        result = runner.run(feeds)
        assert runner.chunk_retries >= 1 and result.chunks > 1
        _assert_same_run(runner, result.outputs["probabilities"], expected)
        # a runner that has run holds its CUDA graphs and their buffers, and may need no new memory
        # at all: a fresh one (its weights on the device already) must find none for a chunk
        fresh = Runner(model, 3000, "cuda", streams=3)
        gc.collect()
        pool.free_all_blocks()  # the limit counts the blocks the pool keeps for reuse too
        pool.set_limit(size=pool.used_bytes() + 1024)
        with pytest.raises(OutOfDeviceMemory, match="out of device memory even with chunks of 1 image"):
            fresh.run(feeds)
    finally:
        pool.set_limit(size=0)
    runner.chunk = 512
    _assert_same_run(runner, runner.run(feeds).outputs["probabilities"], expected)


def _nan_check(registry):
    model = load_model("lenet86")
    x = poisoned(make_inputs(model, 64, "random", seed=5).feeds["input"])
    runner = Runner(model, 64, "cuda", registry=registry, chunk=16)
    result = runner.run({"input": x})
    ours = result.outputs["probabilities"]
    # Unfused, the activation and MaxPool nodes run on the runner's onnxruntime, whose
    # CUDA provider has NaN rules of its own; the fused steps' exact path always takes
    # the CPU provider's (the reference), which is what a fused plan is held to.
    fused = any(step.fused for step in runner.plan.plugin_steps)
    reference = _onnxruntime(model, {"input": x}, ["CPUExecutionProvider"] if fused else runner.providers)
    assert np.isnan(reference).any()
    verdict = compare(ours, reference)
    assert verdict["passed"], verdict
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    return runner, result


def test_nan_and_inf_pass_through_the_cuda_kernels_as_in_onnxruntime():
    runner, result = _nan_check({"Conv": UnfusedConv()})
    # a 3xTF32 Conv (lenet86's conv2 at this batch) is watched: its poisoned chunk reruns on an exact variant
    watched = [runner.plan.steps[i].name for i in runner.exact.watched]
    assert all(not runner.kernels[name].nonfinite_exact for name in watched)
    assert result.exact_reruns == (1 if watched else 0)
    if watched:
        exact = runner.exact.split_executor()
        assert all(exact.kernels[name].nonfinite_exact for name in watched)


def test_nan_and_inf_through_fused_cuda_steps_as_in_onnxruntime():
    runner, result = _nan_check(None)
    assert any(step.fused for step in runner.plan.plugin_steps)
    assert result.exact_reruns == 1  # images 0..3, all in the first chunk of 16
    exact = runner.exact.split_executor()
    for step in exact.plan.plugin_steps:  # the same variants, built without the epilogue
        assert exact.kernels[step.name].variant == runner.kernels[step.name].variant


def test_fused_cuda_steps_without_a_pool_keep_onnxruntimes_nan_unwatched(tmp_path):
    nan_through_fused_steps_without_pool("cuda", tmp_path)


def test_finite_inputs_on_the_gpu_never_take_the_exact_path(lenet):
    model, runner = lenet
    runner.chunk = 512
    result = runner.run(make_inputs(model, 3000, "random", seed=3).feeds)
    assert result.chunks == runner.chunks_for(3000) and result.exact_reruns == 0 and not runner.exact.built


@pytest.mark.parametrize("activation", ["Relu", "Tanh"])
@pytest.mark.parametrize("pool", [2, 4])
@pytest.mark.parametrize("chunk", [None, 3])
def test_nan_and_inf_inside_pool_windows_on_the_gpu_as_in_onnxruntime(activation, pool, chunk, tmp_path):
    from onnx_builders import save
    from nonfinite_cases import poisoned_batch, pool_net, same_as_onnxruntime

    size = (12, 10)
    model = load_model(save(pool_net(activation, pool, size), tmp_path / "pool_net.onnx"))
    x, _ = poisoned_batch(pool, size)
    runner = Runner(model, len(x), "cuda", chunk=chunk)
    result = runner.run({"x": x}, keep=("p2",))
    with_p2 = pool_net(activation, pool, size, outputs=("p1", "y", "p2")).SerializeToString()
    p1, y, p2 = ort.InferenceSession(with_p2, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for ours, reference in ((result.outputs["p1"], p1), (result.outputs["y"], y), (result.kept["p2"], p2)):
        same_as_onnxruntime(ours, reference, rtol=1e-4, atol=1e-5)
    assert result.exact_reruns >= 1


def test_a_kernel_that_does_not_compile_names_its_source_options_and_log():
    with pytest.raises(KernelCompileError) as info:
        cuda.compile_module("conv_baseline.cu", {"C": "oops(", "BLOCK": 256})
    first = str(info.value).splitlines()[0]
    defines = " ".join(dependent_launch.compile_options() + ("-DC=oops(", "-DBLOCK=256"))
    assert first.startswith(f"kernel conv_baseline.cu failed to compile with NVRTC ({defines}): ")
    assert "error" in info.value.log and len(str(info.value).splitlines()) > 1


def test_a_view_step_is_timed_by_the_host_clock_not_by_events_around_nothing():
    from opplugin.runtime.timeline import DEVICE, HOST

    from layout_cases import channel_shuffle
    from onnx_builders import save

    # the Reshape writing the graph output stays a view step of its own (the one before is read as a view)
    with tempfile.TemporaryDirectory() as folder:
        model = load_model(save(channel_shuffle(), os.path.join(folder, "shuffle.onnx")))
    runner = Runner(model, 2, "cuda", chunk=2, streams=1)
    views = [s.name for s in runner.plan.plugin_steps if runner.kernels[s.name].name.startswith("view.")]
    result = runner.run(make_inputs(model, 2, "random").feeds, step_times=True)
    clocks = {span.name: span.clock for span in result.spans}
    assert views and all(clocks[name] == HOST for name in views)
    assert all(clocks[s.name] == DEVICE for s in runner.plan.plugin_steps if s.name not in views)
