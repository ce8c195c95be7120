"""The Gemm plugin on the CPU: the numpy reference against float64 and onnxruntime, the activation
table against onnxruntime's ops (NaN and Inf too), the plan's fusions and views, and the CLI."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from gemm_cases import C_SHAPES, make_problem
from onnx_builders import finish, save
from opplugin.cli import main
from opplugin.gpu.device import Device, select_device
from opplugin.errors import PluginError
from opplugin.graph.model import Model, load_model
from opplugin.ops.activation import GELU, GELU_TANH, KINDS, SILU, Activation, cuda_float
from opplugin.ops.gemm import families, reference
from opplugin.ops.gemm.epilogue import NONE, GemmEpilogue
from opplugin.ops.gemm.spec import BIAS_COLUMN, BIAS_FULL, GemmSpec
from opplugin.plan.partition import OrtStep, PluginStep, make_plan
from opplugin.registry import plugin_for

CPU = select_device("cpu")


def gemm_model(p, followers=(), constant_b=True) -> onnx.ModelProto:
    """One Gemm node (then `followers`: (op type, attributes, extra constant inputs)) with p's operands."""
    s = p.spec
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(s.a_shape()))]
    inits = []
    names = ["a", "b"]
    if constant_b:
        inits.append(numpy_helper.from_array(p.b, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(s.b_shape)))
    if p.c is not None:
        inits.append(numpy_helper.from_array(np.asarray(p.c, np.float32), "c"))
        names.append("c")
    nodes = [helper.make_node("Gemm", names, ["y0"], name="gemm", transA=int(s.trans_a), transB=int(s.trans_b), alpha=s.alpha, beta=s.beta)]
    for i, (op, attributes, extra) in enumerate(followers):
        extra_names = []
        for j, value in enumerate(extra):
            inits.append(numpy_helper.from_array(np.asarray(value, np.float32), f"e{i}_{j}"))
            extra_names.append(f"e{i}_{j}")
        nodes.append(helper.make_node(op, [f"y{i}", *extra_names], [f"y{i + 1}"], name=f"f{i}", **attributes))
    out = f"y{len(followers)}"
    graph = helper.make_graph(nodes, "gemm", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(s.output_shape()))],
                              initializer=inits)
    return finish(graph)


def onnxruntime_output(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


# --- the reference ------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 12), n=st.integers(1, 12), k=st.integers(1, 20), trans_a=st.booleans(), trans_b=st.booleans(),
       alpha=st.sampled_from([1.0, 0.25, -3.0]), beta=st.sampled_from([1.0, 0.0, 2.0]), c=st.sampled_from(sorted(C_SHAPES)),
       seed=st.integers(0, 2**31))
def test_reference_matches_float64_and_onnxruntime(m, n, k, trans_a, trans_b, alpha, beta, c, seed):
    p = make_problem(m, n, k, trans_a, trans_b, alpha, beta, c, seed)
    a, b = p.a.astype(np.float64), p.b.astype(np.float64)
    exact = alpha * np.einsum("mk,kn->mn", a.T if trans_a else a, b.T if trans_b else b)
    if p.c is not None and beta:
        exact = exact + beta * np.broadcast_to(np.asarray(p.c, np.float64), (m, n))
    np.testing.assert_allclose(reference.expected(p.spec, NONE, p.a, p.b, p.c), exact, rtol=1e-12, atol=1e-12)
    ours = reference.run(p.spec, NONE, p.a, p.b, p.c)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, onnxruntime_output(gemm_model(p), {"a": p.a}), rtol=1e-5, atol=1e-5)


def test_spec_reads_every_broadcast_of_c_and_rejects_the_rest():
    for c, expected in [("scalar", BIAS_COLUMN), ("one", BIAS_COLUMN), ("row", BIAS_COLUMN), ("row2d", BIAS_COLUMN),
                        ("column", BIAS_FULL), ("full", BIAS_FULL)]:
        assert make_problem(3, 5, 4, c=c).spec.bias == expected
    with pytest.raises(PluginError, match="does not broadcast"):
        make_problem(3, 5, 4, c="row").spec.__class__  # a valid one, then an invalid C below
        from opplugin.ops.gemm.spec import bias_kind
        bias_kind((5, 3), 3, 5, "Gemm g")


