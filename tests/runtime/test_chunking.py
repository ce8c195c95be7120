"""Batches in chunks on the CPU device: which models can be cut, chunk sizes, and
that a chunked run gives exactly what one piece gives, with one lane or several."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_builders import finish, save
from opplugin.runtime import chunking
from opplugin.errors import InputError, OutOfDeviceMemory, PluginError
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin
from opplugin.registry import Kernel
from opplugin.runtime import Runner


def test_layout_of_the_tiny_model(tiny_model_path):
    layout = chunking.probe_layout(load_model(tiny_model_path))
    assert layout.chunkable and layout.batched_inputs == {"x"}
    assert layout.sample_shapes["c1"] == (4, 12, 12) and layout.sample_shapes["y"] == (5,)
    assert "w1" not in layout.sample_shapes  # weights do not scale with the batch
    assert layout.shape_at("p1", 7) == (7, 4, 6, 6)
    assert layout.image_bytes("x") == 3 * 12 * 12 * 4 == layout.input_image_bytes()


def test_peak_bytes_follow_the_tensors_alive_at_once(tiny_model_path):
    model = load_model(tiny_model_path)
    # at relu1 both c1 and r1 (4x12x12 float32 each) are alive; x died after conv1
    assert chunking.peak_image_bytes(model, chunking.probe_layout(model)) == 2 * 4 * 12 * 12 * 4


def _reshape_model():
    """x [N,3,4,4] > Reshape [-1,3,4,2] (first axis 2N) > Conv 1x1 > Reshape [-1,5,4,4]."""
    w = np.random.default_rng(0).standard_normal((5, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "s1"], ["r"], name="fold"),
        helper.make_node("Conv", ["r", "w"], ["c"], name="conv"),
        helper.make_node("Reshape", ["c", "s2"], ["y"], name="unfold"),
    ]
    graph = helper.make_graph(
        nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 4, 4])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([-1, 3, 4, 2]), "s1"),
                     numpy_helper.from_array(np.array([-1, 5, 4, 4]), "s2")],
    )
    return finish(graph)


def test_a_model_whose_steps_exchange_unbatched_tensors_runs_in_one_piece(tmp_path):
    path = save(_reshape_model(), tmp_path / "reshape.onnx")
    runner = Runner(load_model(path), 3, "cpu", chunk=1)
    assert not runner.layout.chunkable and "'c'" in runner.layout.unchunkable  # r is read by conv as a view
    x = np.random.default_rng(1).standard_normal((3, 3, 4, 4)).astype(np.float32)
    result = runner.run({"x": x})
    assert result.chunks == 1
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(result.outputs["y"], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="does not have the batch"):
        runner.run({"x": np.ones((4, 3, 4, 4), np.float32)})


@pytest.mark.parametrize(
    "batch, image_bytes, expected",
    [
        (100, 30000, 100),  # 3 MB in all: one piece
        (10000, 29584, 2268),  # lenet86: chunks of about 64 MiB of input
        (100000, 29584, 2268),
        (10000, 3136, 2500),  # ece408: 31 MB in all, still four chunks
        (1, 10**9, 1),
    ],
)
def test_pipeline_chunk(batch, image_bytes, expected):
    assert chunking.pipeline_chunk(batch, image_bytes) == expected


@pytest.mark.parametrize(
    "batch, image_bytes, nodes, expected",
    [
        (10000, 29584, 8, 2268),  # lenet86: its 296 MB take far longer to copy than 4 chunks' host work
        (10000, 3136, 7, 2500),  # ece408_high: 31 MB, still worth a pipeline
        (32, 602112, 49, 32),  # ResNet-18 at batch 32: 19 MB copy quicker than 4 x 49 steps of Python
        (512, 602112, 49, 111),  # at batch 512 the copy is long enough again: chunks of 64 MiB
    ],
)
def test_pipeline_chunk_weighs_the_copy_against_the_host_work_of_more_chunks(batch, image_bytes, nodes, expected):
    assert chunking.pipeline_chunk(batch, image_bytes, nodes) == expected


def test_memory_chunk_leaves_room_for_workspaces():
    assert chunking.memory_chunk(1000, 10) == 100
    assert chunking.memory_chunk(1000, 10, lambda n: 5 * n) == 66
    assert chunking.memory_chunk(1000, 10, lambda n: 10**6) == 1  # never below one image
    assert chunking.memory_chunk(5, 10) == 1


def test_split_rows():
    assert chunking.split_rows(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert chunking.split_rows(3, 8) == [slice(0, 3)]
    with pytest.raises(InputError):
        chunking.split_rows(0, 4)


@pytest.mark.parametrize("name", ["lenet86", "ece408_high"])
@pytest.mark.parametrize("chunk, streams", [(7, 1), (7, 3), (1, 2)])
def test_chunked_runs_are_identical_to_one_piece(name, chunk, streams):
    model = load_model(name)
    feeds = make_inputs(model, 23).feeds
    whole_runner = Runner(model, 23, "cpu")
    keep = tuple(o for step in whole_runner.plan.plugin_steps for o in step.outputs)
    whole = whole_runner.run(feeds, keep=keep, step_times=True)
    chunked = Runner(model, 23, "cpu", chunk=chunk, streams=streams).run(feeds, keep=keep, step_times=True)
    assert whole.chunks == 1 and chunked.chunks == -(-23 // chunk)
    for name in whole.outputs:
        np.testing.assert_array_equal(chunked.outputs[name], whole.outputs[name])
    for name in keep:
        np.testing.assert_array_equal(chunked.kept[name], whole.kept[name])
    # per-step times are summed over the chunks, in execution order
    assert [t.name for t in chunked.times] == [t.name for t in whole.times]


class _ChunkLimitedKernel(Kernel):
    """The reference Conv, raising MemoryError (as CuPy's OutOfMemoryError is) above a batch."""

    def __init__(self, inner, limit, calls):
        self.inner, self.limit, self.calls, self.name = inner, limit, calls, inner.name

    def flops(self, batch):
        return self.inner.flops(batch)

    def bytes_moved(self, batch):
        return self.inner.bytes_moved(batch)

    def __call__(self, inputs, stream=None):
        self.calls.append(inputs[0].shape[0])
        if inputs[0].shape[0] > self.limit:
            raise MemoryError(f"out of memory allocating a batch of {inputs[0].shape[0]}")
        return self.inner(inputs, stream)


class _LimitedConv(ConvPlugin):
    def __init__(self, limit):
        self.limit, self.calls = limit, []

    def build(self, node, device, variant=None, **options):
        return _ChunkLimitedKernel(super().build(node, device, variant, **options), self.limit, self.calls)


@pytest.mark.parametrize("streams", [1, 3])
def test_out_of_memory_halves_the_chunk_until_it_fits(tiny_model_path, streams):
    model = load_model(tiny_model_path)
    plugin = _LimitedConv(limit=3)
    runner = Runner(model, 16, "cpu", registry={"Conv": plugin}, chunk=16, streams=streams)
    feeds = {"x": np.random.default_rng(2).uniform(-1, 1, (16, 3, 12, 12)).astype(np.float32)}
    result = runner.run(feeds)
    assert runner.chunk == 2 and runner.chunk_retries == 3 and result.chunks == 8
    expected = ort.InferenceSession(tiny_model_path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(result.outputs["y"], expected, rtol=1e-5, atol=1e-6)
    runner.run(feeds)  # the smaller chunk stays: no retry the second time
    assert runner.chunk_retries == 3


def test_out_of_memory_at_one_image_is_a_clear_error(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cpu", registry={"Conv": _LimitedConv(limit=0)})
    feeds = {"x": np.ones((4, 3, 12, 12), np.float32)}
    with pytest.raises(OutOfDeviceMemory, match="even with chunks of 1 image"):
        runner.run(feeds)


class _FailingKernel(_ChunkLimitedKernel):
    def __call__(self, inputs, stream=None):
        if inputs[0].shape[0] > self.limit:
            raise PluginError("the kernel broke")
        return self.inner(inputs, stream)


class _FailingConv(_LimitedConv):
    def build(self, node, device, variant=None, **options):
        return _FailingKernel(ConvPlugin.build(self, node, device, variant, **options), self.limit, self.calls)


def test_an_error_in_one_lane_stops_the_run_and_is_raised(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 12, "cpu", registry={"Conv": _FailingConv(limit=1)}, chunk=2, streams=3)
    with pytest.raises(PluginError, match="the kernel broke"):
        runner.run({"x": np.ones((12, 3, 12, 12), np.float32)})
    assert runner.chunk == 2  # not an out-of-memory: no retry


def test_check_steps_returns_a_new_layout_and_leaves_the_one_passed_in_alone(tiny_model_path):
    layout = chunking.probe_layout(load_model(tiny_model_path))
    checked = chunking.check_steps(layout, ["x", "not_batched"], [])
    assert layout.chunkable and not checked.chunkable and "'not_batched'" in checked.unchunkable
    assert chunking.check_steps(layout, ["x", "w"], ["w"]) is layout


def test_the_shapes_at_any_batch_follow_from_the_probes_where_every_tensor_scales_or_stays(tiny_model_path, tmp_path):
    for model in (load_model(tiny_model_path), load_model("lenet86")):
        layout = chunking.probe_layout(model)
        assert chunking.tensors_at(model, layout, 7) == model.infer(7)
    reshape = load_model(save(_reshape_model(), tmp_path / "reshape.onnx"))  # 'r' has 2N rows: neither
    assert chunking.tensors_at(reshape, chunking.probe_layout(reshape), 7) is None


@pytest.mark.parametrize("batch, chunk, copied, sizes", [
    (10000, 2268, True, [2268, 2268, 2268, 1598, 799, 567, 232]),  # lenet86's pipeline on an H200
    (4500, 1000, True, [1000, 1000, 1000, 750, 375, 250, 125]),
    (9, 3, True, [3, 3, 3]),  # too few chunks to be a pipeline
    (10, 4, True, [4, 4, 2]),
    (10000, 2268, False, [2268, 2268, 2268, 2268, 928]),  # on the host: nothing to copy, equal chunks
    (16, 16, True, [16]),
])
def test_a_pipelined_batch_ends_in_halving_chunks(batch, chunk, copied, sizes):
    rows = chunking.run_rows(batch, chunk, copied)
    assert [r.stop - r.start for r in rows] == sizes
    assert rows[0].start == 0 and rows[-1].stop == batch and all(a.stop == b.start for a, b in zip(rows, rows[1:]))
