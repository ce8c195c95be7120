"""The layout plugins on the CPU: every case of layout_cases against onnxruntime (the numpy reference
as the CPU device's kernels), at the plan's batch, in chunks and at batch 1; the reasons they give
for nodes they leave to onnxruntime; the buffer-assignment decisions (which producers write into
their Concat's slice, which Concats are gone); the channel shuffle as one Transpose between views;
and every kernel source compiled offline with NVRTC."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from layout_cases import (CASES, INT_MAX, channel_shuffle, concat_as_output, dense_block, i64, inception_like, nested_concats,
                          random_feeds, single_node)
from onnx_builders import save
from opplugin.gpu.device import CPU, Device
from opplugin.cli import main
from opplugin.errors import PluginError
from opplugin.lab import nvrtc_check
from opplugin.graph.model import load_model
from opplugin.ops.layout import kernels as layout_kernels
from opplugin.ops.layout.plugin import gather_pieces, moves_innermost, slice_pieces, transpose_pieces
from opplugin.plan.partition import make_plan
from opplugin.registry import Kernel, plugins
from opplugin.runtime import Runner
from opplugin.runtime.buffers import assign_buffers


def onnxruntime_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_same(ours, theirs, linear):
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    if linear:
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", list(CASES))
def test_each_layout_case_runs_as_a_plugin_step_and_matches_onnxruntime(name, tmp_path):
    model = CASES[name]()
    path = save(model, tmp_path / "m.onnx")
    outputs = [o.name for o in model.graph.output]
    for batch, chunk in [(3, None), (5, 2), (1, None)]:
        runner = Runner(load_model(path), batch, "cpu", chunk=chunk)
        assert [s.kind for s in runner.plan.steps] == ["plugin"], runner.plan.fallbacks
        feeds = random_feeds(model, batch, seed=batch)
        result = runner.run(feeds)
        for name_out, theirs in zip(outputs, onnxruntime_outputs(model, feeds)):
            assert_same(result.outputs[name_out], theirs, "linear" in name)


def _reason(model, tmp_path) -> str:
    plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 2, CPU)
    assert [s.kind for s in plan.steps] == ["onnxruntime"]
    [reason] = plan.fallbacks.values()
    return reason


@pytest.mark.parametrize("case, cpu, gpu", [
    ("transpose_nchw_nhwc", "transpose.reference.perm0231", "transpose.cuda.tiled.perm0231"),
    ("transpose_shuffle_5d", "transpose.reference.perm02134", "transpose.cuda.perm02134"),
    ("concat_channels_4", "concat.reference.axis1x4", "concat.cuda.axis1x4"),
    ("resize_linear_half_pixel_x2", "resize.reference.linear.half_pixel", "resize.cuda.linear.half_pixel"),
    ("pad_reflect", "pad.reference.reflect", "pad.cuda.reflect"),
    ("gather_table_rows", "gather.reference.axis1.table", "gather.cuda.axis1.table"),
])
def test_kernel_names_say_the_form_of_the_kernel(case, cpu, gpu, tmp_path):
    for device, name in [(CPU, cpu), (GPU, gpu)]:
        plan = make_plan(load_model(save(CASES[case](), tmp_path / "m.onnx")), 2, device)
        [step] = plan.steps
        assert step.plugin.kernel_name(step.node, device) == name
    assert step.build(CPU).name == cpu  # the name build gives is the one the plan shows


def test_a_transpose_that_moves_only_axes_of_extent_one_is_a_view(tmp_path):
    model = single_node("Transpose", [(2, 1, 5, 1, 7)], {"perm": [0, 3, 2, 1, 4]})
    for device in (CPU, GPU):
        plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 2, device)
        [step] = plan.steps
        assert step.plugin.kernel_name(step.node, device) == "view.transpose"
    kernel = step.build(CPU)
    assert kernel.name == "view.transpose" and not kernel.device_work
    feeds = random_feeds(model, 2)
    ours = kernel([feeds["x0"]])[0]
    assert np.shares_memory(ours, feeds["x0"])
    np.testing.assert_array_equal(ours, onnxruntime_outputs(model, feeds)[0])


def test_nodes_the_layout_plugins_leave_to_onnxruntime_say_why(tmp_path):
    x = (2, 3, 4, 5)
    cubic = single_node("Resize", [x], {"mode": "cubic"}, constants=[None, np.asarray([1, 1, 2, 2], np.float32)])
    assert "mode 'cubic' is not one of nearest, linear" in _reason(cubic, tmp_path)
    channels = single_node("Resize", [x], {"mode": "nearest"}, constants=[None, np.asarray([1, 2, 1, 1], np.float32)])
    assert "the last two axes only" in _reason(channels, tmp_path)
    wide = single_node("Pad", [x], {"mode": "reflect"}, constants=[i64(0, 0, 0, 5, 0, 0, 0, 0)])
    assert "reflect padding wider than its axis" in _reason(wide, tmp_path)
    crop = single_node("Pad", [x], {"mode": "edge"}, constants=[i64(0, 0, -1, 0, 0, 0, 0, 0)])
    assert "edge padding with negative pads (a crop) is left to onnxruntime" in _reason(crop, tmp_path)
    outside = single_node("Gather", [x], {"axis": 1}, constants=[i64(3)])
    assert "outside axis 1 of extent 3" in _reason(outside, tmp_path)


def test_a_concat_of_integers_is_left_to_onnxruntime_with_its_reason(tmp_path):
    nodes = [helper.make_node("Cast", ["x0"], ["whole"], name="cast", to=onnx.TensorProto.INT64),
             helper.make_node("Concat", ["whole", "tail"], ["y0"], name="concat", axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y0", onnx.TensorProto.INT64, ["N", 5])],
                              initializer=[numpy_helper.from_array(np.full((2, 1), 7, np.int64), "tail")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 2, CPU)
    assert plan.fallbacks["concat"] == "whole is int64; the layout kernels move float32 tensors"


def test_shape_arithmetic_before_a_reshape_stays_off_the_views(tmp_path):
    """TorchScript's exports compute a Reshape's target as Shape > Gather > Unsqueeze > Concat (int64): the
    Unsqueeze and Concat views and kernels take float32 data only, so that arithmetic is left alone."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
             helper.make_node("Concat", ["n1", "rest"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4, 3, 3])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2, 2, 9])],
                              initializer=[numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
                                           numpy_helper.from_array(i64(0), "axes"), numpy_helper.from_array(i64(2, 2, 9), "rest")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    runner = Runner(load_model(save(model, tmp_path / "m.onnx")), 3, "cpu")
    assert not any(s.kind == "plugin" and s.node.op_type in ("Unsqueeze", "Concat") for s in runner.plan.steps)
    x = np.random.default_rng(0).standard_normal((3, 4, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(runner.run({"x": x}).outputs["y"], x.reshape(3, 2, 2, 9))


def test_inputs_computed_at_run_time_are_named_in_the_reason(tmp_path):
    """A Slice's starts or a Pad's pads must be constants (after the plan's folding): else the reason names them."""
    for case, why in [("slice_step2", "its starts (input 1) is computed at run time"),
                      ("pad_constant", "its pads (input 1) is computed at run time")]:
        plan = make_plan(load_model(save(CASES[case](), tmp_path / "m.onnx")), 2, CPU)
        [step] = plan.steps
        node = dataclasses.replace(step.node, constants={}, spec=None)
        assert why in step.plugin.supports(node, CPU)


# --- buffer assignment -------------------------------------------------------------------------------------


def _runner(model, tmp_path, batch=3, chunk=None, registry=None):
    return Runner(load_model(save(model, tmp_path / "m.onnx")), batch, "cpu", chunk=chunk, registry=registry)


def test_nested_concats_are_written_in_place_and_both_concat_steps_launch_nothing(tmp_path):
    runner = _runner(nested_concats(), tmp_path)
    slots = runner.buffers.slots
    assert {name: (s.buffer, s.start, s.stop) for name, s in slots.items()} == {
        "t": ("inner", 0, 3), "s": ("inner", 3, 6), "inner": ("outer", 0, 6), "r": ("outer", 6, 9)}
    assert runner.buffers.removed(runner.plan) == ["concat_inner", "concat_outer"]
    for step in ("concat_inner", "concat_outer"):  # what the report shows: no device work, no bytes
        kernel = runner.kernels[step]
        assert kernel.name == "concat.reference.axis1x2(written in place)" and not kernel.device_work and kernel.bytes_moved(3) == 0
    for batch, chunk in [(3, None), (7, 3)]:
        runner = _runner(nested_concats(), tmp_path, batch, chunk)
        feeds = random_feeds(nested_concats(), batch, seed=chunk or 0)
        np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(nested_concats(), feeds)[0])


def test_a_concat_written_in_place_as_the_graph_output_in_chunks_and_checked_step_by_step(tmp_path, capsys):
    model = concat_as_output()
    for batch, chunk in [(3, None), (7, 2)]:
        runner = _runner(model, tmp_path, batch, chunk)
        assert runner.buffers.removed(runner.plan) == ["concat"] and runner.chunks_for(batch) == (4 if chunk else 1)
        feeds = random_feeds(model, batch, seed=batch)
        np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(model, feeds)[0])
    assert main(["check", str(tmp_path / "m.onnx"), "--batch", "5"]) == 0
    assert "concat.reference.axis1x2(written in place)" in capsys.readouterr().out


def test_only_single_use_inputs_from_kernels_that_take_out_are_written_in_place(tmp_path):
    """inception_like's Concat reads a Conv (the CPU's reference Conv takes no `out`), a cropped Pad (a Slice:
    in place), a Transpose's output twice (copied) and the graph input (copied): one input in place, the
    Concat kernel copies the other four."""
    model = inception_like()
    runner = _runner(model, tmp_path)
    assert set(runner.buffers.slots) == {"branch2s"}
    [(index, copier)] = runner.buffers.concats.items()
    assert runner.plan.steps[index].name == "concat" and copier.skip == frozenset({1})
    assert runner.kernels["concat"].name == "concat.reference.axis1x5(copies 4 of 5)" and runner.kernels["concat"].device_work
    feeds = random_feeds(model, 3)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5)


