"""MatMul of any rank on the CPU device: the plan's form (a Gemm on A's rows, or batched), the reference
against onnxruntime, the fused epilogue, and what is refused."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from matmul_cases import BIAS_CASES, CASES, fresh_inputs, matmul_model
from opplugin.errors import PluginError
from opplugin.gpu.device import CPU, Device
from reduction_cases import planned

GPU = Device("cuda", "test GPU")


def onnxruntime_outputs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
def test_the_reference_matches_onnxruntime(case, batch):
    a_shape, b_shape, constant, act, softmax = CASES[case]
    model = matmul_model(a_shape, b_shape, constant, act, softmax)
    plan = planned(model, batch)
    [step] = plan.steps
    assert step.ops == ["MatMul", *([act] if act else []), *(["Softmax"] if softmax else [])] and plan.fallbacks == {}
    feeds = fresh_inputs(model, batch, len(case))
    [ours] = step.build(CPU)([feeds.get(name, plan.model.initializers.get(name)) for name in step.inputs])
    theirs = onnxruntime_outputs(model, feeds)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("case", "kernel"), [
    ("ConvNeXt MLP in: (N, H, W, C) x (C, 4C), Gelu left out", "matmul.wg_3xtf32_"),
    ("rank 3 rows, Softmax fused", "matmul.rowwarp_r"),
    ("batched, both at run time", "matmul.batched_3xtf32"),
    ("batched, a constant B broadcast over the batch", "matmul.batched_3xtf32+tanh"),
])
def test_the_form_each_matmul_takes_on_a_gpu(case, kernel):
    a_shape, b_shape, constant, act, softmax = CASES[case]
    plan = planned(matmul_model(a_shape, b_shape, constant, act, softmax), 8, GPU)
    [step] = plan.steps
    assert step.plugin.kernel_name(step.node, GPU, fused=step.fused).startswith(kernel)


@pytest.mark.parametrize("case", list(BIAS_CASES))
@pytest.mark.parametrize("batch", [1, 3])
def test_a_bias_add_after_a_flat_matmul_is_its_gemm_bias(case, batch):
    a_shape, b_shape, bias, first, act = BIAS_CASES[case]
    model = matmul_model(a_shape, b_shape, activation=act, bias=bias, bias_first=first)
    plan = planned(model, batch)
    [step] = plan.steps
    assert step.ops == ["MatMul", "Add", *([act] if act else [])] and step.inputs == ["a", "b"]
    kernel = step.build(CPU)
    feeds = fresh_inputs(model, batch, len(case))
    [ours] = kernel([feeds["a"], plan.model.initializers["b"]])
    np.testing.assert_allclose(ours, onnxruntime_outputs(model, feeds), rtol=1e-5, atol=1e-5)
    rows = batch * int(np.prod(a_shape[1:-1]))
    assert kernel.flops(batch) == 2 * rows * b_shape[0] * b_shape[1] + rows * b_shape[1]  # the bias counts
    gpu_step = planned(model, 8, GPU).steps[0]
    assert gpu_step.ops == step.ops and gpu_step.plugin.kernel_name(gpu_step.node, GPU, fused=gpu_step.fused).startswith("matmul.")


@pytest.mark.parametrize("bias", [(2, 1, 10), (5, 10)])
def test_an_add_that_is_no_column_bias_stays_a_step_of_its_own(bias):
    """(2, 1, 10) has a batch axis and (5, 10) a value per row: neither is one value per output column."""
    plan = planned(matmul_model((2, 5, 24), (24, 10), bias=bias), 2)
    assert [s.ops for s in plan.steps] == [["MatMul"], ["Add"]]


def test_the_flat_form_counts_every_row():
    plan = planned(matmul_model((2, 7, 7, 96), (96, 384)), 2)
    kernel = plan.steps[0].build(CPU)
    assert kernel.flops(2) == 2 * (2 * 49) * 96 * 384


def test_matrices_folded_into_the_first_axis_count_per_image(tmp_path):
    """Swin's window partition folds N x 4 windows into the first axis: a step's costs take images, so a
    product over those windows counts all four of each image's (the flat Gemm and the batched product)."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.plan.partition import make_plan

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["x", "windows"], ["w"], name="partition"),
             helper.make_node("MatMul", ["w", "weight"], ["y"], name="flat"),
             helper.make_node("Transpose", ["w"], ["wt"], name="keys", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["w", "wt"], ["scores"], name="batched")]
    graph = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["W", 16, 32]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["W", 16, 16])],
                              [numpy_helper.from_array(np.array([-1, 16, 16], np.int64), "windows"),
                               numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "weight")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    plan = make_plan(load_model(save(proto, tmp_path / "windows.onnx")), 3, CPU)
    kernels = {s.name: s.build(CPU) for s in plan.plugin_steps}
    assert kernels["flat"].flops(3) == 2 * (3 * 4 * 16) * 16 * 32  # 4 windows of 16 tokens an image
    assert kernels["batched"].flops(3) == 2 * (3 * 4) * 16 * 16 * 16
    assert kernels["flat"].bytes_moved(1) == 4 * (64 * 16 + 16 * 32 + 64 * 32)


