"""LayerNormalization over the channel axis in the half-precision links (plan/channel_last.py,
ops/reduction/channel_last.py), as a Hopper plan sees ConvNeXt's start: stem > LayerNorm > depthwise Conv >
LayerNorm > 1x1 Conv + GELU > 1x1 Conv + the residual. A normalisation computes in FP32 and rounds once as it
stores, so it takes the format of the producer of its input and every tensor from the stem to the last Conv stays
channel-last; never a tensor a run hands back or onnxruntime reads, nor a normalisation of channels that are no
multiple of 8."""
from __future__ import annotations

import pytest
from channel_last_models import convnext_stage
from onnx_builders import save

from opplugin.errors import PluginError
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.channel_last import INPUT, OUTPUT
from opplugin.ops.reduction.channel_last import LinkedNorm
from opplugin.plan.channel_last import linked_tensors, supported
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import KEPT_BY_BUDGET, step_precisions
from opplugin.report.plan import format_plan
from opplugin.runtime.plan_record import record_plan_alone

GPU = Device("cuda", "test GPU")
PRECISIONS = ["fp16", "bf16"]
STEM_LN, BLOCK_LN = "layernormalization_stem_ln", "layernormalization_ln"  # the steps, by their nodes' names
INNER = {"stem", "stem_out", "dw", "ln_nchw", "fc1_gelu_nchw"}  # every tensor between the stem and y


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """side -> convnext_stage(side=side) loaded: None, "output" (stem_out handed back), "onnxruntime" (read by a Hardmax)."""
    folder = tmp_path_factory.mktemp("convnext")
    return {side: load_model(save(convnext_stage(side=side), folder / f"stage_{side}.onnx")) for side in (None, "output", "onnxruntime")}


def steps_of(plan) -> dict:
    return {step.name: step for step in plan.plugin_steps}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_layernorms_between_half_convs_are_linked_in_their_format(stages, precision):
    plan = make_plan(stages[None], 8, GPU)
    chosen = step_precisions(plan, precision)
    assert linked_tensors(plan, {name: p.variant for name, p in chosen.items()}) == INNER  # y is the output
    for name, tensors in ((STEM_LN, ("stem", "stem_out")), (BLOCK_LN, ("dw", "ln_nchw"))):
        assert chosen[name].variant == f"cuda_{precision}_h3" == LinkedNorm(f"cuda_{precision}", INPUT | OUTPUT).name()
        # no kernel in the format alone: linked, it runs in its tensors' format, and says so
        assert (chosen[name].precision, chosen[name].reason, chosen[name].channel_last) == (precision, None, tensors)
    assert chosen["conv_dw"].variant.endswith("_h3") and chosen["matmul_mm1"].channel_last == ("ln_nchw", "fc1_gelu_nchw")


def test_the_plan_lists_a_linked_layernorm_its_kernel_and_its_format(stages):
    record = record_plan_alone(make_plan(stages[None], 8, GPU), None, "bf16")
    steps = {s.name: s for s in record.steps}
    assert steps[BLOCK_LN].implementation == "layernorm.cuda_bf16_h3.4lanes"  # 32 channels: 4 lanes of 8 a pixel
    assert (steps[BLOCK_LN].precision, steps[BLOCK_LN].channel_last) == ("bf16", ("dw", "ln_nchw"))
    text = format_plan(record)
    assert "runs: layernorm.cuda_bf16_h3.4lanes" in text and "channel-last in bf16: dw, ln_nchw" in text


@pytest.mark.parametrize("side", ["output", "onnxruntime"])
def test_a_layernorm_output_handed_back_or_read_by_onnxruntime_stays_fp32_and_its_input_stays_linked(stages, side):
    plan = make_plan(stages[side], 8, GPU)
    chosen = step_precisions(plan, "fp16")
    assert linked_tensors(plan, {name: p.variant for name, p in chosen.items()}) == INNER - {"stem_out"}
    assert (chosen[STEM_LN].variant, chosen[STEM_LN].precision, chosen[STEM_LN].channel_last) == ("cuda_fp16_h1", "fp16", ("stem",))
    assert chosen["conv_dw"].variant.endswith("_h2")  # reads stem_out in FP32 NCHW, writes dw linked
    assert chosen[BLOCK_LN].variant == "cuda_fp16_h3"


def test_a_kept_layernorm_output_stays_fp32(stages):
    plan = make_plan(stages[None], 8, GPU, keep=["ln_nchw"])
    chosen = step_precisions(plan, "fp16")
    assert (chosen[BLOCK_LN].variant, chosen[BLOCK_LN].channel_last) == ("cuda_fp16_h1", ("dw",))