class _Contiguous(Kernel):
    """A stand-in kernel that takes a C-contiguous `out` only (as the Conv kernels do)."""

    out_view = "contiguous"


def test_a_producer_that_writes_contiguous_outputs_only_gets_a_slice_when_the_rows_before_the_axis_are_one(tmp_path):
    for batch, expected in [(1, {"branch1", "branch2s"}), (2, {"branch2s"})]:
        plan = make_plan(load_model(save(inception_like(), tmp_path / "m.onnx")), batch, CPU)
        kernels = {step.name: step.build(CPU) for step in plan.plugin_steps}
        kernels["conv"] = _Contiguous()
        assert set(assign_buffers(plan, kernels).slots) == expected


def test_a_kernel_that_ignores_out_is_a_clear_error(tmp_path):
    runner = _runner(nested_concats(), tmp_path)
    swap = runner.kernels["swap_hw"]

    class IgnoresOut(type(swap)):
        def __call__(self, inputs, stream=None, *, out=None):
            return swap(inputs, stream)  # a new array, not `out`

    bad = IgnoresOut.__new__(IgnoresOut)
    bad.__dict__.update(swap.__dict__)
    runner.kernels["swap_hw"] = bad
    with pytest.raises(PluginError, match="was handed its output's place in a Concat .out=. but returned another array"):
        runner.run(random_feeds(nested_concats(), 3))