# --- the activation table -----------------------------------------------------------------

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-8, -1e-8, 3.0, -3.0, 7.5, -7.5, 100.0, -100.0], np.float32)


@pytest.mark.parametrize("activation", [*(Activation.plain(op) for op in KINDS), Activation("LeakyRelu", 0.3),
                                        Activation("Clip", 0.0, 6.0), Activation("Clip", -1.0), Activation("HardSigmoid", 0.1, 0.6),
                                        Activation(GELU, GELU_TANH)],
                         ids=lambda a: a.suffix)
def test_activation_meaning_matches_onnxruntime_with_nan_and_inf(activation):
    x = np.concatenate([SPECIAL, np.random.default_rng(0).standard_normal(50).astype(np.float32) * 4])
    attributes, extra = {}, []
    if activation.op == "Clip":
        extra = [np.float32(activation.a), np.float32(activation.b)]
    elif activation.op in ("LeakyRelu", "HardSigmoid"):
        attributes = {"alpha": activation.a} | ({"beta": activation.b} if activation.op == "HardSigmoid" else {})
    elif activation.op == GELU:  # ONNX's own Gelu, from opset 20
        attributes = {"approximate": "tanh" if activation.a == GELU_TANH else "none"}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), f"e{i}") for i, v in enumerate(extra)]
    if activation.op == SILU:  # no ONNX op: x * Sigmoid(x)
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    else:
        nodes = [helper.make_node(activation.op, ["x", *(f"e{i}" for i in range(len(extra)))], ["y"], **attributes)]
    graph = helper.make_graph(nodes, "act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [len(x)])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [len(x)])], initializer=inits)
    model = finish(graph) if activation.op != GELU else helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    theirs = onnxruntime_output(model, {"x": x})
    with np.errstate(over="ignore", invalid="ignore"):
        ours = activation.apply(x.astype(np.float64))
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)), (x[np.isnan(ours) != np.isnan(theirs)])
    finite = ~np.isnan(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-5, atol=1e-6)


def test_cuda_literals_are_exact_float32():
    for value in (0.01, 1 / 6, -2.5, 6.0, 1e-30):
        literal = cuda_float(value)
        assert literal.endswith("f") and float.fromhex(literal[:-1]) == float(np.float32(value))
    assert cuda_float(0.0) == "0.0f" and "7f800000" in cuda_float(np.inf)
    assert Activation("LeakyRelu", 0.5).cuda_expression() == "((v) < 0.0f ? 0x1.0000000000000p-1f * (v) : (v))"


# --- fusion, views and the plan -----------------------------------------------------------

def _plan(model, batch=4):
    return make_plan(load_model(model) if isinstance(model, str) else Model(model, model.graph.name), batch, CPU)


def test_shipped_models_run_every_step_as_a_plugin_with_views_and_fusions():
    ops = {name: [s.ops for s in _plan(name).steps] for name in ("lenet86", "ece408_high", "mlp_onehidden")}
    assert ops["lenet86"] == [["Conv", "Relu", "MaxPool"], ["Conv", "Relu", "MaxPool"], ["Gemm", "Relu"], ["Gemm", "Softmax"]]
    assert ops["ece408_high"] == [["Conv", "Tanh", "MaxPool"], ["Gemm", "Tanh"], ["Gemm", "Softmax"]]
    assert ops["mlp_onehidden"] == [["Gemm", "Sigmoid"], ["Gemm", "Softmax"]]
    plan = _plan("lenet86")
    assert [s.build(CPU).name for s in plan.steps][2:] == ["gemm.reference+relu", "gemm.reference+softmax"]
    assert [n.op_type for n in plan.steps[2].view_nodes] == ["Flatten"]  # the first Gemm reads it as a view


