"""The CPU half of the broad Conv coverage (issue 4, part 3): for drawn and
real-model Conv configurations, what the plugin would run on a GPU.

No GPU is needed: `unsupported_reason`, the heuristic choice and the plan only
read shapes. Every family answers without raising, every refusal says why,
group > 1 and dilation > 1 get a CUDA variant, filters past 64 KiB are refused
by the __constant__-memory families (saying so) and accepted by another, whose
kernel NVRTC compiles. ops/conv/test_fuzz_gpu.py runs the same configurations.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

import compile_cache
from conv_strategies import REAL_MODEL_CONFIGS, ConvConfig, conv_configs, exceeds_constant_memory
from onnx_builders import conv_model
from opplugin.lab import nvrtc_check
from opplugin.graph.model import Model
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import choose_config
from opplugin.ops.conv.epilogue import NONE
from opplugin.plan.partition import make_plan
from opplugin.gpu.device import Device
from opplugin.core.paths import CACHE_DIR_ENV

# A plan only asks the device whether it is CUDA; nothing here touches a GPU.
GPU = Device("cuda", "fuzz test GPU", "9.0")
EXACT = [name for name, family in families.FAMILIES.items() if family.exact]
CONSTANT = [name for name, family in families.FAMILIES.items() if family.constant_weights]


@pytest.fixture(scope="module", autouse=True)
def empty_tuning_cache(tmp_path_factory):
    """The heuristic choice, as on a machine where `opplugin tune` never ran."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("tuning-cache")))
        yield


def weights_of(config: ConvConfig):
    """Constant weights of the right shapes: the offer depends on shapes alone."""
    w = np.ones(config.w_shape, np.float32)
    return w, (np.ones(config.w_shape[0], np.float32) if config.bias else None)


def reasons(config: ConvConfig) -> dict[str, str | None]:
    """Every family's answer for this node; none may raise, every refusal is a sentence."""
    spec, weights = config.spec, weights_of(config)
    answers = {name: families.unsupported_reason(spec, name, weights) for name in families.FAMILIES}
    for name, reason in answers.items():
        assert reason is None or (isinstance(reason, str) and reason.strip()), f"{name} on {config}: {reason!r}"
    return answers


def plugin_choice(config: ConvConfig) -> str:
    """The variant `opplugin run` would build: the plan keeps the node, then the heuristic picks."""
    w, b = weights_of(config)
    plan = make_plan(Model(conv_model(config.x_shape, w, b, config.attributes), "conv_fuzz"), config.spec.batch, GPU)
    assert "conv" not in plan.fallbacks, f"{config} falls back to onnxruntime: {plan.fallbacks['conv']}"
    assert [step.name for step in plan.plugin_steps] == ["conv"]
    return choose_config(config.spec, (w, b), NONE, GPU)


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs())
def test_every_drawn_configuration_gets_a_cuda_variant_or_a_reason(config: ConvConfig):
    spec = config.spec
    answers = reasons(config)
    usable = [name for name in EXACT if answers[name] is None]
    if spec.group > 1 or max(spec.dilations) > 1:
        assert usable, f"no CUDA variant for group {spec.group} / dilation {spec.dilations}: {answers}"
    if exceeds_constant_memory(config):
        for name in CONSTANT:
            assert "64 KiB" in answers[name], f"{name} on {config}: {answers[name]}"
    if not usable:  # only then may the plugin leave the node to onnxruntime
        return
    chosen = plugin_choice(config)
    assert answers[families.family_of(chosen).name] is None and families.unsupported_reason(spec, chosen, weights_of(config)) is None
    event(f"heuristic picks {families.family_of(chosen).name}")


LARGE = [name for name, config in REAL_MODEL_CONFIGS.items() if exceeds_constant_memory(config)]


def test_most_real_model_shapes_exceed_constant_memory():
    assert len(LARGE) >= 6 and not exceeds_constant_memory(REAL_MODEL_CONFIGS["mobilenet-v1 depthwise 3x3 on 512 14x14"])


@pytest.mark.parametrize("name", list(REAL_MODEL_CONFIGS))
def test_real_model_shapes_run_on_a_cuda_variant(name):
    config = REAL_MODEL_CONFIGS[name]
    answers = reasons(config)
    chosen = families.family_of(plugin_choice(config))
    assert answers[chosen.name] is None
    if name in LARGE:
        for family in CONSTANT:
            assert "64 KiB" in answers[family] and "constant" in answers[family], f"{family}: {answers[family]}"
        assert not chosen.constant_weights, f"{name}: the heuristic chose {chosen.name}, which keeps filters in __constant__ memory"
        assert [v for v in EXACT if answers[v] is None and v not in CONSTANT], answers


COMPILED = [
    "resnet18.layer1 64->64 3x3 56x56",
    "resnet50 bottleneck 1x1 512->2048 7x7",
    "efficientnet-b0 depthwise 5x5 on 1152 7x7",
    # 512 map groups of one map: the map-group families refuse it (MAX_MAP_GROUPS), `const` runs it
    "mobilenet-v1 depthwise 3x3 on 512 14x14",
]


def compiled_variants(name: str) -> list[str]:
    """The heuristic's pick for a real-model node, and every other exact family that takes it."""
    config = REAL_MODEL_CONFIGS[name]
    answers = reasons(config)
    return list(dict.fromkeys([plugin_choice(config), *(v for v in EXACT if answers[v] is None)]))


@pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="cuda-bindings' NVRTC is not importable")
@pytest.mark.parametrize("name", COMPILED)
def test_real_model_kernels_compile_for_hopper(name):
    # as test_kernel_compile.test_variant_compiles: a constant-memory family's resources are read (the
    # build CuPy makes), the others only compile (NVRTC's fast-compile mode); through compile_cache,
    # in this process: a few seconds of compiles are not worth a pool's start

    for variant in compiled_variants(name):
        family = families.family_of(variant).name
        for usage in compile_cache.check_variant(REAL_MODEL_CONFIGS[name].spec, variant, "sm_90", fast=family not in CONSTANT):
            compile_cache.assert_clean(usage, family)
