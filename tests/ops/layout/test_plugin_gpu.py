"""The layout kernels on the GPU: every case of layout_cases against onnxruntime CPU (copies exactly,
a linear resize within float32 rounding) on fresh random inputs, into poisoned (NaN) outputs, also at a
batch other than the plan's and into a strided view of a larger buffer (nothing outside its slice
written); whole models with Concats written in place, eager, in chunks on several lanes, and replayed
as CUDA graphs."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from layout_cases import (CASES, activations_concatenated, channel_shuffle, dense_block, inception_like, nested_concats,
                          random_feeds)
from onnx_builders import save
from opplugin.gpu.device import current_cuda_device
from opplugin.graph.model import load_model
from opplugin.ops.layout import reference
from opplugin.ops.layout.spec import TransposeSpec
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


def onnxruntime_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches(ours, theirs, linear):
    assert ours.shape == theirs.shape and not np.isnan(ours).any()
    if linear:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("batch", [3, 1])
def test_each_layout_kernel_matches_onnxruntime_into_poisoned_outputs_and_views(name, batch, tmp_path):
    import cupy

    model = CASES[name]()
    plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 3, current_cuda_device())
    [step] = plan.steps
    assert step.kind == "plugin", plan.fallbacks
    kernel = step.build(plan.device)
    feeds = random_feeds(model, batch, seed=batch)
    expected = onnxruntime_outputs(model, feeds)
    args = [cupy.asarray(feeds[n]) if n in feeds else cupy.asarray(plan.model.initializers[n]) if n else None for n in step.inputs]
    linear = "linear" in name
    for ours, theirs in zip(kernel(args), expected):
        assert_matches(cupy.asnumpy(ours), theirs, linear)
    mode = kernel.out_view
    if len(expected) != 1 or not mode:
        return
    shape = expected[0].shape
    poisoned = cupy.full(shape, np.nan, dtype=cupy.float32)
    [ours] = kernel(args, out=poisoned)
    assert ours is poisoned
    assert_matches(cupy.asnumpy(poisoned), expected[0], linear)
    if mode == "strided" and len(shape) >= 2:
        wider = cupy.full((shape[0], shape[1] + 5, *shape[2:]), np.nan, dtype=cupy.float32)
        kernel(args, out=wider[:, 2:2 + shape[1]])
        host = cupy.asnumpy(wider)
        assert_matches(host[:, 2:2 + shape[1]], expected[0], linear)
        assert np.isnan(host[:, :2]).all() and np.isnan(host[:, 2 + shape[1]:]).all()


@pytest.mark.parametrize("shape, perm", [((8, 96, 56, 56), (0, 2, 3, 1)), ((8, 56, 56, 96), (0, 3, 1, 2)),
                                         ((3, 33, 31, 47), (0, 3, 2, 1)), ((5, 7, 200), (2, 0, 1))])
def test_tiled_transpose_against_numpy_on_large_and_odd_shapes(shape, perm):
    import cupy

    from opplugin.ops.layout.kernels import TransposeTileKernel

    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    kernel = TransposeTileKernel("transpose", 0, perm)
    out = cupy.full(tuple(shape[p] for p in perm), np.nan, dtype=cupy.float32)
    kernel([cupy.asarray(x)], out=out)
    np.testing.assert_array_equal(cupy.asnumpy(out), reference.transpose(TransposeSpec(perm), x))


MODELS = {"nested": nested_concats, "inception": inception_like, "dense": dense_block, "shuffle": channel_shuffle,
          "activations": activations_concatenated, "dense_preactivation": lambda: dense_block(pre_activation=True)}


@pytest.mark.parametrize("name", list(MODELS))
def test_models_with_concats_written_in_place_eager_chunked_and_in_cuda_graphs(name, tmp_path):
    model = MODELS[name]()
    loaded = load_model(save(model, tmp_path / "m.onnx"))
    runners = {
        "eager": Runner(loaded, 6, "cuda", streams=1),
        "chunked": Runner(loaded, 7, "cuda", chunk=3, streams=2),
        "graphs": Runner(loaded, 6, "cuda", chunk=6, streams=1, cuda_graphs=True),
        "graphs_batch1": Runner(loaded, 1, "cuda", chunk=1, streams=1, cuda_graphs=True),
    }
    for how, runner in runners.items():
        assert all(step.kind == "plugin" for step in runner.plan.steps), runner.plan.fallbacks
        for seed in range(3):  # graphs: pass 1 eager, 2 captured, 3 replayed on new inputs
            feeds = random_feeds(model, runner.batch, seed=seed)
            out = runner.run(feeds).outputs["y"]
            np.testing.assert_allclose(out, onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5, err_msg=f"{how} pass {seed}")
        if how.startswith("graphs"):
            assert not runner.graph_failures() and out is not None


def test_which_producers_write_in_place_on_the_gpu(tmp_path):
    """Strided producers (layout and pointwise kernels) at any batch; a Conv (contiguous `out` only) where the slice is
    contiguous: at batch 1, not at 6."""
    loaded = load_model(save(nested_concats(), tmp_path / "nested.onnx"))
    runner = Runner(loaded, 6, "cuda", streams=1)
    assert runner.buffers.removed(runner.plan) == ["concat_inner", "concat_outer"]
    runner = Runner(load_model(save(activations_concatenated(), tmp_path / "act.onnx")), 6, "cuda", streams=1)
    assert set(runner.buffers.slots) == {"s", "t"} and runner.buffers.removed(runner.plan) == ["concat"]
    runner = Runner(load_model(save(dense_block(pre_activation=True), tmp_path / "dense.onnx")), 6, "cuda", streams=1)
    # (the block's first Concat, of one input, is dropped at load)
    assert {name: slot.buffer for name, slot in runner.buffers.slots.items()} == {"cat1": "cat2", "cat2": "y"}
    loaded = load_model(save(inception_like(), tmp_path / "inception.onnx"))
    at6 = Runner(loaded, 6, "cuda", chunk=6, streams=1).buffers
    at1 = Runner(loaded, 1, "cuda", chunk=1, streams=1).buffers
    assert set(at6.slots) == {"branch2s"}
    assert set(at1.slots) == {"branch1", "branch2s"}