def test_strides_broadcast_and_the_batch_axis_moves_even_at_batch_1():
    from opplugin.ops.gemm.matmul import MatMulSpec

    spec = MatMulSpec((1, 3, 8, 5), (1, 1, 5, 6), False, True)
    assert spec.strides("a") == (3 * 40, 40) and spec.strides("b") == (0, 0)
    assert spec.output_shape(4) == (4, 3, 8, 6) and spec.matrices(4) == 12


@pytest.mark.parametrize(("a_shape", "b_shape", "constant", "batch", "reason"), [
    ((2, 8), (8,), "b", 2, "a 1-D operand is not implemented"),
    # B (batch, 6) multiplies A (batch, 3, 4) only at batch 4, and its first axis is then K, not the batch
    ((4, 3, 4), (4, 6), "", 4, "B is computed at run time with rank 2 below the output's 3"),
    # B (batch, 5) is K x N only at batch 7: the batch would be A's rows, not an axis of its own
    ((7, 7), (7, 5), "", 7, "a 2-D product whose B is computed at run time"),
    ((3, 6), (6, 5), "a", 6, "a 2-D product whose B is computed at run time (or whose A is a constant)"),
])
def test_what_is_not_taken_says_why(a_shape, b_shape, constant, batch, reason):
    plan = planned(matmul_model(a_shape, b_shape, constant), batch)
    assert plan.plugin_steps == [] and reason in plan.fallbacks["mm"]


def test_an_mlp_block_runs_as_plugin_steps_and_check_passes(tmp_path):
    from onnx_builders import save
    from opplugin.verify.check import check
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    from matmul_cases import mlp_block

    runner = Runner(load_model(save(mlp_block(), tmp_path / "mlp.onnx")), 3, "cpu")
    # the LayerNorm only the first product reads is that product's prologue (row_prologue.py)
    assert [s.ops for s in runner.plan.steps] == [["LayerNormalization", "MatMul", "Relu"], ["MatMul", "Softmax"], ["ReduceSum"]]
    x = np.random.default_rng(4).uniform(-2, 2, (3, 5, 6, 32)).astype(np.float32)
    result = check(runner.run, runner.plan_record(), {"x": x})
    assert result.passed


def test_a_batched_product_runs_on_the_tensor_cores_unless_fma_is_asked_for():
    a_shape, b_shape, constant, act, softmax = CASES["attention scores: (N, H, T, D) x (N, H, D, T)"]
    plan = planned(matmul_model(a_shape, b_shape, constant, act, softmax), 8, GPU)
    [step] = plan.steps
    assert step.plugin.kernel_name(step.node, GPU) == "matmul.batched_3xtf32"
    assert step.plugin.kernel_name(step.node, GPU, "batched") == "matmul.batched"
    assert step.plugin.nonfinite_exact_variant(step.node, GPU) == "batched"  # the watched kernel's exact rerun
    with pytest.raises(PluginError, match="its kernels are 'batched_3xtf32', 'batched'"):
        step.plugin.kernel_name(step.node, GPU, "tiled")
    with pytest.raises(PluginError, match="'reference' on the CPU device"):
        step.plugin.kernel_name(step.node, CPU, "batched")


