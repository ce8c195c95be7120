"""The exact path for NaN and Inf: fused steps flag their chunks, and flagged chunks
run again with the fusion split into the plugin's node and onnxruntime's own nodes,
so that NaN and Inf come out exactly as onnxruntime has them."""
import dataclasses

import numpy as np
import onnxruntime as ort
import pytest

from opplugin.verify.check import compare
from opplugin.inputs.feeds import make_inputs
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.ops.conv.plugin import ConvPlugin
from opplugin.plan.partition import make_plan
from opplugin.registry import Kernel
from opplugin.runtime import Runner
from opplugin.ops.pool.plugin import AveragePoolPlugin
from opplugin.runtime.exact import ExactPath, reruns_differently, split_fused
from nonfinite_cases import UnfusedConv, nan_through_fused_steps_without_pool, poisoned, poisoned_batch, pool_net, same_as_onnxruntime


def test_split_fused_gives_the_plain_conv_then_onnxruntimes_own_epilogue(tiny_model_path):
    plan = make_plan(load_model(tiny_model_path), 2, CPU)
    exact = split_fused(plan)
    assert [(type(s).__name__, s.ops) for s in exact.steps] == [
        ("PluginStep", ["Conv"]),
        ("OrtStep", ["Relu", "MaxPool"]),
        ("PluginStep", ["Conv"]),
        ("OrtStep", ["Relu"]),
        ("OrtStep", ["Flatten"]),  # fc read it as a view: it runs before fc's Gemm
        ("PluginStep", ["Gemm"]),
        ("OrtStep", ["Softmax"]),
    ]
    conv, epilogue = exact.steps[0], exact.steps[1]
    assert conv.name == "conv1" and conv.outputs == ["c1"] and not conv.fused
    assert epilogue.inputs == ["c1"] and epilogue.outputs == ["p1"] == plan.steps[0].outputs
    assert exact.steps[4].name == "fc views" and exact.steps[4].outputs == ["f"] and exact.steps[5].inputs[0] == "f"
    assert len({s.name for s in exact.steps}) == len(exact.steps)
    c1 = np.random.default_rng(0).standard_normal((2, 4, 12, 12)).astype(np.float32)
    c1[0, 0, 0, 0], c1[1, 2, 5, 4] = np.nan, np.inf
    session = ort.InferenceSession(epilogue.model.SerializeToString(), providers=["CPUExecutionProvider"])
    (p1,) = session.run(None, {"c1": c1})
    expected = np.maximum(c1, 0).reshape(2, 4, 6, 2, 6, 2)
    assert p1.shape == (2, 4, 6, 6) and p1[1, 2, 2, 2] == np.inf
    np.testing.assert_array_equal(p1[:, 1], expected.max(axis=(3, 5))[:, 1])  # a clean map: plain max


def _nan_check(registry, chunk):
    model = load_model("lenet86")
    x = poisoned(make_inputs(model, 6, "random").feeds["input"])
    result = Runner(model, 6, "cpu", registry=registry, chunk=chunk).run({"input": x})
    ours = result.outputs["probabilities"]
    reference = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert np.isnan(reference).any()  # the poison reached the output
    verdict = compare(ours, reference)
    assert verdict["passed"], verdict
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    np.testing.assert_allclose(ours[4:], reference[4:], rtol=1e-5, atol=1e-6)  # clean images stay clean
    return result


@pytest.mark.parametrize("chunk", [None, 2])
def test_nan_and_inf_pass_through_the_runner_exactly_as_in_onnxruntime(chunk):
    result = _nan_check({"Conv": UnfusedConv()}, chunk)
    assert result.exact_reruns == 0  # nothing fused, nothing to rerun


@pytest.mark.parametrize("chunk", [None, 2])
def test_nan_and_inf_through_fused_steps_as_in_onnxruntime(chunk):
    result = _nan_check(None, chunk)
    # the poisoned images are 0..3: the whole batch, or the first two chunks of three
    assert result.exact_reruns == (1 if chunk is None else 2)


# --- NaN and Inf at chosen places inside pool windows ---------------------------------------


