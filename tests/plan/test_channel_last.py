"""Which tensors a run in fp16 or bf16 keeps channel-last in the format (plan/channel_last.py), as a Hopper plan
sees it: between half-precision Conv steps alone (the GEMM's and the depthwise kernel's), never one a run hands back
or an FP32 step reads."""
from __future__ import annotations

import pytest
from onnx_builders import save
from precision_cases import conv_pair_model, mobilenet_block_model

from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.ops.conv.families.channel_last import INPUT, OUTPUT, RESIDUAL
from opplugin.plan.channel_last import linked_tensors
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import step_precisions

GPU = Device("cuda", "test GPU")


@pytest.fixture(scope="module")
def conv_pair(tmp_path_factory):
    """stem > Relu (r0) > conv3x3 > Relu (r1) > conv1x1 > + r0 (y, the output)."""
    return load_model(save(conv_pair_model(), tmp_path_factory.mktemp("links") / "conv_pair.onnx"))


def links_of(plan, precision="fp16", **kwargs) -> dict[str, int]:
    """Step name -> the links of the configuration it is built from (0: none)."""
    found = {}
    for name, step in step_precisions(plan, precision, **kwargs).items():
        config = families.parse(step.variant)[1] if step.variant and step.variant.startswith(("wg_", "dw_")) else None
        found[name] = getattr(config, "links", 0)
    return found


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_tensors_between_half_convs_stay_channel_last_and_the_output_does_not(conv_pair, precision):
    plan = make_plan(conv_pair, 8, GPU)
    variants = {name: p.variant for name, p in step_precisions(plan, precision).items()}
    assert linked_tensors(plan, variants) == {"r0", "r1"}  # y is the graph's output
    assert links_of(plan, precision) == {"stem": OUTPUT, "conv3x3": INPUT | OUTPUT, "conv1x1": INPUT | RESIDUAL}
    assert all(families.parse(v)[0].name == f"wg_{precision}" for v in variants.values())
    named = {name: p.channel_last for name, p in step_precisions(plan, precision).items()}
    assert named == {"stem": ("r0",), "conv3x3": ("r0", "r1"), "conv1x1": ("r1", "r0")}


@pytest.fixture(scope="module")
def mobilenet_block(tmp_path_factory):
    """stem > Relu (t0) > 1x1 expand > Clip (t1) > depthwise 3x3 > Clip (t2) > 1x1 project > + t0 (y, the output)."""
    return load_model(save(mobilenet_block_model(), tmp_path_factory.mktemp("links") / "mobilenet_block.onnx"))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_mobilenet_block_runs_its_depthwise_conv_in_the_format_and_links_every_inner_tensor(mobilenet_block, precision):
    plan = make_plan(mobilenet_block, 8, GPU)
    chosen = step_precisions(plan, precision)
    families_of = {name: families.parse(p.variant)[0].name for name, p in chosen.items()}
    assert families_of == {"stem": f"wg_{precision}", "expand": f"wg_{precision}", "depthwise": f"dw_{precision}", "project": f"wg_{precision}"}
    assert all(p.precision == precision and p.reason is None for p in chosen.values())
    assert linked_tensors(plan, {name: p.variant for name, p in chosen.items()}) == {"t0", "t1", "t2"}
    assert links_of(plan, precision) == {"stem": OUTPUT, "expand": INPUT | OUTPUT, "depthwise": INPUT | OUTPUT, "project": INPUT | RESIDUAL}
    assert {name: p.channel_last for name, p in chosen.items()} == {"stem": ("t0",), "expand": ("t0", "t1"), "depthwise": ("t1", "t2"),
                                                                     "project": ("t2", "t0")}


@pytest.mark.parametrize("channels", [16, 24])
def test_a_mobilenet_block_of_16_or_24_channels_runs_its_stem_and_projection_on_narrow_tiles_linked_too(tmp_path, channels):
    block = load_model(save(mobilenet_block_model(channels=channels), tmp_path / "block.onnx"))
    plan = make_plan(block, 8, GPU)
    chosen = step_precisions(plan, "fp16")
    assert {name: families.parse(p.variant)[1].bm for name, p in chosen.items() if name in ("stem", "project")} == {
        "stem": channels, "project": channels}  # wgmma.NARROW_MAPS: a tile of the group's own maps
    assert all(p.precision == "fp16" and p.reason is None for p in chosen.values())
    assert links_of(plan) == {"stem": OUTPUT, "expand": INPUT | OUTPUT, "depthwise": INPUT | OUTPUT, "project": INPUT | RESIDUAL}


def test_a_kept_input_of_the_depthwise_step_stays_fp32_and_its_output_is_still_linked(mobilenet_block):
    """The depthwise step's X kept (--keep t1): the expand step writes FP32 NCHW, the depthwise kernel rounds it as it loads it."""
    plan = make_plan(mobilenet_block, 8, GPU, keep=["t1"])
    assert links_of(plan) == {"stem": OUTPUT, "expand": INPUT, "depthwise": OUTPUT, "project": INPUT | RESIDUAL}


def test_a_kept_tensor_stays_fp32_and_its_readers_rewrite_it_themselves(conv_pair):
    plan = make_plan(conv_pair, 8, GPU, keep=["r1"])
    assert links_of(plan) == {"stem": OUTPUT, "conv3x3": INPUT, "conv1x1": RESIDUAL}


def test_a_reader_in_fp32_keeps_the_tensor_fp32(conv_pair):
    plan = make_plan(conv_pair, 8, GPU)
    kept = links_of(plan, "mixed", keep_fp32={"conv3x3": "kept for the test"})  # conv3x3 reads r0 in FP32
    assert kept == {"stem": 0, "conv3x3": 0, "conv1x1": 0}  # r0 goes to FP32 conv3x3; r1 comes from it


def test_nothing_is_linked_in_fp32_nor_on_the_cpu(conv_pair):
    assert set(links_of(make_plan(conv_pair, 8, GPU), "fp32").values()) == {0}
    cpu = make_plan(conv_pair, 8, Device("cpu"))
    assert all(not p.variant or "_h" not in p.variant for p in step_precisions(cpu, "fp16").values())


def test_the_plan_names_each_linked_steps_configuration_and_tensors(conv_pair):
    from opplugin.report.plan import build_plan_report, format_plan
    from opplugin.runtime.plan_record import record_plan_alone

    record = record_plan_alone(make_plan(conv_pair, 8, GPU), None, "fp16")
    steps = {s.name: s.implementation for s in record.steps}
    assert steps["conv3x3"].endswith("_h3+relu") and steps["conv1x1"].endswith("_h5+add")
    assert "channel-last in fp16: r1, r0" in format_plan(record)
    assert [s["channel_last"] for s in build_plan_report(record)["steps"]] == [["r0"], ["r0", "r1"], ["r1", "r0"]]
