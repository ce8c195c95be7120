"""The pointwise compiler on the CPU: the numpy reference (the CPU device's kernel) against
onnxruntime and float64 for every op and operand form, NaN and Inf included; the plan's groups
(which nodes join, the outputs kept, convexity, what a Conv takes first, refusals with their
reasons); check end to end; and every generated source compiled offline with NVRTC."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnx_builders import save
from opplugin import registry
from opplugin.cli import main
from opplugin.gpu.device import CPU
from opplugin.graph.model import load_model
from opplugin.ops.activation import KINDS, SILU
from opplugin.ops.pointwise import OPS, PointwisePlugin, codegen
from opplugin.ops.pointwise.group import PointwiseGroup
from opplugin.plan.partition import make_plan
from pointwise_cases import (BINARY, OPERANDS, UNARY, assert_close, batchnorm_model, binary_model, cast_model, expand_model, feeds,
                             onnxruntime_outputs, se_gelu_model, unary_id, unary_model, where_model)
from resnet_block import resnet_block

BATCH = 3


def planned(model, tmp_path, batch=BATCH, registry_=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return make_plan(load_model(save(model, tmp_path / "model.onnx")), batch, CPU, registry_)


def run_step(plan, step, inputs):
    return step.build(CPU)([inputs[n] for n in step.inputs])


def only_step(model, tmp_path):
    plan = planned(model, tmp_path)
    [step] = plan.steps
    assert step.kind == "plugin", plan.fallbacks
    return plan, step


def check_against_onnxruntime(model, tmp_path, rtol=1e-6, atol=1e-6, seed=1):
    """The plan's one step on fresh poisoned feeds against onnxruntime CPU and the float64 oracle."""
    plan, step = only_step(model, tmp_path)
    inputs = feeds(model, BATCH, seed=seed, poison=True)
    [ours] = run_step(plan, step, inputs)
    [theirs] = onnxruntime_outputs(model, inputs, ["y"])
    assert_close(ours, theirs, rtol, atol)
    group = PointwiseGroup.of([step.node, *step.fused], step.inputs, step.outputs)
    [exact] = group.evaluate([inputs[n] for n in step.inputs])
    assert_close(ours, exact.astype(ours.dtype), 0, 0)  # the CPU kernel is the oracle rounded once
    return step


def test_every_listed_op_has_a_built_in_plugin_of_the_pointwise_group_kind():
    wanted = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu",
              "LeakyRelu", "Elu", "Clip", "HardSigmoid", "HardSwish", "Softplus", "Min", "Max", "Where", "Cast", "Gelu",
              "BatchNormalization", "Sum", "Expand"}
    assert wanted | (set(KINDS) - {SILU}) == set(OPS)
    for op in OPS:
        plugin = registry.plugin_for(op)
        assert registry.is_builtin(plugin) and isinstance(plugin, PointwisePlugin), op


@pytest.mark.parametrize("case", UNARY, ids=unary_id)
def test_each_one_operand_op_matches_onnxruntime_nan_and_inf_included(case, tmp_path):
    step = check_against_onnxruntime(unary_model(*case), tmp_path)
    assert step.ops == [case[0]]


@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_broadcast_every_operand_form_as_onnxruntime(op, operand, tmp_path):
    check_against_onnxruntime(binary_model(op, operand, constant_first=operand in ("channel", "se_scale")), tmp_path)


def test_a_sum_of_three_and_a_one_operand_max(tmp_path):
    three = binary_model("Sum", "se_scale")
    three.graph.node[0].input.append("x")
    check_against_onnxruntime(three, tmp_path / "sum")
    check_against_onnxruntime(unary_model("Max", {}), tmp_path / "max")


def test_where_with_a_bool_condition_from_onnxruntime(tmp_path):
    model = where_model()
    plan = planned(model, tmp_path)
    [less, where] = plan.steps
    assert less.kind == "onnxruntime" and where.ops == ["Where"] and where.inputs == ["cond", "x"]
    inputs = feeds(model, BATCH, seed=2, poison=True)
    cond = inputs["x"] < np.float32(0.25)  # as the Less step computes it (NaN compares false)
    [ours] = where.build(CPU)([cond, inputs["x"]])
    [theirs] = onnxruntime_outputs(model, inputs, ["y"])
    assert_close(ours, theirs, 0, 0)
    assert main(["check", save(model, tmp_path / "where.onnx"), "--batch", "2", "--device", "cpu"]) == 0


