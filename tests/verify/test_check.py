"""Comparison with onnxruntime: figures, pass/fail, and that a wrong kernel is caught."""
import numpy as np

from opplugin.verify.check import check, compare
from opplugin.graph.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin, ReferenceConvKernel
from opplugin.runtime import Runner


def _check(runner, feeds, *args, **kwargs):
    """check() of this runner on these feeds: its run, and its plan at their batch."""
    return check(runner.run, runner.plan_record(len(next(iter(feeds.values())))), feeds, *args, **kwargs)


def _feeds(batch):
    return {"x": np.random.default_rng(5).uniform(-1, 1, (batch, 3, 12, 12)).astype(np.float32)}


def test_compare_figures():
    expected = np.array([1.0, -2.0, 4.0], np.float32)
    good = compare(expected + 1e-6, expected)
    assert good["passed"] and good["max_abs_error"] < 2e-6 and good["rel_l2"] < 1e-6
    bad = compare(expected * 1.1, expected)
    assert not bad["passed"]
    assert abs(bad["max_rel_error"] - 0.1) < 1e-6
    assert abs(bad["max_abs_error"] - 0.4) < 1e-6
    assert bad["mismatches"] == 3


def test_compare_nan_and_inf_must_sit_where_onnxruntime_has_them():
    expected = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare(expected.copy(), expected)["passed"]
    assert not compare(np.array([0.0, np.inf, 1.0], np.float32), expected)["passed"]
    assert not compare(np.array([np.nan, -np.inf, 1.0], np.float32), expected)["passed"]
    assert not compare(np.array([np.nan, np.inf, np.nan], np.float32), expected)["passed"]


def test_compare_shape_mismatch():
    result = compare(np.zeros((2, 3)), np.zeros((3, 2)))
    assert not result["passed"] and "shape" in result["error"]


def test_check_passes_each_plugin_step_and_the_output(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 8, "cpu")
    labels = np.arange(8) % 5
    result = _check(runner, _feeds(8), labels)
    assert result.passed
    # conv1's step runs Conv > Relu > MaxPool: it is compared at the pool's output; fc's step reads the
    # Flatten as a view of r2 and runs Gemm > Softmax: y, compared as its output and the model's
    assert [r["tensor"] for r in result.records] == ["p1", "r2", "y", "y"]
    assert result.top1_agreement == 1.0
    assert result.accuracy == result.reference_accuracy


class _OffByOne(ReferenceConvKernel):
    def __call__(self, inputs, stream=None):
        return [super().__call__(inputs)[0] + 1.0]


class _BrokenConv(ConvPlugin):
    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, fused=fused, prologue=prologue, graphed=graphed)
        return _OffByOne(kernel.spec, kernel.epilogue)


