"""A Conv whose prologue (a squeeze-and-excitation scale, a BatchNormalization > Relu) is fused takes its X channel-last
in the format too (ops/conv/families/wgmma.py: the prologue in a pass of its own, conv_prologue_channel_last), so that
EfficientNet's depthwise > SiLU writes the format's bits for both its readers, the squeeze's global pool and the
projection's scaled load. CPU: the plan links them. GPU: a Runner in fp16 and bf16 on such a block matches onnxruntime
within the format's rule, graphed and eager alike."""
from __future__ import annotations

import numpy as np
import pytest
from linked_runs import assert_within_the_formats_rule, runner_and_session
from onnx_builders import save
from precision_cases import se_block_model

from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.channel_last import INPUT, OUTPUT
from opplugin.ops.conv import families
from opplugin.ops.conv.families.channel_last import RESIDUAL
from opplugin.plan.partition import make_plan
from opplugin.plan.precision import step_precisions

PRECISIONS = ["fp16", "bf16"]


@pytest.fixture(scope="module")
def se_block(tmp_path_factory):
    return load_model(save(se_block_model(), tmp_path_factory.mktemp("se") / "se_block.onnx"))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_depthwise_output_goes_channel_last_to_the_squeeze_and_to_the_scaled_projection(se_block, precision):
    plan = make_plan(se_block, 16, Device("cuda", "test GPU"))
    chosen = {name: choice.variant for name, choice in step_precisions(plan, precision).items()}
    links = {name: families.parse(chosen[name])[1].links for name in ("depthwise", "project")}
    assert links["depthwise"] == INPUT | OUTPUT  # both of its readers take the format's bits
    assert links["project"] == INPUT | RESIDUAL  # the scaled X (its prologue) and the stem's output, as Add's operand
    assert chosen["squeeze"] == f"cuda_{precision}_h1"  # the global pool reads it too


# ---- GPU ----


@pytest.mark.gpu
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_runner_of_a_squeeze_and_excitation_block_keeps_its_links_within_the_formats_rule(se_block, precision):
    from opplugin.runtime import Runner

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    runner, session = runner_and_session(se_block, precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["project"].implementation.startswith(f"conv.scale*wg_{precision}_") and "_h5" in steps["project"].implementation
    x = np.random.default_rng().standard_normal((16, 3, 12, 12)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(se_block, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