@pytest.mark.parametrize("via,then", [(np.float16, None), (np.float64, None), (np.float16, "Relu"), (np.float16, "Sigmoid")],
                         ids=["f16", "f64", "f16_relu", "f16_sigmoid"])
def test_casts_between_float_types_and_float16_arithmetic(via, then, tmp_path):
    """A Cast rounds exactly as onnxruntime's. A float16 node's result is rounded to float16 (ONNX's meaning,
    and the oracle's); onnxruntime's CPU provider computes such a node in float32 between casts it inserts
    and elides, so against it the tolerance is float16's."""
    tolerance = 2.0 ** -10 if then else 0
    step = check_against_onnxruntime(cast_model(via, then), tmp_path, rtol=tolerance, atol=tolerance)
    assert step.ops == ["Cast", *([then] if then else []), "Cast"]


def test_float64_arithmetic_is_refused_with_the_reason(tmp_path):
    plan = planned(cast_model(np.float64, "Sqrt"), tmp_path)
    assert "float64" in plan.fallbacks["then"] and "not implemented" in plan.fallbacks["then"]


@pytest.mark.parametrize("then_relu", [False, True], ids=["alone", "relu"])
def test_a_standalone_batchnormalization_is_a_per_channel_affine(then_relu, tmp_path):
    step = check_against_onnxruntime(batchnorm_model(then_relu), tmp_path, rtol=1e-5, atol=1e-5)
    assert step.ops == ["BatchNormalization", *(["Relu"] if then_relu else [])]


@pytest.mark.parametrize("then_mul", [False, True], ids=["alone", "mul"])
def test_an_expand_by_a_constant_shape_broadcasts_in_the_group(then_mul, tmp_path):
    step = check_against_onnxruntime(expand_model(then_mul), tmp_path)
    assert step.ops == ["Expand", *(["Mul"] if then_mul else [])]


def test_one_group_computes_the_se_scale_and_gelu_and_keeps_the_product_read_outside(tmp_path):
    model = se_gelu_model()
    plan = planned(model, tmp_path)
    [group, pool] = plan.steps
    # the GELU written out (Div, Erf, Add, Mul, Mul) is one Gelu node once loaded (graph/passes/gelu.py)
    assert group.ops == ["Sigmoid", "Mul", "Gelu"] and pool.ops == ["MaxPool"]
    assert set(group.inputs) == {"x", "s"} and group.outputs == ["m", "y"]  # m: read by the pool, nothing lost
    inputs = feeds(model, BATCH, seed=4, poison=True)
    ours = dict(zip(group.outputs, run_step(plan, group, inputs)))
    model.graph.output.append(helper.make_tensor_value_info("m", 1, ["N", 6, 5, 7]))  # to read it from onnxruntime
    theirs = dict(zip(["m", "y"], onnxruntime_outputs(model, inputs, ["m", "y"])))
    for name in ("m", "y"):
        assert_close(ours[name], theirs[name], 1e-6, 1e-6)
    del model.graph.output[-1]
    assert main(["check", save(model, tmp_path / "se.onnx"), "--batch", "5", "--device", "cpu"]) == 0