def test_check_catches_a_wrong_kernel(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cpu", registry={"Conv": _BrokenConv()})
    result = _check(runner, _feeds(4))
    assert not result.passed
    failing = {r["tensor"] for r in result.records if not r["passed"]}
    assert {"p1", "r2"} <= failing


# --- streaming: check chunks sized from a host-memory budget -----------------------------

import pytest

from opplugin.verify import check as check_module
from opplugin.ort import sessions
from opplugin.verify.check import DEFAULT_ATOL, DEFAULT_RTOL, ErrorStats, check_chunks, check_image_bytes
from opplugin.inputs.feeds import make_inputs

HUGE_BUDGET = 1 << 40


def _same_figures(streamed, whole):
    assert [r["tensor"] for r in streamed.records] == [r["tensor"] for r in whole.records]
    for s, w in zip(streamed.records, whole.records):
        for key in ("passed", "max_abs_error", "max_rel_error", "mismatches", "elements"):
            assert s[key] == w[key], (s["tensor"], key, s[key], w[key])
        assert s["rel_l2"] == pytest.approx(w["rel_l2"], rel=1e-12, abs=0)
    assert streamed.passed == whole.passed
    assert streamed.top1_agreement == whole.top1_agreement
    assert streamed.accuracy == whole.accuracy
    assert streamed.reference_accuracy == whole.reference_accuracy


class _BatchSpy:
    """Records the batch of every runner.run and onnxruntime call a check makes."""

    def __init__(self, runner, monkeypatch):
        self.ours, self.theirs = [], []
        run = runner.run

        def spied_run(feeds, keep=(), progress=None):
            self.ours.append((next(iter(feeds.values())).shape[0], tuple(keep)))
            return run(feeds, keep=keep, progress=progress)

        monkeypatch.setattr(runner, "run", spied_run)
        call = sessions.Reference.__call__

        def spied_call(reference, feeds):
            self.theirs.append(next(iter(feeds.values())).shape[0])
            return call(reference, feeds)

        monkeypatch.setattr(sessions.Reference, "__call__", spied_call)


@pytest.mark.parametrize("model_name", ["lenet86", "ece408_high"])
@pytest.mark.parametrize("tolerances", [(DEFAULT_ATOL, DEFAULT_RTOL), (0.0, 1e-7)])
def test_streamed_check_gives_the_single_pass_figures(model_name, tolerances, monkeypatch):
    model = load_model(model_name)
    runner = Runner(model, 11, "cpu")
    inputs = make_inputs(model, 11)  # the bundled test set, with labels
    whole = _check(runner, inputs.feeds, inputs.labels, *tolerances, budget_bytes=HUGE_BUDGET)
    assert whole.chunks == 1
    spy = _BatchSpy(runner, monkeypatch)
    budget = 3 * check_image_bytes(runner.plan_record()) + 1  # three images a chunk: 3 + 3 + 3 + 2
    streamed = _check(runner, inputs.feeds, inputs.labels, *tolerances, budget_bytes=budget)
    assert [size for size, _ in spy.ours] == [3, 3, 3, 2] and spy.theirs == [3, 3, 3, 2]
    assert streamed.chunks == 4 and streamed.chunk_size == 3
    _same_figures(streamed, whole)
    if tolerances[0] == 0.0:  # at this tolerance some elements miss, so the counts are tested too
        assert any(r["mismatches"] > 0 for r in whole.records)
    assert whole.accuracy is not None and whole.top1_agreement == 1.0


def test_a_budget_below_one_image_checks_one_image_at_a_time(tiny_model_path, monkeypatch):
    runner = Runner(load_model(tiny_model_path), 5, "cpu")
    feeds, labels = _feeds(5), np.arange(5) % 5
    whole = _check(runner, feeds, labels, budget_bytes=HUGE_BUDGET)
    spy = _BatchSpy(runner, monkeypatch)
    streamed = _check(runner, feeds, labels, budget_bytes=1)
    assert [size for size, _ in spy.ours] == [1] * 5 and spy.theirs == [1] * 5
    _same_figures(streamed, whole)


@pytest.mark.parametrize("budget_images", [1, 2, 4, 7])
def test_the_runner_never_keeps_more_than_the_budget(tiny_model_path, monkeypatch, budget_images):
    runner = Runner(load_model(tiny_model_path), 16, "cpu")
    budget = budget_images * check_image_bytes(runner.plan_record()) + check_image_bytes(runner.plan_record()) // 2
    spy = _BatchSpy(runner, monkeypatch)
    progress = []
    result = _check(runner, _feeds(16), budget_bytes=budget, progress=lambda *a: progress.append(a))
    assert result.passed
    sizes = [size for size, _ in spy.ours]
    assert sum(sizes) == 16 and max(sizes) * check_image_bytes(runner.plan_record()) <= budget
    assert all(keep == ("p1", "r2") for _, keep in spy.ours)  # y, the model output, comes anyway; fc reads f as a view of r2
    # progress after every chunk when there are several, ending at the whole batch
    assert [done for _, done, _ in progress] == (list(np.cumsum(sizes)) if len(sizes) > 1 else [])


def test_check_image_bytes_counts_both_sides_and_onnxruntimes_working_set(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cpu")
    # kept p1 (4x6x6), r2 (4x4x4), and y (5), the kept step output that is also the model's, float32, on both sides
    # (f, the Flatten of r2, is no step's output: fc reads it as a view)
    held = 2 * 4 * (4 * 6 * 6 + 4 * 4 * 4 + 5)
    # every tensor but the input x, none sharing memory: c1 r1 (4x12x12) p1 c2 r2 f (4x4x4) logits y (5)
    working = 4 * (2 * 4 * 12 * 12 + 4 * 6 * 6 + 3 * 4 * 4 * 4 + 2 * 5)
    assert check_image_bytes(runner.plan_record()) == held + working


def test_full_check_chunks_are_whole_runner_chunks(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 100, "cpu", chunk=8)
    rows = check_chunks(runner.plan_record(), 100, budget_bytes=21 * check_image_bytes(runner.plan_record()))
    assert [r.stop - r.start for r in rows] == [16] * 6 + [4]
    assert [r.stop - r.start for r in check_chunks(runner.plan_record(), 100, chunk=30)] == [30, 30, 30, 10]


def test_one_onnxruntime_session_serves_every_chunk(tiny_model_path, monkeypatch):
    runner = Runner(load_model(tiny_model_path), 9, "cpu")
    made = []
    session = sessions.ort.InferenceSession

    def counted(*args, **kwargs):
        made.append(1)
        return session(*args, **kwargs)

    monkeypatch.setattr(sessions.ort, "InferenceSession", counted)
    assert _check(runner, _feeds(9), chunk=2).chunks == 5
    assert len(made) == 1


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))