def test_an_intermediate_read_twice_is_not_fused(tmp_path):
    p = make_problem(4, 6, 8, trans_b=True)
    model = gemm_model(p, [("Relu", {}, ())])
    model.graph.output.append(helper.make_tensor_value_info("y0", TensorProto.FLOAT, [4, 6]))  # the Gemm's own output too
    steps = _plan(finish(model.graph)).steps
    assert steps[0].ops == ["Gemm"] and steps[1].ops == ["Relu"]  # the Relu a step of its own


def test_softmax_over_another_axis_or_a_third_follower_is_not_fused():
    p = make_problem(4, 6, 8)
    assert _plan(gemm_model(p, [("Softmax", {"axis": 0}, ())])).steps[0].ops == ["Gemm"]
    chain = [("Sigmoid", {}, ()), ("Softmax", {"axis": -1}, ()), ("Relu", {}, ())]
    assert _plan(gemm_model(p, chain)).steps[0].ops == ["Gemm", "Sigmoid", "Softmax"]


def test_softmax_of_a_wide_gemm_is_fused_on_the_cpu_only():
    """On a GPU only rowwarp (N <= 32) fuses a Softmax: the plugin says so for a wider one."""
    assert families.heuristic_config(GemmSpec(8, 64, 16), GemmEpilogue(softmax=True)).name() == "rowwarp_r1"
    wide = GemmSpec(8, 64, 16)
    config = families.heuristic_config(wide, GemmEpilogue(softmax=True))
    assert "N <= 32" in families.unsupported_reason(wide, config, GemmEpilogue(softmax=True))


@pytest.mark.parametrize("chain", [
    [("Relu", {}, ())], [("Tanh", {}, ()), ("Softmax", {"axis": 1}, ())], [("LeakyRelu", {"alpha": 0.2}, ())],
    [("Clip", {}, (0.0, 6.0))], [("HardSigmoid", {}, ())], [("HardSwish", {}, ())], [("Softmax", {}, ())],
], ids=lambda chain: "+".join(op for op, _, _ in chain))
@pytest.mark.parametrize("c", ["row", "none", "scalar"])
def test_fused_steps_match_onnxruntime_through_check(tmp_path, chain, c):
    p = make_problem(6, 9, 13, trans_b=True, alpha=0.5, c=c, seed=3)
    model = gemm_model(p, chain)
    plan = _plan(model, 6)
    assert plan.steps[0].ops == ["Gemm", *(op for op, _, _ in chain)]
    path = save(model, tmp_path / "gemm.onnx")
    assert main(["check", path, "--batch", "6", "--device", "cpu"]) == 0


def test_matmul_of_rank_2_and_3_with_a_constant_b_is_a_gemm_on_a_s_rows():
    rng = np.random.default_rng(1)
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w")
    for shape in ([4, 8], [4, 2, 8]):
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape[:-1] + [3])], initializer=[w2])
        plan = _plan(finish(graph))
        assert isinstance(plan.steps[0], PluginStep) and plan.fallbacks == {}
        x = rng.standard_normal(shape).astype(np.float32)
        [y] = plan.steps[0].build(CPU)([x, numpy_helper.to_array(w2)])
        np.testing.assert_allclose(y, x @ numpy_helper.to_array(w2), rtol=1e-6)


def test_views_reshape_as_onnx_says():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    for op, attributes, target, expected in [
        ("Flatten", {"axis": 2}, None, (12, 10)), ("Flatten", {"axis": -1}, None, (60, 2)), ("Flatten", {"axis": 0}, None, (1, 120)),
        ("Reshape", {}, [0, -1], (3, 40)), ("Reshape", {}, [-1, 5, 2], (12, 5, 2)), ("Reshape", {"allowzero": 1}, [3, 40], (3, 40)),
    ]:
        inits = [] if target is None else [numpy_helper.from_array(np.array(target, np.int64), "shape")]
        node = helper.make_node(op, ["x"] + (["shape"] if target is not None else []), ["y"], name="view", **attributes)
        graph = helper.make_graph([node], "v", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(expected))], initializer=inits)
        model = finish(graph)
        plan = _plan(model, 3)
        [y] = plan.steps[0].build(CPU)([x])
        assert y.shape == expected and np.shares_memory(y, x)
        np.testing.assert_array_equal(y, onnxruntime_output(model, {"x": x}))