def test_a_layernorm_of_channels_no_multiple_of_8_is_not_linked_and_says_why(tmp_path):
    plan = make_plan(load_model(save(convnext_stage(channels=12), tmp_path / "c12.onnx")), 8, GPU)
    chosen = step_precisions(plan, "fp16")
    for name in (STEM_LN, BLOCK_LN):
        assert (chosen[name].variant, chosen[name].precision, chosen[name].channel_last) == (None, "fp32", ())
        assert chosen[name].reason == ("no fp16 kernel for LayerNormalization: a pixel's channels go 8 at a time (16 bytes); "
                                       "this LayerNormalization has 12")
    step = steps_of(plan)[BLOCK_LN]
    assert step.plugin.channel_last(step.node, GPU, None) is None
    with pytest.raises(PluginError, match="this LayerNormalization has 12"):
        step.plugin.linked_variant(step.node, GPU, "cuda_fp16_h1", frozenset({0}), True, "fp16")


def test_a_layernorm_between_fp32_steps_stays_fp32_and_says_it_would_run_linked(stages):
    kept = {"conv_dw": "kept for the test", "matmul_mm1": "kept for the test"}
    chosen = step_precisions(make_plan(stages[None], 8, GPU), "mixed", keep_fp32=kept)
    assert (chosen[BLOCK_LN].variant, chosen[BLOCK_LN].precision, chosen[BLOCK_LN].channel_last) == (None, "fp32", ())
    assert chosen[BLOCK_LN].reason == "no fp16 kernel for LayerNormalization alone: it runs in fp16 linked channel-last with 16-bit neighbours"
    assert chosen[STEM_LN].variant == "cuda_fp16_h1"  # the stem's output still comes linked


def test_a_layernorm_a_budget_keeps_in_fp32_keeps_fp32_tensors(stages):
    chosen = step_precisions(make_plan(stages[None], 8, GPU), "mixed", keep_fp32={BLOCK_LN: "kept for the test"})
    assert (chosen[BLOCK_LN].variant, chosen[BLOCK_LN].channel_last) == (None, ())
    assert chosen[BLOCK_LN].reason.startswith(KEPT_BY_BUDGET)
    assert chosen["conv_dw"].variant.endswith("_h1") and chosen["matmul_mm1"].variant.endswith("_h2")


def test_nothing_about_a_layernorm_is_linked_in_fp32_nor_on_the_cpu(stages):
    chosen = step_precisions(make_plan(stages[None], 8, GPU), "fp32")
    assert not any(p.channel_last for p in chosen.values()) and chosen[BLOCK_LN].variant is None
    cpu = make_plan(stages[None], 8, Device("cpu"))
    assert supported(cpu, {}).steps == {} and not any(p.channel_last for p in step_precisions(cpu, "fp16").values())
    assert step_precisions(cpu, "fp16")[BLOCK_LN].reason == "no fp16 kernel for LayerNormalization"


def test_a_layernorm_answers_for_links_in_any_format_and_refuses_what_it_cannot_keep(stages):
    step = steps_of(make_plan(stages[None], 8, GPU))[BLOCK_LN]
    plugin, node = step.plugin, step.node
    offer = plugin.channel_last(node, GPU, None)
    assert (offer.format, offer.inputs, offer.output) == (None, {0}, True)  # any format
    assert plugin.channel_last(node, GPU, "cuda") == offer and plugin.channel_last(node, GPU, "reference") is None
    assert plugin.channel_last(node, GPU, "cuda_bf16_h1").format == "bf16"  # a linked variant's own
    assert plugin.linked_variant(node, GPU, "cuda_bf16_h1", frozenset(), True, "bf16") == "cuda_bf16_h2"
    assert plugin.variant_precision(node, GPU, "cuda_bf16_h2") == "bf16" and plugin.variant_precision(node, GPU, None) == "fp32"
    with pytest.raises(PluginError, match="keeps no such tensor channel-last in fp16"):
        plugin.linked_variant(node, GPU, "cuda_bf16_h1", frozenset({0}), True, "fp16")
    with pytest.raises(PluginError, match="not inputs \\[1\\] in fp16"):  # the scale stays an FP32 constant
        plugin.linked_variant(node, GPU, None, frozenset({1}), True, "fp16")
    assert plugin.kernel_name(node, GPU, "cuda_fp16_h3") == "layernorm.cuda_fp16_h3.4lanes"
    assert plugin.kernel_name(node, GPU, None).startswith("layernorm.cuda.t")