def _nan_in_run(runner, monkeypatch, bad_call, image=0):
    """Make the runner's `bad_call`-th run return a NaN in kept p1 of that run's `image`, where
    onnxruntime has a number (done on the result, so the runner's own NaN handling cannot undo it)."""
    run, calls = runner.run, []

    def run_with_a_nan(feeds, keep=(), progress=None):
        result = run(feeds, keep=keep, progress=progress)
        calls.append(1)
        if len(calls) == bad_call:
            result.kept["p1"] = result.kept["p1"].copy()
            result.kept["p1"][image, 1, 2, 3] = np.nan
        return result

    monkeypatch.setattr(runner, "run", run_with_a_nan)
    return calls


def test_nan_in_the_wrong_place_in_one_chunk_fails_the_whole_check(tiny_model_path, monkeypatch):
    runner = Runner(load_model(tiny_model_path), 6, "cpu")
    feeds = _feeds(6)
    clean = _check(runner, feeds, chunk=2)
    assert clean.passed and clean.chunks == 3
    calls = _nan_in_run(runner, monkeypatch, bad_call=2)  # the middle one of three chunks
    streamed = _check(runner, feeds, chunk=2)
    assert len(calls) == 3 and not streamed.passed
    p1, *others = streamed.records
    assert not p1["passed"] and p1["mismatches"] == 1 and np.isnan(p1["max_abs_error"])
    assert all(record["passed"] for record in others)  # the other tensors of that chunk are still right

    monkeypatch.undo()
    _nan_in_run(runner, monkeypatch, bad_call=1, image=2)  # the same element of the batch
    whole = _check(runner, feeds, chunk=6)  # in one pass
    for s, w in zip(streamed.records, whole.records):
        assert all(_same(s[k], w[k]) for k in ("passed", "max_abs_error", "max_rel_error", "mismatches", "elements"))