def test_an_onnxruntime_step_between_a_producer_and_its_concat_keeps_the_copy(tmp_path):
    registry = {op: plugin for op, plugin in plugins().items() if op != "Pad"}  # the Pad runs in onnxruntime
    runner = _runner(nested_concats(), tmp_path, registry=registry)
    kinds = {step.name: step.kind for step in runner.plan.steps}
    assert kinds["onnxruntime1"] == "onnxruntime"
    assert set(runner.buffers.slots) == {"s", "inner", "r"}  # not t: written before the onnxruntime step
    assert runner.buffers.removed(runner.plan) == ["concat_outer"]
    feeds = random_feeds(nested_concats(), 3)
    np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(nested_concats(), feeds)[0])


def test_dense_block_features_read_by_several_concats(tmp_path):
    model = dense_block()
    plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 1, CPU)
    kernels = {step.name: step.build(CPU) for step in plan.plugin_steps}
    for step in plan.plugin_steps:
        if step.node.op_type == "Conv":
            kernels[step.name] = _Contiguous()
    slots = assign_buffers(plan, kernels).slots
    # each layer's output goes into the first Concat that reads it; the later Concats copy it from there
    assert {name: slot.buffer for name, slot in slots.items()} == {"f0": "cat1", "f1": "cat2", "f2": "y"}
    runner = _runner(model, tmp_path, batch=4, chunk=2)
    feeds = random_feeds(model, 4)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_dense_block_concats_read_by_elementwise_ops_share_one_buffer_and_copy_each_feature_once(tmp_path):
    """Each Concat of the block is a prefix of the next one's inputs and read only by a Relu (which reads
    views): all are views of the block output's buffer, so each Concat copies only its newest input. (The
    first, a Concat of the block input alone, is dropped at load: the first Relu reads x.)"""
    model = dense_block(layers=3, pre_activation=True)
    runner = _runner(model, tmp_path, batch=4)
    assert "concat0" not in {s.name for s in runner.plan.steps}
    slots = {name: (s.buffer, s.start, s.stop) for name, s in runner.buffers.slots.items()}
    assert slots == {"cat1": ("cat2", 0, 7), "cat2": ("y", 0, 10)}
    copied = {runner.plan.steps[i].name: copier.skip if copier else "all in place" for i, copier in runner.buffers.concats.items()}
    # concat1 (of x, a graph input, and f0) is a plain Concat writing its output into cat2's buffer
    assert copied == {"concat2": frozenset({0, 1}), "concat_out": frozenset({0, 1, 2})}
    for batch, chunk in [(4, None), (5, 2)]:
        runner = _runner(model, tmp_path, batch, chunk)
        feeds = random_feeds(model, batch, seed=batch)
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_channel_shuffle_is_one_transpose_between_two_views(tmp_path):
    runner = _runner(channel_shuffle(), tmp_path)
    steps = runner.plan.steps
    # the Reshape before the Transpose is read as a view by its step; the one after writes the graph output
    assert [s.ops for s in steps] == [["Transpose"], ["Reshape"]] and [n.op_type for n in steps[0].view_nodes] == ["Reshape"]
    assert [runner.kernels[s.name].device_work for s in steps] == [True, False]
    feeds = random_feeds(channel_shuffle(), 3)
    np.testing.assert_array_equal(runner.run(feeds).outputs["y"], onnxruntime_outputs(channel_shuffle(), feeds)[0])


