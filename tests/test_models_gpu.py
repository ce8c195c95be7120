"""The shipped models end to end on the GPU: every Conv on a CUDA variant, same top-1 as onnxruntime."""
import numpy as np
import pytest

from opplugin import cuda
from opplugin.check import check
from opplugin.inputs import make_inputs
from opplugin.model import load_model
from opplugin.ops import conv_cuda
from opplugin.runner import Runner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("name", ["lenet86", "ece408_high"])
def test_shipped_model_on_all_test_images_matches_onnxruntime(name):
    model = load_model(name)
    inputs = make_inputs(model, 10000)
    runner = Runner(model, 10000, "cuda")
    assert runner.device.is_cuda
    assert all(k.name.startswith("conv.") and k.name != "conv.reference" for k in runner.kernels.values())
    result = check(runner, inputs.feeds, inputs.labels)
    failing = [r for r in result.records if not r["passed"]]
    assert not failing, failing
    assert result.top1_agreement == 1.0
    assert result.accuracy == result.reference_accuracy


@pytest.mark.parametrize("variant", [name for name, family in conv_cuda.FAMILIES.items() if family.exact])
def test_every_variant_runs_the_tiny_model(variant, tiny_model_path):
    model = load_model(tiny_model_path)
    runner = Runner(model, 9, "cuda", variants={"Conv": variant})
    feeds = {"x": np.random.default_rng(11).uniform(-1, 1, (9, 3, 12, 12)).astype(np.float32)}
    result = check(runner, feeds)
    assert result.passed, result.records
    assert all(variant in k.name for k in runner.kernels.values())


def test_timings_on_the_gpu_come_from_events(tiny_model_path):
    runner = Runner(load_model(tiny_model_path), 4, "cuda")
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, 3, 12, 12)).astype(np.float32)}
    profile = runner.profile(feeds, warmup=1, repeat=3)
    names = list(profile.step_ms)
    assert names[0] == "copy H2D x" and "conv1" in names
    assert all(min(v) >= 0 for v in profile.step_ms.values())