def test_a_group_stays_convex_a_path_leaving_it_does_not_come_back(tmp_path):
    """a = Relu(x) -> MaxPool -> p; Add(a, p) would be a path out of {Relu, Add} and back: the Add starts a group of its own."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("MaxPool", ["a"], ["p"], name="pool", kernel_shape=[1, 1]),
             helper.make_node("Add", ["a", "p"], ["s"], name="add"),
             helper.make_node("Tanh", ["s"], ["y"], name="tanh")]
    from pointwise_cases import _value, finish
    model = finish(helper.make_graph(nodes, "detour", [_value("x", ("N", 6, 5, 7))], [_value("y", ("N", 6, 5, 7))]))
    plan = planned(model, tmp_path)
    assert [s.ops for s in plan.steps] == [["Relu"], ["MaxPool"], ["Add", "Tanh"]]
    assert plan.steps[0].outputs == ["a"] and plan.steps[2].inputs == ["a", "p"]
    assert main(["check", save(model, tmp_path / "detour.onnx"), "--batch", "2", "--device", "cpu"]) == 0


def test_a_conv_takes_its_residual_add_and_relu_first_and_the_rest_groups(tmp_path):
    from nonfinite_cases import UnfusedConv

    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    plan = make_plan(model, 4, CPU)
    assert all(step.kind == "plugin" for step in plan.steps) and plan.fusions_given_up == {}
    assert ["Conv", "Add", "Relu"] in [step.ops for step in plan.steps]  # into the Conv's epilogue
    # a Conv that fuses nothing leaves the residual Add and its Relu to one pointwise group
    unfused = make_plan(model, 4, CPU, registry.plugins() | {"Conv": UnfusedConv()})
    assert all(step.kind == "plugin" for step in unfused.steps) and ["Add", "Relu"] in [step.ops for step in unfused.steps]


def test_check_passes_on_the_resnet_block(tmp_path):
    assert main(["check", save(resnet_block(), tmp_path / "block.onnx"), "--batch", "5", "--device", "cpu"]) == 0


def test_a_node_with_a_plugin_of_its_own_stays_out_of_the_group(tmp_path):
    class OwnMul(registry.Plugin):
        op_type = "Mul"

        def supports(self, node, device):
            return None

        def build(self, node, device, variant=None, fused=(), prologue=(), graphed=True):
            raise AssertionError("not built in this test")

    plan = planned(se_gelu_model(), tmp_path, registry_=registry.plugins() | {"Mul": OwnMul()})
    assert [s.ops for s in plan.steps][:3] == [["Sigmoid"], ["Mul"], ["Gelu"]]


def test_operands_the_compiler_cannot_take_are_left_to_onnxruntime_with_the_reason(tmp_path):
    batch_constant = binary_model("Add", "same")
    batch_constant.graph.input.pop()  # b becomes a constant with a batch axis of 3
    batch_constant.graph.initializer.append(numpy_helper.from_array(np.ones((BATCH, 6, 5, 7), np.float32), "b"))
    assert "has a batch axis" in planned(batch_constant, tmp_path).fallbacks["node"]
    runtime_clip = unary_model("Clip", {}, ())
    runtime_clip.graph.node[0].input.append("x")  # min computed at run time
    assert "cannot be compiled in" in planned(runtime_clip, tmp_path).fallbacks["node"]


def test_merged_axes_and_vector_width(tmp_path):
    """(N, C, H, W) * (N, C, 1, 1) runs over (N, C, H*W): float4 when H*W is a multiple of 4."""
    model = binary_model("Mul", "se_scale", shape=(6, 4, 8))
    plan, step = only_step(model, tmp_path)
    group = PointwiseGroup.of([step.node], step.inputs, step.outputs)
    extents, strides = codegen.merged_axes(group, [t.shape for t in group.arguments] + [t.shape for _, t in group.outputs])
    assert extents == [BATCH, 6, 32] and strides == [[192, 32, 1], [6, 1, 0], [192, 32, 1]]
    assert codegen.source(group, "t")[1] == 4
    _, odd_step = only_step(binary_model("Mul", "se_scale"), tmp_path / "odd")
    odd = PointwiseGroup.of([odd_step.node], odd_step.inputs, odd_step.outputs)
    assert codegen.source(odd, "t")[1] == 1  # 5 * 7 = 35


# --- the generated sources compile offline (NVRTC, no GPU), without spills ----------------------------

def _groups_to_compile(tmp_path):
    models = {"se_gelu": se_gelu_model(), "where": where_model(), "bn_relu": batchnorm_model(True), "f16": cast_model(np.float16, "Sigmoid"),
              "f64": cast_model(np.float64), "se_v4": binary_model("Mul", "se_scale", shape=(6, 4, 8)),
              "row": binary_model("Pow", "runtime_row"), "expand_mul": expand_model(True), **{unary_id(c): unary_model(*c) for c in UNARY}}
    for name, model in models.items():
        plan = planned(model, tmp_path / name)
        step = next(s for s in plan.steps if s.kind == "plugin")
        yield name, PointwiseGroup.of([step.node, *step.fused], step.inputs, step.outputs)


def test_generated_sources_compile_with_nvrtc_without_spills(tmp_path):
    from opplugin.gpu import cuda
    from opplugin.lab import nvrtc_check

    if not nvrtc_check.nvrtc_available():
        pytest.skip("NVRTC (cuda-bindings) is not installed")
    for name, group in _groups_to_compile(tmp_path):
        text, width = codegen.source(group, name)
        _, log = nvrtc_check.compile_cubin(text, cuda.BASE_OPTIONS, "sm_90", name=f"{name}.cu")
        usages = nvrtc_check.parse_ptxas_log(log, "sm_90")
        assert set(usages) == {codegen.FUNCTIONS[v] for v in {1, width}}, name
        assert all(u.spills == 0 and u.stack_frame == 0 for u in usages.values()), (name, log)