@pytest.mark.parametrize("activation", ["Relu", "Tanh"])
@pytest.mark.parametrize("pool", [2, 4])
@pytest.mark.parametrize("size", [(8, 8), (12, 10)])
@pytest.mark.parametrize("chunk", [None, 3])
def test_nan_and_inf_inside_pool_windows_come_out_as_in_onnxruntime(activation, pool, size, chunk, tmp_path):
    from onnx_builders import save

    model = load_model(save(pool_net(activation, pool, size), tmp_path / "pool_net.onnx"))
    x, cases = poisoned_batch(pool, size)
    runner = Runner(model, len(x), "cpu", chunk=chunk)
    assert [s.ops for s in runner.plan.plugin_steps if s.node.op_type == "Conv"] == [["Conv", activation, "MaxPool"]] * 2
    result = runner.run({"x": x}, keep=("p2",))
    with_p2 = pool_net(activation, pool, size, outputs=("p1", "y", "p2")).SerializeToString()
    p1, y, p2 = ort.InferenceSession(with_p2, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    same_as_onnxruntime(result.outputs["p1"], p1)
    same_as_onnxruntime(result.outputs["y"], y)
    same_as_onnxruntime(result.kept["p2"], p2)
    # flagged: a NaN that a window reads, or (Relu only; Tanh maps them to +-1) an Inf that a window
    # reads (+inf in map 0, -inf turned +inf in map 1); a place the floor-mode pool drops is never read
    read = size[1] // pool * pool
    flagged = {image // (chunk or len(x)) for image, (value, (_, column)) in enumerate(cases)
               if column < read and (np.isnan(value) or activation == "Relu")}
    assert result.exact_reruns == len(flagged) and result.chunks == -(-len(x) // (chunk or len(x)))


def test_the_fast_path_alone_would_differ_from_onnxruntime(tmp_path):
    """Why the exact path exists: a NaN inside a pool window is kept by the fused step
    and dropped or kept by onnxruntime's MaxPool depending on its place."""
    from onnx_builders import save

    model = load_model(save(pool_net("Relu", 2, (8, 8)), tmp_path / "pool_net.onnx"))
    x, _ = poisoned_batch(2, (8, 8))
    runner = Runner(model, len(x), "cpu")
    runner.exact.watched.clear()  # no flags: the fast path's outputs stand
    fast = runner.run({"x": x}).outputs["p1"]
    p1 = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["p1"], {"x": x})[0]
    assert np.isnan(fast).sum() > np.isnan(p1).sum()


def test_only_the_chunks_with_nan_or_inf_run_again_and_the_report_says_so():
    from opplugin.report import timing as report

    model = load_model("lenet86")
    x = make_inputs(model, 4, "random", seed=2).feeds["input"]
    x[2, 0, 40, 40] = np.nan
    runner = Runner(model, 4, "cpu", chunk=1)
    profile = runner.profile({"input": x}, warmup=0, repeat=1)
    assert profile.result.exact_reruns == 1 and profile.result.exact_ms > 0
    built = report.build_report(profile, 0)
    text = report.format_text(built)
    assert "Exact path: 1 of 4 chunks held NaN or Inf after a fused step and ran again with each fused step split" in text
    assert "ran again in FP32" not in text  # FP32 run: nothing to say about the precision
    # a reduced precision on a GPU: the products' rerun is FP32 there, which hides what the format met; said once
    on_gpu = built | {"precision": "fp16", "device": built["device"] | {"kind": "cuda", "name": "a GPU"}}
    assert report.format_text(on_gpu).count("those chunks' products ran again in FP32") == 1
    reference = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(profile.result.outputs["probabilities"], reference, rtol=1e-5, atol=1e-6)
    # the step rows are the fast plan's: the rerun's time is in host to host only
    assert [r["step"] for r in report.step_rows(profile)] == [s.name for s in runner.plan.steps]


@pytest.mark.parametrize("name, scale", [("lenet86", 1.0), ("lenet86", 1e4), ("ece408_high", 1.0)])
def test_finite_inputs_never_take_the_exact_path(name, scale, monkeypatch):
    model = load_model(name)
    feeds = make_inputs(model, 6, "random", seed=4).feeds
    feeds = {k: (v * np.float32(scale)).astype(np.float32) for k, v in feeds.items()}
    runner = Runner(model, 6, "cpu", chunk=2)
    fused = [index for index, step in enumerate(runner.plan.steps) if step.kind == "plugin" and step.fused]
    assert fused and sorted(runner.exact.watched) == fused  # every fused max pool's output is watched
    monkeypatch.setattr(runner.exact, "rerun", lambda *a: pytest.fail("finite input took the exact path"))
    result = runner.run(feeds)
    assert result.exact_reruns == 0 and result.exact_ms == 0.0 and not runner.exact.built


@pytest.mark.parametrize("activation", ["Relu", "Tanh"])
def test_the_fused_epilogue_propagates_nan_and_inf_from_any_place_in_a_window(activation):
    from opplugin.ops.conv.epilogue import Epilogue

    epilogue = Epilogue(activation, (2, 2))
    for value in (np.nan, np.inf, -np.inf):
        for i in range(2):
            for j in range(2):
                y = np.full((1, 1, 4, 4), -0.5, np.float32)
                y[0, 0, 2 + i, j] = value
                pooled = epilogue.apply(y)
                clean = np.float32(0.0) if activation == "Relu" else np.tanh(np.float32(-0.5))
                expected = {"Relu": {np.inf: np.inf, -np.inf: clean}, "Tanh": {np.inf: 1.0, -np.inf: clean}}
                want = np.nan if np.isnan(value) else expected[activation][value]
                np.testing.assert_array_equal(pooled[0, 0, 1, 0], np.float32(want))
                np.testing.assert_array_equal(pooled[0, 0, 0], np.full(2, clean, np.float32))  # other windows untouched
                assert np.isfinite(pooled[0, 0, 1, 1])


def test_nan_chunks_rerun_on_the_exact_path_built_once_and_kept_tensors_follow(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 8, "cpu", chunk=2)
    fused = [step.name for step in runner.plan.plugin_steps]
    # conv1 (its max pool's NaN rule) and fc (Gemm > Softmax) are watched; conv2 > Relu keeps onnxruntime's NaN and Inf
    assert sorted(runner.exact.watched) == [0, 2] and not runner.exact.built
    feeds = {"x": np.random.default_rng(0).uniform(-1, 1, (8, 3, 12, 12)).astype(np.float32)}
    feeds["x"][5, 1, 6, 7] = np.nan  # chunk 2 (images 4 and 5)
    keep = ("p1", "r2")  # the fused steps' outputs
    first = runner.run(feeds, keep=keep)
    assert first.exact_reruns == 1 and runner.exact.built
    exact = runner.exact.split_executor()
    assert [s.name for s in exact.plan.plugin_steps] == fused and all(not s.fused for s in exact.plan.plugin_steps)
    second = runner.run(feeds, keep=keep)
    assert runner.exact.split_executor() is exact and second.exact_reruns == 1  # built once, reused
    y, p1, r2 = _onnxruntime_with(tiny_model_path, feeds, ["y", "p1", "r2"])
    for result in (first, second):
        np.testing.assert_allclose(result.outputs["y"], y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.kept["p1"], p1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(result.kept["r2"], r2, rtol=1e-5, atol=1e-6)
    assert np.isnan(y[5]).all() and not np.isnan(np.delete(y, 5, axis=0)).any()


def _onnxruntime_with(path, feeds, names):
    """onnxruntime's values of `names`, intermediate tensors included."""
    import onnx

    model = onnx.load(path)
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in {o.name for o in model.graph.output})
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(names, feeds)


def test_fused_steps_without_a_pool_are_not_watched_and_keep_onnxruntimes_nan(tmp_path):
    nan_through_fused_steps_without_pool("cpu", tmp_path)


class _NotExactConv(ConvPlugin):
    """Conv kernels that say they do not keep NaN and Inf (as 3xTF32 does), except its named exact variant."""

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        kernel = super().build(node, device, None, fused, prologue, graphed)
        kernel.nonfinite_exact = variant == "exact" and kernel.nonfinite_exact
        return kernel

    def nonfinite_exact_variant(self, node, device):
        return "exact"


def test_a_kernel_that_is_not_nan_exact_is_watched_and_its_chunks_rerun_on_the_plugins_exact_variant(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 8, "cpu", registry={"Conv": _NotExactConv()}, chunk=4)
    convs = [index for index, step in enumerate(runner.plan.steps) if step.kind == "plugin" and step.node.op_type == "Conv"]
    assert set(convs) <= set(runner.exact.watched)  # fused or not, both Convs are watched
    x = np.random.default_rng(3).uniform(-1, 1, (8, 3, 12, 12)).astype(np.float32)
    x[6, 0, 2, 2] = np.inf
    result = runner.run({"x": x})
    assert result.exact_reruns == 1
    exact = runner.exact.split_executor()
    assert all(exact.kernels[runner.plan.steps[i].name].nonfinite_exact for i in convs)
    (y,) = _onnxruntime_with(tiny_model_path, {"x": x}, ["y"])
    np.testing.assert_allclose(result.outputs["y"], y, rtol=1e-5, atol=1e-6)


class _SaysNothingKernel(Kernel):
    """A kernel that leaves nonfinite_exact at the protocol's default."""

    name = "says_nothing"

    def flops(self, batch):
        return 0

    def bytes_moved(self, batch):
        return 0

    def __call__(self, inputs, stream=None):
        return list(inputs)


def test_a_kernel_that_is_not_nan_exact_is_watched_only_where_the_exact_path_runs_something_else(tiny_model_path):
    plan = make_plan(load_model(tiny_model_path), 2, CPU)
    kernel = _SaysNothingKernel()
    assert kernel.nonfinite_exact is False and kernel.device_work is True  # the protocol's defaults
    conv = plan.steps[0]
    assert conv.fused and reruns_differently(conv, kernel, CPU)  # the exact path splits the fusion
    assert reruns_differently(dataclasses.replace(conv, fused=[], plugin=_NotExactConv()), kernel, CPU)
    # the CPU's reference Conv keeps NaN and Inf itself: the built-in plugin names no other variant there
    assert not reruns_differently(dataclasses.replace(conv, fused=[]), kernel, CPU)


def test_the_nan_exact_conv_variant_leaves_out_the_3xtf32_gemms():
    from opplugin.ops.conv import families
    from opplugin.ops.conv.choice import heuristic_config, nonfinite_exact_config
    from opplugin.ops.conv.epilogue import NONE
    from onnx_builders import conv_spec

    spec = conv_spec(32, 256, 256, (14, 14), (3, 3), pads=(1, 1, 1, 1))
    w = np.ones(spec.weight_shape, np.float32)
    # no device here: planned for an H100, where the wgmma GEMM goes first on this layer
    assert families.family_of(heuristic_config(spec, (w, None), NONE)).name == "wg_3xtf32"
    assert families.family_of(nonfinite_exact_config(spec, (w, None))).name == "simt_gemm"  # FP32 FMAs: NaN and Inf land as in float64


def test_the_nonfinite_flag_kernel_ships_in_kernels_and_compiles_without_a_gpu():
    from opplugin.lab import nvrtc_check
    from opplugin.runtime import nonfinite

    if not nvrtc_check.nvrtc_available():
        pytest.skip("cuda-bindings' NVRTC is not importable")
    usage = nvrtc_check.check_source(nonfinite.FLAG_SOURCE, {}, "opplugin_flag_nonfinite", "sm_90")
    assert usage.cubin_bytes > 0 and (usage.spill_stores, usage.stack_frame) == (0, 0), usage.log


class _RecordingAveragePool(AveragePoolPlugin):
    """The pool plugin, noting each variant a build is asked for."""

    def __init__(self):
        self.asked = []

    def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
        self.asked.append(variant)
        return super().build(node, device, variant, fused, prologue, graphed)


class _LinkedKernel(_SaysNothingKernel):
    """What the fast plan of a run in fp16 holds for a linked average pool: NaN/Inf-exact, on 16-bit tensors."""

    name, variant, nonfinite_exact = "averagepool.cuda_fp16_h3.3x3s2p1", "cuda_fp16_h3", True


def test_the_exact_path_never_runs_a_linked_kernel_nor_builds_its_variant(tmp_path):
    """Every tensor of the exact path is FP32 as the model has it: a step the plan linked channel-last in 16 bits
    (plan/channel_last.py) is built again from the op's --variant, else its plugin's own choice."""
    from onnx_builders import save
    from precision_cases import conv_pool_model

    plugin = _RecordingAveragePool()
    runner = Runner(load_model(save(conv_pool_model("AveragePool"), tmp_path / "m.onnx")), 4, "cpu", registry={"AveragePool": plugin})
    assert runner.exact.linked_steps == frozenset()  # nothing is linked on the CPU device
    pool = next(step for step in runner.plan.plugin_steps if step.name == "pool")
    kernels = dict(runner.kernels, pool=_LinkedKernel())

    def exact_path(linked):
        return ExactPath(runner.plan, runner.layout, runner.device, kernels, runner.constants, {}, None, linked)

    assert exact_path(frozenset())._exact_kernel(pool) is kernels["pool"]  # NaN-exact, fused nothing: reused when not linked
    plugin.asked.clear()
    rebuilt = exact_path(frozenset({"pool"}))._exact_kernel(pool)
    assert rebuilt is not kernels["pool"] and rebuilt.name == "averagepool.reference.3x3s2p1" and plugin.asked == [None]