def test_reshape_to_a_computed_shape_stays_in_onnxruntime():
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    plan = _plan(finish(graph), 2)
    assert "run time" in plan.fallbacks["reshape"] and all(isinstance(s, OrtStep) for s in plan.steps)


def test_gemm_plugin_rejects_what_it_cannot_run():
    plugin = plugin_for("Gemm")
    p = make_problem(4, 6, 8, c="full")
    model = gemm_model(p)
    plan = _plan(model, 4)
    assert "constant C" in plan.fallbacks["gemm"]
    assert plugin is not None and plugin_for("MatMul") is not None
    step = _plan(gemm_model(make_problem(4, 6, 8)), 4).steps[0]
    with pytest.raises(PluginError, match="needs a CUDA device"):
        step.build(CPU, "tiled")
    with pytest.raises(PluginError, match="unknown Gemm variant"):
        step.build(CPU, "fastest")


def test_heuristic_choice_by_batch_and_width():
    # the picks a sweep of every gemv configuration found fastest on an H100 (see families.gemv_default)
    picks = {(1, 4096, 25088): "gemv_w1x1_k16", (16, 4096, 25088): "gemv_w16x2_k8", (1, 1024, 4096): "gemv_w1x1_k16",
             (16, 128, 32754): "gemv_w4x2_k16", (16, 128, 7200): "gemv_w4x2_k16", (1, 32, 1024): "gemv_w1x1_k8",
             (16, 4, 128): "gemv_w1x1_k1", (1, 4, 128): "gemv_w1x1_k1"}
    assert {shape: families.heuristic_config(GemmSpec(*shape)).name() for shape in picks} == picks
    assert families.heuristic_config(GemmSpec(10000, 128, 7200)).name() == "wg_3xtf32_b128x64x32_s3"  # the grid fills the GPU
    assert families.heuristic_config(GemmSpec(10000, 128, 7200), tensor_cores=False).name().startswith("tiled_")
    # a ViT's QKV at one image: 72 blocks of the smallest tile over K's 12 slices, too short a walk to
    # repay a split's reduce; its MLP out: 24 blocks over 48 slices, split in 5 runs
    assert families.heuristic_config(GemmSpec(197, 1152, 384)).name() == "wg_3xtf32_b64x64x32_s3"
    assert families.heuristic_config(GemmSpec(197, 384, 1536)).name() == "wg_3xtf32_b64x64x32_s3_k5"
    assert families.heuristic_config(GemmSpec(10000, 32, 1024)).name().startswith("rowwarp_")
    assert families.heuristic_config(GemmSpec(3, 10, 128), GemmEpilogue(softmax=True)).name().startswith("rowwarp_")
    # every configuration the heuristic names parses back to itself
    for spec in (GemmSpec(1, 4096, 25088), GemmSpec(10000, 128, 7200), GemmSpec(10000, 10, 32)):
        config = families.heuristic_config(spec)
        assert families.configure(spec, config.name()) == config


# --- the CLI and the shipped model ---------------------------------------------------------

def test_wgmma_is_picked_where_it_runs_split_where_its_tiles_leave_sms_idle():
    vit_qkv_32 = GemmSpec(32 * 197, 1152, 384)
    assert families.heuristic_config(vit_qkv_32).name() == "wg_3xtf32_b128x128x32_s3"  # 450 blocks: no split
    assert families.heuristic_config(GemmSpec(49, 768, 3072)).name() == "wg_3xtf32_b64x64x32_s3_k11"  # Swin-T's last MLP out: 12 blocks
    assert families.heuristic_config(GemmSpec(197, 1152, 32)).name() == "wg_3xtf32_b64x64x32_s3"  # one slice of K: nothing to split
    # wgmma copies A in 16-byte quads: an odd K takes mma.sync, which copies four bytes at a time
    assert families.heuristic_config(GemmSpec(10000, 512, 1023)).family == "tc_3xtf32"
    assert "K must be a multiple of 4" in families.unsupported_reason(GemmSpec(10000, 512, 1023), families.configure(vit_qkv_32, "wg_3xtf32"))
    # the opt-in TF32 family is never the heuristic's, nor the bench's default candidate
    assert "tc_tf32" not in families.EXACT_FAMILIES
    for spec in (vit_qkv_32, GemmSpec(197, 1152, 384), GemmSpec(197, 384, 1536), GemmSpec(10000, 512, 1023)):
        config = families.heuristic_config(spec)
        assert families.configure(spec, config.name()) == config and families.unsupported_reason(spec, config) is None


