"""The shipped models end to end on the GPU: every plugin step on a CUDA kernel, same top-1 as onnxruntime."""
import numpy as np
import pytest

from opplugin.verify.check import check
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.ops.conv import families
from opplugin.ops.conv.families.dense import FAMILIES as DENSE_FAMILIES
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["lenet86", "ece408_high", "mlp_onehidden"])
def test_shipped_model_on_all_test_images_matches_onnxruntime(name):
    model = load_model(name)
    inputs = make_inputs(model, 10000)
    runner = Runner(model, 10000, "cuda")
    assert runner.device.is_cuda
    assert all(step.kind == "plugin" for step in runner.plan.steps)  # Conv, the Flatten view and the Gemms
    assert all(k.name.split(".")[0] in ("conv", "view", "gemm") and ".reference" not in k.name for k in runner.kernels.values())
    result = check(runner.run, runner.plan_record(10000), inputs.feeds, inputs.labels)
    failing = [r for r in result.records if not r["passed"]]
    assert not failing, failing
    assert result.top1_agreement == 1.0
    assert result.accuracy == result.reference_accuracy


# every exact family but those that take one kind of Conv only: depthwise and grouped (ops/conv/families/test_depthwise_gpu.py runs
# them in models), the dense ones, a filter over the whole map (ops/conv/families/test_dense_gpu.py runs them in an SE block),
# and wg_3xtf32, groups of 32 input channels (the tiny model's first Conv has 3; ops/conv/test_prologue_gpu.py runs
# it in models)
ONE_KIND_ONLY = ("depthwise", "grouped", "wg_3xtf32", *(family.name for family in DENSE_FAMILIES))


@pytest.mark.parametrize("variant", [name for name, family in families.FAMILIES.items() if family.exact and name not in ONE_KIND_ONLY])
def test_every_variant_runs_the_tiny_model(variant, tiny_model_path):
    model = load_model(tiny_model_path)
    runner = Runner(model, 9, "cuda", variants={"Conv": variant})
    feeds = {"x": np.random.default_rng(11).uniform(-1, 1, (9, 3, 12, 12)).astype(np.float32)}
    result = check(runner.run, runner.plan_record(9), feeds)
    assert result.passed, result.records
    assert all(variant in runner.kernels[s.name].name for s in runner.plan.plugin_steps if s.node.op_type == "Conv")


# Host-clock spans (onnxruntime on the CPU) and CUDA-event spans share one time line
# to within tens of microseconds (see runtime/timeline.py).
CLOCK_SLACK_MS = 0.1


def test_timings_on_the_gpu_come_from_events(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cuda")
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, 3, 12, 12)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=1, repeat=3)
    names = list(profile.step_ms)
    assert names[0] == "copy H2D x" and "conv1" in names
    # one chunk on one stream: every kernel took time, and the steps and copies ran one
    # after another, inside the run's host-to-host time
    result = profile.result
    assert result.chunks == 1
    spans = result.spans
    assert all(span.ms > 0 for span in spans if span.kind == "plugin")
    assert all(a.end_ms <= b.start_ms + CLOCK_SLACK_MS for a, b in zip(spans, spans[1:])), spans
    assert 0 <= spans[0].start_ms and spans[-1].end_ms <= result.total_ms + CLOCK_SLACK_MS