# --- the CUDA sources, compiled offline ---------------------------------------------------------------------

GPU = Device("cuda", "offline", "9.0")


def _device_compiles(name, tmp_path):
    """(source or file, defines, function) of what the case's CUDA kernel would launch at batch 3."""
    model = CASES[name]()
    plan = make_plan(load_model(save(model, tmp_path / "m.onnx")), 3, GPU)
    [step] = plan.steps
    node, spec = step.node, step.node.spec
    shape = tuple(node.inputs[0].shape)
    op = node.op_type
    if op == "Transpose" and moves_innermost(spec, shape):
        merged, perm = layout_kernels.merged_axes(shape, spec.perm)
        out = tuple(merged[p] for p in perm)
        return [("layout_transpose.cu", layout_kernels.transpose_defines(merged, perm, layout_kernels.contiguous_strides(out)),
                 "layout_transpose")]
    if op == "Gather" and spec.table is not None:
        inner = int(np.prod(shape[spec.axis + 1:]))
        return [("layout_rows.cu", {"INNER": inner, "COUNT": len(spec.table), "AXIS": shape[spec.axis], "VEC": vec}, "layout_rows")
                for vec in ((1, 4) if inner % 4 == 0 else (1,))]
    if op in ("Transpose", "Slice", "Split", "Gather"):
        pieces = transpose_pieces(spec)(shape) if op == "Transpose" else gather_pieces(spec)(shape) if op == "Gather" else \
            slice_pieces(spec.slices if op == "Split" else (lambda s: [spec.slices(s)]))(shape)
        return [("layout_gather.cu", layout_kernels.gather_defines(out, base, strides, layout_kernels.contiguous_strides(out), False),
                 "layout_gather") for out, base, strides in pieces]
    if op == "Pad":
        out = spec.output_shape(shape)
        return [("layout_pad.cu", layout_kernels.pad_defines(spec, shape, out, layout_kernels.contiguous_strides(out)), "layout_pad")]
    if op == "Resize":
        return [("layout_resize.cu", layout_kernels.resize_defines(spec, shape, spec.output_shape(shape)), "layout_resize")]
    if op == "Concat":
        out = spec.output_shape(shape)
        inner = int(np.prod(out[spec.axis + 1:]))
        rows = int(np.prod(out[spec.axis:]))
        segments = [(k, start, width) for k, (start, width) in enumerate(zip(spec.starts, spec.widths))]
        return [(layout_kernels.concat_source(segments, sum(spec.widths), inner, {k: w * inner for k, w in enumerate(spec.widths)},
                                              rows, wide), {}, "layout_concat") for wide in (False, True)]
    return []  # a view


@pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")
@pytest.mark.parametrize("name", list(CASES))
def test_every_layout_kernel_compiles_with_nvrtc_without_spills(name, tmp_path):
    from opplugin.gpu import cuda
    from opplugin.gpu.nvrtc import compile_cubin, parse_ptxas_log

    for source, defines, function in _device_compiles(name, tmp_path):
        if source.endswith(".cu"):
            usage = nvrtc_check.check_source(source, defines, function, "sm_90")
        else:
            _cubin, log = compile_cubin(source, cuda.BASE_OPTIONS, "sm_90")
            usage = parse_ptxas_log(log, "sm_90")[function]
        assert usage.spill_stores == 0 and usage.stack_frame == 0, usage


# --- random sweeps: the reference (the CPU device's kernels) and the CUDA kernels' index plans ------------------


def _emulated_gather(x: np.ndarray, shape, base, strides) -> np.ndarray:
    """What kernels/layout_gather.cu computes for a C-contiguous x: out[c] = x.flat[base + sum c_d * strides_d]."""
    index = base + sum(np.indices(shape, dtype=np.int64)[d] * s for d, s in enumerate(strides)) if shape else np.int64(base)
    return x.reshape(-1)[index] if x.size else np.zeros(shape, np.float32)


def _random_slice(rng, shape):
    axes = sorted(rng.choice(len(shape), size=rng.integers(1, len(shape) + 1), replace=False))
    starts, ends, steps = [], [], []
    for axis in axes:
        extent = shape[axis]
        step = int(rng.choice([1, 2, 3, -1, -2]))
        start = int(rng.integers(-extent - 2, extent + 2))
        end = int(rng.choice([rng.integers(-extent - 2, extent + 2), INT_MAX if step > 0 else -INT_MAX]))
        starts.append(start), ends.append(end), steps.append(step)
    return i64(*starts), i64(*ends), i64(*[a - len(shape) if rng.random() < 0.5 else a for a in axes]), i64(*steps)


@pytest.mark.parametrize("seed", range(40))
def test_random_slices_and_transposes_match_onnxruntime_in_the_reference_and_in_the_kernels_index_plans(seed, tmp_path):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 7, size=rng.integers(2, 6)))
    perm = [0, *(1 + rng.permutation(len(shape) - 1))]
    models = {"slice": single_node("Slice", [shape], constants=list(_random_slice(rng, shape))),
              "transpose": single_node("Transpose", [shape], {"perm": [int(p) for p in perm]})}
    for op, model in models.items():
        plan = make_plan(load_model(save(model, tmp_path / f"{op}.onnx")), shape[0], CPU)
        [step] = plan.steps
        assert step.kind == "plugin", plan.fallbacks
        feeds = random_feeds(model, shape[0], seed=seed)
        expected = onnxruntime_outputs(model, feeds)[0]
        np.testing.assert_array_equal(step.build(CPU)(list(feeds.values()))[0], expected)
        spec, x = step.node.spec, feeds["x0"]
        [(out_shape, base, strides)] = (slice_pieces(lambda s: [spec.slices(s)]) if op == "slice" else transpose_pieces(spec))(shape)
        np.testing.assert_array_equal(_emulated_gather(x, out_shape, base, strides), expected)
        if op == "transpose":  # the tiled kernel's view of it: merged axes, the same transpose
            merged, merged_perm = layout_kernels.merged_axes(shape, spec.perm)
            np.testing.assert_array_equal(np.transpose(x.reshape(merged), merged_perm).reshape(expected.shape), expected)


