"""Pools in the half-precision links (plan/channel_last.py, ops/pool/channel_last.py), as a Hopper plan sees them:
a pool exact in any 16-bit format takes the format of the producer of its input, so that stem > MaxPool > block and
block > GlobalAveragePool (or ReduceMean over H and W) > Flatten > Gemm keep their tensors channel-last up to the
Gemm, which reads FP32; never a tensor a run hands back, nor one an FP32 step reads."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from onnx_builders import save
from precision_cases import HEADS, conv_head_model, conv_pool_model

from opplugin.errors import PluginError
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.channel_last import INPUT, OUTPUT
from opplugin.ops.conv import families
from opplugin.ops.conv.families.channel_last import RESIDUAL
from opplugin.ops.pool.channel_last import PLAIN, LinkedPool, linked_config
from opplugin.plan.channel_last import linked_tensors, supported
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import step_precisions
from opplugin.report.plan import format_plan
from opplugin.runtime.plan_record import record_plan_alone

GPU = Device("cuda", "test GPU")
PRECISIONS = ["fp16", "bf16"]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """pool op -> stem > Relu (r0) > the pool 3x3 s2 p1 (p) > conv3x3 > Relu (r1) > conv1x1 > + p (y)."""
    folder = tmp_path_factory.mktemp("pooled")
    return {op: load_model(save(conv_pool_model(op), folder / f"{op}.onnx")) for op in ("MaxPool", "AveragePool")}


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """head -> stem > Relu (r0) > conv3x3 > Relu (r1) > the head over H and W (g) > Flatten > fc (y)."""
    folder = tmp_path_factory.mktemp("heads")
    return {head: load_model(save(conv_head_model(head), folder / f"{head}.onnx")) for head in HEADS}


def links_of(plan, precision="fp16", **kwargs) -> dict[str, int]:
    """Step name -> the links of the configuration it is built from: a Conv's (wg_*), a pool's (cuda_*); 0: none."""
    steps = {step.name: step for step in plan.plugin_steps}
    found = {}
    for name, chosen in step_precisions(plan, precision, **kwargs).items():
        op = steps[name].node.op_type
        if op == "Conv" and chosen.variant and chosen.variant.startswith("wg_"):
            config = families.parse(chosen.variant)[1]
        else:
            config = linked_config(steps[name].node.spec, plan.device, chosen.variant) if op != "Gemm" else None
        found[name] = getattr(config, "links", 0)
    return found


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_pool_between_half_convs_is_linked_in_their_format(pooled, op, precision):
    plan = make_plan(pooled[op], 8, GPU)
    chosen = step_precisions(plan, precision)
    assert linked_tensors(plan, {name: p.variant for name, p in chosen.items()}) == {"r0", "p", "r1"}  # y is the output
    assert links_of(plan, precision) == {"stem": OUTPUT, "pool": INPUT | OUTPUT, "conv3x3": INPUT | OUTPUT, "conv1x1": INPUT | RESIDUAL}
    assert chosen["pool"].variant == f"{PLAIN}_{precision}_h3" == LinkedPool(f"cuda_{precision}", INPUT | OUTPUT).name()
    # a pool has no kernel in the format alone: linked, it runs in its tensors' format, and says so
    assert (chosen["pool"].precision, chosen["pool"].reason, chosen["pool"].channel_last) == (precision, None, ("r0", "p"))
    assert chosen["conv1x1"].channel_last == ("r1", "p")  # the pool's output is the block's residual too


def test_the_plan_runs_and_lists_a_linked_pool(pooled):
    record = record_plan_alone(make_plan(pooled["MaxPool"], 8, GPU), None, "bf16")
    steps = {s.name: s for s in record.steps}
    assert steps["pool"].implementation == "maxpool.cuda_bf16_h3.3x3s2p1"
    text = format_plan(record)
    assert "runs: maxpool.cuda_bf16_h3.3x3s2p1" in text and "channel-last in bf16: r0, p" in text


def test_a_pool_takes_the_format_of_its_producer_even_where_that_tensor_stays_fp32(pooled):
    plan = make_plan(pooled["MaxPool"], 8, GPU, keep=["r0"])  # r0 is handed back: the stem writes it FP32 NCHW
    assert links_of(plan) == {"stem": 0, "pool": OUTPUT, "conv3x3": INPUT | OUTPUT, "conv1x1": INPUT | RESIDUAL}
    assert step_precisions(plan, "fp16")["pool"].variant == "cuda_fp16_h2"


@pytest.mark.parametrize("handed_back", ["keep", "output"])
def test_a_pool_output_handed_back_stays_fp32_and_its_input_stays_linked(pooled, handed_back, tmp_path):
    if handed_back == "keep":
        plan = make_plan(pooled["MaxPool"], 8, GPU, keep=["p"])
    else:
        model = conv_pool_model()
        model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 64, 8, 8]))
        plan = make_plan(load_model(save(model, tmp_path / "p_out.onnx")), 8, GPU)
    # conv3x3 and conv1x1 read p as FP32 NCHW (rewriting it themselves); r1 between them stays linked
    assert links_of(plan) == {"stem": OUTPUT, "pool": INPUT, "conv3x3": OUTPUT, "conv1x1": INPUT}
    assert step_precisions(plan, "fp16")["pool"].channel_last == ("r0",)


def test_a_pool_after_an_fp32_step_is_not_linked_and_says_why_it_stays_fp32(pooled):
    plan = make_plan(pooled["MaxPool"], 8, GPU)
    chosen = step_precisions(plan, "mixed", keep_fp32={"stem": "kept for the test"})  # the stem writes r0 in FP32
    assert links_of(plan, "mixed", keep_fp32={"stem": "kept for the test"}) == {"stem": 0, "pool": 0, "conv3x3": OUTPUT,
                                                                                  "conv1x1": INPUT}
    assert (chosen["pool"].variant, chosen["pool"].precision, chosen["pool"].reason) == (None, "fp32", "no fp16 kernel for MaxPool")


def test_a_pool_a_budget_keeps_in_fp32_keeps_fp32_tensors(pooled):
    plan = make_plan(pooled["MaxPool"], 8, GPU)
    kept = {"pool": "kept for the test"}
    assert links_of(plan, "mixed", keep_fp32=kept) == {"stem": 0, "pool": 0, "conv3x3": OUTPUT, "conv1x1": INPUT}
    assert step_precisions(plan, "mixed", keep_fp32=kept)["pool"].reason.startswith("kept in FP32 by the budget")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("head", HEADS)
def test_a_global_pool_reads_the_last_block_channel_last_and_writes_fp32_for_the_gemm(heads, head, precision):
    plan = make_plan(heads[head], 8, GPU)
    chosen = step_precisions(plan, precision)
    assert linked_tensors(plan, {name: p.variant for name, p in chosen.items()}) == {"r0", "r1"}  # g stays FP32 for fc
    assert links_of(plan, precision) == {"stem": OUTPUT, "conv3x3": INPUT | OUTPUT, "head": INPUT, "fc": 0}
    assert (chosen["head"].variant, chosen["head"].precision, chosen["head"].channel_last) == (f"cuda_{precision}_h1", precision, ("r1",))
    record = {s.name: s.implementation for s in record_plan_alone(plan, None, precision).steps}
    assert record["head"] == f"globalaveragepool.cuda_{precision}_h1.{'global_flat' if head == 'ReduceMean_flat' else 'global'}"


def test_nothing_about_a_pool_is_linked_in_fp32_nor_on_the_cpu(pooled, heads):
    for model in (pooled["MaxPool"], heads["GlobalAveragePool"]):
        assert set(links_of(make_plan(model, 8, GPU), "fp32").values()) == {0}
        cpu = make_plan(model, 8, Device("cpu"))
        assert supported(cpu, {}).steps == {} and not any(p.channel_last for p in step_precisions(cpu, "fp16").values())


def test_a_pool_refuses_links_it_cannot_keep(pooled, heads):
    pool = next(s for s in make_plan(pooled["MaxPool"], 8, GPU).plugin_steps if s.name == "pool")
    assert pool.plugin.channel_last(pool.node, GPU, None).format is None  # any format
    assert pool.plugin.channel_last(pool.node, GPU, "cuda_bf16_h1").format == "bf16"  # a linked variant's own
    assert pool.plugin.linked_variant(pool.node, GPU, "cuda_bf16_h1", frozenset(), True, "bf16") == "cuda_bf16_h2"
    with pytest.raises(PluginError, match="keeps no such tensor channel-last in fp16"):
        pool.plugin.linked_variant(pool.node, GPU, "cuda_bf16_h1", frozenset({0}), True, "fp16")
    with pytest.raises(PluginError, match="not inputs \\[0\\] in tf32"):
        pool.plugin.linked_variant(pool.node, GPU, None, frozenset({0}), True, "tf32")
    head = next(s for s in make_plan(heads["GlobalAveragePool"], 8, GPU).plugin_steps if s.name == "head")
    assert head.plugin.channel_last(head.node, GPU, None).output is False
    with pytest.raises(PluginError, match="keeps no such tensor channel-last"):
        head.plugin.linked_variant(head.node, GPU, None, frozenset({0}), True, "fp16")
    conv = next(s for s in make_plan(pooled["MaxPool"], 8, GPU).plugin_steps if s.name == "conv3x3")
    variant = conv.plugin.precision_variant(conv.node, GPU, "fp16", conv.fused, conv.prologue).variant
    with pytest.raises(PluginError, match="keeps its tensors in fp16, not bf16"):  # a Conv's format is its family's
        conv.plugin.linked_variant(conv.node, GPU, variant, frozenset({0}), True, "bf16", conv.fused, conv.prologue)


LIGHT_RESNET50 = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


@pytest.mark.skipif(not LIGHT_RESNET50.exists(), reason="the onnx package has no light_resnet50.onnx")
def test_resnet50_keeps_every_tensor_from_the_stem_to_the_head_channel_last_in_fp16():
    """ResNet-50 (onnx's light copy: its head a 7x7 AveragePool into a Gemm): the stem writes its output for the MaxPool,
    which writes the first block's input, and the last block's output goes to the AveragePool, which writes FP32."""
    plan = make_plan(load_model(str(LIGHT_RESNET50)), 1, GPU)
    links = links_of(plan)
    steps = {step.name: step.node.op_type for step in plan.plugin_steps}
    pools = {steps[name]: found for name, found in links.items() if steps[name] in ("MaxPool", "AveragePool")}
    assert pools == {"MaxPool": INPUT | OUTPUT, "AveragePool": INPUT}
    convs = [found for name, found in links.items() if steps[name] == "Conv"]
    assert convs[0] == OUTPUT and all(found & INPUT and found & OUTPUT for found in convs[1:]) and len(convs) == 53
