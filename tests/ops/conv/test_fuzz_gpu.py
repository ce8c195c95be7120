"""Broad Conv coverage on the GPU (issue 4, part 3): drawn and real-model Conv
configurations through the Conv plugin and every FP32-exact family, against onnxruntime.

Each configuration runs two ways:
- through the default configuration of every exact family that accepts it, into
  an output poisoned with NaN, so an element a kernel never writes fails (the
  families compile side by side on threads first);
- as `opplugin run` runs it: a one-Conv model (weights as initializers) through a
  Runner on the GPU, the variant chosen by the heuristic (the tuning cache points
  at an empty folder), host to host; then the chosen kernel once more into a
  poisoned output.
Every result is compared with onnxruntime's CPU provider on the same fresh
standard-normal inputs, within a per-element bound from the float64 sum of
|terms| (conv_strategies.error_bound). A family that refuses must say why; the
plugin may fall back to onnxruntime only when every family refuses, never for
group > 1 or dilation > 1 (the baseline runs any 2-D Conv).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from conv_strategies import (
    LAYOUTS,
    REAL_MODEL_CONFIGS,
    ConvConfig,
    assert_within_bound,
    conv_configs,
    error_bound,
    exceeds_constant_memory,
    layout_of,
)
from onnx_builders import conv_model
from opplugin.gpu import cuda
from opplugin.graph.model import Model
from opplugin.ops.conv import families
from opplugin.core.paths import CACHE_DIR_ENV

pytestmark = pytest.mark.gpu

EXACT = [name for name, family in families.FAMILIES.items() if family.exact]
BUILD_THREADS = min(8, os.cpu_count() or 1)
# Sized (times the three layouts) for about a minute and a half on an H200, where
# NVRTC compiles (about ten kernels an example) take most of the time: a grouped
# or depthwise example takes ~10 s, since the constant-memory families unroll
# code per map group. The first two examples of each layout are the 1x1 extremes.
# Derandomized and without a database, so every run draws the same examples; no
# shrinking, which would compile for minutes: the failure names the drawn values.
FUZZ_SETTINGS = settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module", autouse=True)
def empty_tuning_cache(tmp_path_factory):
    """The heuristic choice, as on a machine where `opplugin tune` never ran."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("tuning-cache")))
        yield