@pytest.mark.parametrize("seed", range(20))
def test_random_gathers_of_even_index_runs_match_onnxruntime_in_the_reference_and_the_kernels_index_plan(seed, tmp_path):
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 7, size=rng.integers(2, 6)))
    axis = int(rng.integers(1, len(shape)))
    extent = shape[axis]
    step = int(rng.choice([1, 2, -1, -2, 0]))
    count = int(rng.integers(1, extent + 1)) if step == 0 else max(1, min(extent, int(rng.integers(1, 5))) // max(1, abs(step)))
    first = int(rng.integers(0, extent)) if step == 0 else (int(rng.integers(0, extent - abs(step) * (count - 1))) if step > 0 else
                                                             int(rng.integers(abs(step) * (count - 1), extent)))
    indices = first + step * np.arange(count)
    indices = np.where(rng.random(count) < 0.5, indices - extent, indices)  # negative indices count from the end
    index_shape = [(), (count,), (1, count)][int(rng.integers(0, 3))] if count == 1 else [(count,), (1, count)][int(rng.integers(0, 2))]
    indices = np.asarray(indices, np.int64).reshape(index_shape)
    model = single_node("Gather", [shape], {"axis": axis - len(shape) if rng.random() < 0.5 else axis}, constants=[indices])
    plan = make_plan(load_model(save(model, tmp_path / "gather.onnx")), shape[0], CPU)
    [step_planned] = plan.steps
    assert step_planned.kind == "plugin", plan.fallbacks
    feeds = random_feeds(model, shape[0], seed=seed)
    expected = onnxruntime_outputs(model, feeds)[0]
    np.testing.assert_array_equal(step_planned.build(CPU)(list(feeds.values()))[0], expected)
    [(out_shape, base, strides)] = gather_pieces(step_planned.node.spec)(shape)
    np.testing.assert_array_equal(_emulated_gather(feeds["x0"], out_shape, base, strides), expected)


@pytest.mark.parametrize("seed", range(40))
def test_random_pads_and_resizes_match_onnxruntime(seed, tmp_path):
    rng = np.random.default_rng(100 + seed)
    shape = (2, int(rng.integers(1, 4)), int(rng.integers(2, 9)), int(rng.integers(2, 9)))
    mode = str(rng.choice(["constant", "reflect", "edge"]))
    limit = [min(3, d - 1) if mode == "reflect" else 3 for d in shape]
    low = -1 if mode == "constant" else 0
    pads = [0, *(int(rng.integers(low, limit[a] + 1)) for a in (1, 2, 3))] * 2
    pads[5] = int(rng.integers(0, limit[1] + 1))
    pad = single_node("Pad", [shape], {"mode": mode}, constants=[i64(*pads), np.asarray([rng.normal()], np.float32)[:1].reshape(())])
    resize_mode = str(rng.choice(["nearest", "linear"]))
    attributes = {"mode": resize_mode, "coordinate_transformation_mode": str(rng.choice(
        ["asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners"]))}
    if resize_mode == "nearest":
        attributes["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    scales = np.asarray([1, 1, *rng.choice([0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 1.3], size=2)], np.float32)
    resize = single_node("Resize", [shape], attributes, constants=[None, scales])
    for name, model in [("pad", pad), ("resize", resize)]:
        plan = make_plan(load_model(save(model, tmp_path / f"{name}.onnx")), 2, CPU)
        [step] = plan.steps
        assert step.kind == "plugin", plan.fallbacks
        feeds = random_feeds(model, 2, seed=seed)
        ours = step.build(CPU)([feeds["x0"]])[0]
        assert_same(ours, onnxruntime_outputs(model, feeds)[0], linear=name == "resize")