def test_the_half_precision_wgmma_families_are_opt_in_and_read_k_in_64s():
    vit_qkv_32 = GemmSpec(32 * 197, 1152, 384)
    for family in ("wg_fp16", "wg_bf16"):
        config = families.configure(vit_qkv_32, family)
        assert config.name() == f"{family}_b128x128x64_s4" and config.defines(vit_qkv_32)["HALF_OPERANDS"] == {"wg_fp16": 1, "wg_bf16": 2}[family]
        assert config.shared_bytes() < families.configure(vit_qkv_32, "wg_3xtf32").shared_bytes()  # no small parts, two bytes a value
        assert families.configure(vit_qkv_32, config.name()) == config and families.unsupported_reason(vit_qkv_32, config) is None
        assert family not in families.EXACT_FAMILIES  # never the heuristic's pick, nor the tuner's
        assert "K must be a multiple of 8" in families.unsupported_reason(GemmSpec(1000, 512, 516), families.configure(GemmSpec(1000, 512, 512), family))
    assert families.configure(GemmSpec(49, 768, 3072), "wg_fp16").splits > 1  # 48 slices of 64, 12 blocks: split
    assert "HALF_OPERANDS" not in families.configure(vit_qkv_32, "wg_3xtf32").defines(vit_qkv_32)  # 3xTF32 as it was


@pytest.mark.parametrize(("name", "why"), [
    ("wg_fp16_b128x128x32_s3", "the tiles are"),  # a slice of 64 halves, not 32
    ("tc_3xtf32_b128x128x32_w32x32_s3", "the tiles are"),  # a warp tile the block tile does not take
    ("tc_3xtf32_b64x64x32_w32x32_s5", "2 to 4 stages"),
    ("wg_3xtf32_b256x128x32_s3", "the tiles are"),
    ("wg_3xtf32_b128x128x32_s4", "KB of shared memory"),  # 262 KB of stages
    ("wg_3xtf32_b64x64x32_s3_k17", "non-empty runs"),  # K = 512 is 16 slices
    ("wg_3xtf32_b64x64x32_s3_k12", "non-empty runs"),  # runs of 2 slices: the twelfth would be empty
])
def test_a_tensor_core_configuration_outside_the_tables_is_refused_with_the_reason(name, why):
    spec = GemmSpec(1000, 512, 512)
    assert why in families.unsupported_reason(spec, families.configure(spec, name))


def test_the_nan_exact_rerun_of_a_tensor_core_step_is_on_fma_kernels(tmp_path):
    gpu = Device("cuda", "test GPU")
    flat = make_plan(load_model(save(gemm_model(make_problem(300, 64, 48, trans_b=True)), tmp_path / "fc.onnx")), 300, gpu)
    [step] = flat.plugin_steps
    assert step.kernel_name(gpu).startswith("gemm.wg_3xtf32")  # a tensor-core kernel, which turns an Inf into NaN
    assert step.plugin.nonfinite_exact_variant(step.node, gpu).startswith("tiled_")
    assert step.plugin.nonfinite_exact_variant(step.node, CPU) is None


def test_mlp_onehidden_runs_and_checks_on_the_cpu(capsys):
    assert main(["check", "mlp_onehidden", "--batch", "100", "--device", "cpu"]) == 0
    assert "gemm.reference+sigmoid" in capsys.readouterr().out
    assert main(["run", "mlp_onehidden", "--batch", "50", "--device", "cpu", "--repeat", "1"]) == 0


def test_bench_gemm_suite_without_a_gpu_is_a_clear_error(capsys):
    from opplugin.gpu import cuda

    if cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["bench", "--suite", "gemm"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