class Problem:
    """One configuration with its inputs, the model carrying its weights and onnxruntime's answer."""

    def __init__(self, config: ConvConfig, seed: int):
        self.config, self.spec, self.seed = config, config.spec, seed
        self.x, self.w, self.b = config.random_arrays(np.random.default_rng(seed))
        self.model = Model(conv_model(config.x_shape, self.w, self.b, config.attributes), "conv_fuzz")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(self.model.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (self.expected,) = session.run(None, {"x": self.x})
        self.expected = self.expected.astype(np.float64)
        self.bound = error_bound(self.spec, self.x, self.w, self.b)

    @property
    def weights(self):
        return self.w, self.b

    def device_inputs(self) -> list:
        import cupy

        return [cupy.asarray(a) for a in (self.x, self.w, self.b) if a is not None]

    def run_poisoned(self, kernel) -> np.ndarray:
        import cupy

        out = cupy.full(self.spec.output_shape(), cupy.nan, dtype=cupy.float32)
        [y] = kernel(self.device_inputs(), None, out=out)
        assert y is out
        return cupy.asnumpy(y)

    def check(self, got: np.ndarray, what: str) -> None:
        assert_within_bound(got, self.expected, self.bound, f"{what} on {self.config} (seed {self.seed})")


def run_like_opplugin(problem: Problem) -> tuple[str | None, str | None]:
    """(chosen variant, None) or (None, fallback reason), after checking the result
    host to host and the chosen kernel into a poisoned output."""
    from opplugin.runtime import Runner

    runner = Runner(problem.model, problem.spec.batch, "cuda")
    result = runner.run({"x": problem.x})
    problem.check(result.outputs["y"], f"Runner ({runner.kernels['conv'].name})")
    if "conv" in runner.plan.fallbacks:
        return None, runner.plan.fallbacks["conv"]
    kernel = runner.kernels["conv"]
    problem.check(problem.run_poisoned(kernel), kernel.name)
    return kernel.name.removeprefix("conv."), None


def run_every_exact_family(problem: Problem) -> dict[str, str]:
    """Runs each exact family that accepts the node; returns the refusals (family -> reason)."""
    answers = {name: families.unsupported_reason(problem.spec, name, problem.weights) for name in EXACT}
    refused = {name: reason for name, reason in answers.items() if reason is not None}
    for name, reason in refused.items():
        assert reason.strip(), f"{name} refuses {problem.config} without a reason"
    accepted = [name for name in EXACT if name not in refused]
    # NVRTC releases the GIL: compiling the families side by side saves most of the wait
    with ThreadPoolExecutor(BUILD_THREADS) as pool:
        kernels = list(pool.map(lambda name: families.build_kernel(problem.spec, name, problem.weights), accepted))
    cuda.synchronize()  # the constant uploads ran on the builder threads
    for kernel in kernels:
        problem.check(problem.run_poisoned(kernel), kernel.name)
    return refused


@pytest.mark.parametrize("layout", LAYOUTS)
@FUZZ_SETTINGS
@given(data=st.data())
def test_drawn_configurations_run_on_cuda_and_match_onnxruntime(layout: str, data):
    # one run per layout, so that each gets its share of the examples
    config = data.draw(conv_configs(layouts=(layout,)), label="config")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    problem = Problem(config, seed)
    spec = problem.spec
    assert layout_of(spec) == layout
    if max(spec.dilations) > 1:
        event("dilation > 1")
    if exceeds_constant_memory(config):
        event("filters past 64 KiB")

    refused = run_every_exact_family(problem)  # first: compiles in parallel what the runner will reuse
    variant, fallback = run_like_opplugin(problem)
    if variant is not None:
        event(f"plugin ran: {families.family_of(variant).name}")
    else:
        event("plugin fell back to onnxruntime")
        assert fallback and fallback.strip(), f"{config}: fell back without a reason"
        assert spec.group == 1 and max(spec.dilations) == 1, f"{config}: group/dilation fell back: {fallback}"
        accepted = [v for v in families.FAMILIES if families.unsupported_reason(spec, v, problem.weights) is None]
        assert not accepted, f"{config}: fell back ({fallback}) though {accepted} accept it"

    event(f"exact families run: {len(EXACT) - len(refused)} of {len(EXACT)}")
    print(f"{config}: plugin ran {variant or 'onnxruntime (' + str(fallback) + ')'}; families refusing: {sorted(refused)}")


@pytest.mark.parametrize("name", list(REAL_MODEL_CONFIGS))
def test_real_model_shapes_run_on_cuda_and_match_onnxruntime(name):
    config = REAL_MODEL_CONFIGS[name]
    problem = Problem(config, int(np.random.SeedSequence().entropy % 2**32))
    large = exceeds_constant_memory(config)

    refused = run_every_exact_family(problem)
    variant, fallback = run_like_opplugin(problem)
    assert fallback is None, f"{name} fell back to onnxruntime: {fallback}"
    family = families.family_of(variant)
    if large:
        assert not family.constant_weights, f"{name}: filters past 64 KiB, yet the plugin chose {variant}"
        for constant_family in (v for v in EXACT if families.FAMILIES[v].constant_weights):
            reason = refused.get(constant_family, "")
            assert "64 KiB" in reason and "constant" in reason, f"{constant_family} on {name}: {reason or 'accepted'}"
    print(f"{name}: plugin ran {variant}; exact families run: {[v for v in EXACT if v not in refused]}; refused: {refused}")