def _pieces(array, cuts):
    edges = [0, *cuts, len(array)]
    return [array[a:b] for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("cuts", [[], [1], [3, 3, 7], [9]])
def test_error_stats_over_pieces_equal_compare_on_the_whole(cuts):
    rng = np.random.default_rng(3)
    expected = rng.standard_normal((10, 3, 4)).astype(np.float32)
    expected[2, 0, 1], expected[6, 2, 3], expected[8, 1, 0] = np.nan, np.inf, -np.inf
    actual = (expected + rng.standard_normal(expected.shape).astype(np.float32) * 1e-3).astype(np.float32)
    for atol, rtol in [(DEFAULT_ATOL, DEFAULT_RTOL), (1e-3, 0.0)]:
        whole = compare(actual, expected, atol, rtol)
        stats = ErrorStats(atol, rtol)
        for a, e in zip(_pieces(actual, cuts), _pieces(expected, cuts)):
            stats.add(a, e)
        streamed = stats.result()
        assert {k: v for k, v in streamed.items() if k != "rel_l2"} == {k: v for k, v in whole.items() if k != "rel_l2"}
        assert streamed["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)
        assert whole["mismatches"] > 0


def test_error_stats_fail_when_one_piece_has_a_nan_out_of_place():
    expected = np.ones((6, 2), np.float32)
    actual = expected.copy()
    actual[4, 1] = np.nan
    stats = ErrorStats()
    for a, e in zip(_pieces(actual, [2, 4]), _pieces(expected, [2, 4])):
        stats.add(a, e)
    result = stats.result()
    whole = compare(actual, expected)
    assert not result["passed"] and result["mismatches"] == whole["mismatches"] == 1
    assert all(_same(result[k], whole[k]) for k in whole)
    wrong_sign = ErrorStats().add(expected[:3], expected[:3]).add(np.full((3, 2), -np.inf, np.float32),
                                                                  np.full((3, 2), np.inf, np.float32))
    assert not wrong_sign.result()["passed"] and wrong_sign.result()["mismatches"] == 1


def test_error_stats_compare_big_arrays_in_blocks(monkeypatch):
    rng = np.random.default_rng(4)
    expected = rng.standard_normal((50, 7)).astype(np.float32)
    actual = expected + np.float32(1e-4) * rng.standard_normal(expected.shape).astype(np.float32)
    whole = compare(actual, expected)
    monkeypatch.setattr(check_module, "COMPARE_BLOCK_ELEMENTS", 20)  # blocks of 2 rows
    blocked = compare(actual, expected)
    assert blocked["max_abs_error"] == whole["max_abs_error"] and blocked["mismatches"] == whole["mismatches"]
    assert blocked["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)


def test_a_shape_mismatch_in_any_piece_is_reported():
    stats = ErrorStats().add(np.zeros((2, 3)), np.zeros((2, 3))).add(np.zeros((1, 4)), np.zeros((1, 3)))
    result = stats.result()
    assert not result["passed"] and "shape [1, 4]" in result["error"]


def test_nan_and_inf_are_counted_on_each_side_and_listed_where_there_are_any(tiny_model_path):
    from opplugin.verify.check import ErrorStats, format_check

    expected = np.array([[np.nan, np.inf, 1.0], [-np.inf, 2.0, 3.0]], np.float32)
    actual = np.array([[np.nan, np.inf, 1.0], [np.nan, np.nan, 3.0]], np.float32)
    stats = ErrorStats().add(actual[:1], expected[:1]).add(actual[1:], expected[1:])
    assert stats.specials == {"nan_ours": 3, "nan_onnxruntime": 1, "inf_ours": 1, "inf_onnxruntime": 2}

    result = _check(Runner(load_model(tiny_model_path), 4, "cpu"), _feeds(4))
    assert all(r["nan_ours"] == r["nan_onnxruntime"] == r["inf_ours"] == r["inf_onnxruntime"] == 0 for r in result.records)
    assert "NaN and Inf:" not in format_check(result, 1e-4, 1e-3)
    result.records[0] |= {"nan_ours": 2, "nan_onnxruntime": 2}
    text = format_check(result, 1e-4, 1e-3)
    assert "NaN and Inf:" in text and "p1 (conv1): NaN 2 ours, 2 onnxruntime's; Inf 0 ours, 0 onnxruntime's" in text
    assert "r2 (" not in text.split("NaN and Inf:")[1]


def test_check_states_its_pass_rule(tiny_model_path):
    from opplugin.verify.check import format_check

    text = format_check(_check(Runner(load_model(tiny_model_path), 2, "cpu"), _feeds(2)), 1e-4, 1e-3)
    assert "|a - b| <= atol * s + rtol * |b|, s = max(1, RMS of b over its image)" in text


def test_the_absolute_tolerance_follows_the_scale_of_each_image():
    rng = np.random.default_rng(5)
    small = rng.standard_normal((2, 50)).astype(np.float64)
    large = small * 1000.0  # the same tensor, three orders of magnitude larger
    large[:, 0] = 0.01  # one element near zero in each image: float32 sums of terms near 1000 miss it by ~1e-3
    noisy = large + 1e-6 * 1000.0 * rng.standard_normal(large.shape)  # errors of FP32 size relative to the image's scale
    noisy[:, 0] = 0.01 + 5e-4
    assert compare(noisy, large)["passed"]  # 5e-4 off near zero, within atol * RMS (~1e-4 * 1000)
    assert not compare(small + 5e-4, small)["passed"]  # at scale 1 the rule is atol + rtol * |b|, as before
    assert not compare(noisy + np.where(np.arange(50) == 0, 0.5, 0.0), large)["passed"]  # 0.5 off is still far out


def test_top1_only_for_a_classifiers_output():
    from opplugin.verify.check import top1

    assert list(top1(np.array([[0.1, 0.9], [0.8, 0.2]]), 2)) == [1, 0]
    assert top1(np.zeros((2, 1)), 2) is None  # one column: no classes to choose from
    assert top1(np.zeros((3, 5)), 2) is None  # not one row per image
    assert top1(np.zeros((2, 3, 4)), 2) is None


def test_run_gives_no_top1_for_an_output_that_is_no_classifiers(tmp_path):
    from onnx_builders import save, single_conv
    from opplugin.verify.check import agreement

    path = save(single_conv((2, 3, 6, 6), (4, 3, 3, 3), {}, bias=True), tmp_path / "conv.onnx")
    runner = Runner(load_model(path), 2, "cpu")
    feeds = {"x": np.random.default_rng(0).uniform(0, 1, (2, 3, 6, 6)).astype(np.float32)}
    figures = agreement(runner.plan_record(2), feeds, runner.run(feeds).outputs["y"])
    assert figures["passed"] and figures["top1_agreement"] is None


def test_checks_json_records_carry_the_nan_and_inf_counts(tiny_model_path, tmp_path, capsys):
    import json

    from opplugin.verify.check import SPECIAL_COUNT_KEYS
    from opplugin.cli import main

    assert main(["check", tiny_model_path, "--batch", "2", "--device", "cpu", "--json", str(tmp_path / "c.json")]) == 0
    records = json.loads((tmp_path / "c.json").read_text())["records"]
    assert records and all(r[key] == 0 for r in records for key in SPECIAL_COUNT_KEYS)


def test_check_survives_onnxruntime_losing_a_conv_output_it_fused_into_an_add(tmp_path):
    """FastViT's reparameterised branches: two grouped stride-2 Convs read the same x and an Add sums them.
    Asked for the first Conv's output too, onnxruntime 1.32's fullest optimisation fuses it into the Add and
    then fails to find it; the reference session is made without those layout optimisations instead."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx_builders import save

    from opplugin.cli import main

    rng = np.random.default_rng(0)

    def weights(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["large"], pads=[3] * 4, strides=[2, 2], group=48, kernel_shape=[7, 7], name="large"),
             helper.make_node("Conv", ["x", "w2", "b2"], ["small"], pads=[1] * 4, strides=[2, 2], group=48, kernel_shape=[3, 3], name="small"),
             helper.make_node("Add", ["large", "small"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 48, 14, 14])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 96, 7, 7])],
                              [weights("w1", (96, 1, 7, 7)), weights("b1", (96,)), weights("w2", (96, 1, 3, 3)), weights("b2", (96,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert main(["check", save(model, tmp_path / "branches.onnx"), "--batch", "2", "--device", "cpu"]) == 0