def residual_model(rows: int = 5, k: int = 16, n: int = 48, activation: str | None = None):
    """y = x + [act](MatMul(h, W) + b), x and h graph inputs (N, rows, n) and (N, rows, k): a transformer
    block's x + MLP(..) ends so."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["h", "w"], ["mm"], name="fc"), helper.make_node("Add", ["mm", "b"], ["lin"], name="bias")]
    last = "lin"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["act"], name="act"))
        last = "act"
    nodes.append(helper.make_node("Add", ["x", last], ["y"], name="residual"))
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows, n]),
                                                  helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", rows, n])],
                              [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("activation", [None, "Relu"])
def test_a_residual_add_after_a_flat_matmul_joins_its_step(tmp_path, activation):
    """On the CPU the reference adds it; on a Hopper GPU wg_3xtf32 does, where it runs (17 rows or more)."""
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.ops.gemm import families
    from opplugin.runtime import Runner

    proto = residual_model(activation=activation)
    model = load_model(save(proto, tmp_path / "residual.onnx"))
    runner = Runner(model, 6, "cpu", chunk=4)
    [step] = runner.plan.plugin_steps
    assert step.ops == ["MatMul", "Add", *([activation] if activation else []), "Add"] and step.inputs == ["h", "w", "x"]
    feeds = fresh_inputs(proto, 6, 2)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds), rtol=1e-5, atol=1e-5)
    assert runner.kernels[step.name].bytes_moved(6) > Runner(model, 6, "cpu", keep=["lin"]).kernels["fc"].bytes_moved(6)
    hopper = families.wgmma_runs_here
    families.wgmma_runs_here = lambda: True
    try:
        from opplugin.plan.partition import make_plan

        gpu = make_plan(model, 8, GPU)  # 40 rows of 48: wg_3xtf32, which adds the residual as it stores
        assert gpu.plugin_steps[0].kernel_name(GPU).endswith("+residual") and len(gpu.plugin_steps) == 1
        few = make_plan(model, 3, GPU)  # 15 rows: gemv, which does not; the Add stays a step
        assert [s.ops[-1] for s in few.plugin_steps] == [activation or "Add", "Add"]
    finally:
        families.wgmma_runs_here = hopper


def test_only_wgmma_adds_a_residual():
    from opplugin.ops.gemm import families
    from opplugin.ops.gemm.epilogue import GemmEpilogue
    from opplugin.ops.gemm.spec import GemmSpec

    spec, epilogue = GemmSpec(400, 64, 64), GemmEpilogue(residual=True)
    assert "does not add a residual" in families.unsupported_reason(spec, families.configure(spec, "tc_3xtf32"), epilogue)
    assert "does not add a residual" in families.unsupported_reason(spec, families.configure(spec, "tiled"), epilogue)


def layernorm_model(rows: int = 5, k: int = 16, n: int = 48, axis: int = -1, scale_input: bool = False):
    """y = x + MatMul(LayerNorm(x), W) + b over (N, rows, k), x also the residual: a pre-norm transformer's
    LN > Linear (k == n here so that the residual fits; `n` != k leaves the residual out)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    initializers = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w"),
                    numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
                    numpy_helper.from_array((1 + 0.1 * rng.standard_normal(k)).astype(np.float32), "gamma"),
                    numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "beta")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows, k])]
    if scale_input:  # the LayerNorm's scale computed at run time: no prologue takes it
        initializers = [i for i in initializers if i.name != "gamma"]
        inputs.append(helper.make_tensor_value_info("gamma", TensorProto.FLOAT, [k]))
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["normed"], name="norm", axis=axis, epsilon=1e-6),
             helper.make_node("MatMul", ["normed", "w"], ["mm"], name="fc"), helper.make_node("Add", ["mm", "b"], ["y" if n != k else "lin"], name="bias")]
    if n == k:
        nodes.append(helper.make_node("Add", ["x", "lin"], ["y"], name="residual"))
    graph = helper.make_graph(nodes, "ln_linear", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", rows, n])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("k", [48, 16], ids=["with the residual", "wider"])
def test_a_layernorm_only_a_flat_matmul_reads_is_its_prologue(tmp_path, k):
    """On the CPU the reference normalises A's rows first; on a Hopper GPU where wg_3xtf32 runs, its pass over
    A for the small parts does; elsewhere the LayerNorm stays a step of its own."""
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.ops.gemm import families
    from opplugin.plan.partition import make_plan
    from opplugin.runtime import Runner

    proto = layernorm_model(k=k)
    model = load_model(save(proto, tmp_path / "ln.onnx"))
    runner = Runner(model, 6, "cpu", chunk=4)
    [step] = runner.plan.plugin_steps
    assert [p.name for p in step.prologue] == ["norm"] and step.inputs[0] == "x"
    assert runner.kernels[step.name].name.startswith("matmul.ln*reference")
    feeds = fresh_inputs(proto, 6, 2)
    np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_outputs(proto, feeds), rtol=1e-5, atol=1e-5)
    unfused = Runner(model, 6, "cpu", keep=["normed"])
    assert [s.ops[0] for s in unfused.plan.plugin_steps] == ["LayerNormalization", "MatMul"]
    hopper = families.wgmma_runs_here
    families.wgmma_runs_here = lambda: True
    try:
        [wide] = make_plan(model, 8, GPU).plugin_steps  # 40 rows: wg_3xtf32
        hopper_device = Device("cuda", "test H200", "9.0")
        assert wide.kernel_name(GPU).startswith("matmul.ln*wg_3xtf32")
        assert [job.label for job in wide.compile_jobs(hopper_device)] == ["gemm_wgmma.cu", "row_prologue.cu"]
        few = make_plan(model, 3, GPU)  # 15 rows: gemv, which makes no pass over A to normalise in
        assert few.plugin_steps[0].ops == ["LayerNormalization"] and not few.plugin_steps[1].prologue
    finally:
        families.wgmma_runs_here = hopper


@pytest.mark.parametrize("case", ["over two axes", "a scale computed at run time"])
def test_a_layernorm_no_prologue_can_apply_stays_a_step(tmp_path, case):
    from onnx_builders import save
    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    proto = layernorm_model(axis=-2) if case == "over two axes" else layernorm_model(scale_input=True)
    runner = Runner(load_model(save(proto, tmp_path / "ln.onnx")), 2, "cpu")
    assert runner.plan.steps[0].ops == ["LayerNormalization"] and not any(s.prologue for s in runner.plan.plugin_steps)
