"""Dense Convs (a filter covering the whole input map) on the Gemm kernels: which Convs are
dense, the names and limits of the dense families, the default pick, the plan an offline
sm_90 device makes for a squeeze-and-excitation block, and the CPU run against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from onnx_builders import conv_spec as conv
from onnx_builders import se_block

from opplugin.gpu.device import Device
from opplugin.graph.model import Model
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config, nonfinite_exact_config
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families.dense import gemm_spec, is_dense
from opplugin.plan.partition import make_plan
from opplugin.runtime import Runner

OFFLINE_SM90 = Device("cuda", "offline", "9.0")


def weights(spec):
    rng = np.random.default_rng(0)
    return rng.standard_normal(spec.weight_shape, dtype=np.float32), rng.standard_normal(spec.out_channels, dtype=np.float32)


@pytest.mark.parametrize(("spec", "expected"), [
    (conv(1, 480, 20, (1, 1), (1, 1)), True),
    (conv(8, 64, 10, (3, 5), (3, 5)), True),  # a filter as large as the map
    (conv(1, 64, 10, (3, 3), (3, 3), strides=(2, 2)), True),  # one output pixel: the stride does nothing
    (conv(1, 64, 10, (3, 3), (1, 1)), False),  # a 1x1 filter on a larger map
    (conv(1, 64, 10, (1, 1), (3, 3), pads=(1, 1, 1, 1)), False),  # padded: taps outside the map
])
def test_which_convs_are_dense(spec, expected):
    assert is_dense(spec) is expected


def test_the_layer_reads_the_conv_tensors_as_they_are():
    layer = gemm_spec(conv(5, 37, 11, (3, 3), (3, 3)))
    assert (layer.m, layer.n, layer.k, layer.trans_b, layer.bias) == (5, 11, 37 * 9, True, "column")
    assert gemm_spec(conv(5, 37, 11, (1, 1), (1, 1), bias=False)).bias == "none"


def test_names_parse_into_the_gemm_configurations_of_a_dense_family():
    family, config = families.parse("dense_gemv_w1x1_k4")
    assert family.name == "dense_gemv" and config.name() == "dense_gemv_w1x1_k4" and (config.warp, config.splits) == ((1, 1), 4)
    assert families.parse("dense_tiled_b32x32x16_t4x4")[1].block == (32, 32, 16)


@pytest.mark.parametrize(("spec", "epilogue", "why"), [
    (conv(1, 64, 10, (3, 3), (1, 1)), NONE, "does not cover the whole"),
    (conv(1, 64, 16, (1, 1), (1, 1), group=4), NONE, "grouped Conv"),
    (conv(1, 64, 16, (1, 1), (1, 1)), Epilogue("Relu", residual=True), "not add+relu"),
])
def test_what_the_dense_families_turn_away_says_why(spec, epilogue, why):
    for name in ("dense_gemv", "dense_tiled"):
        reason = families.unsupported_reason(spec, name, weights(spec), epilogue)
        assert reason and why in reason, reason


@pytest.mark.parametrize(("batch", "maps", "family"), [
    (1, 48, "dense_gemv"), (16, 48, "dense_gemv"),
    (64, 48, "dense_gemv"),  # the Gemm heuristic's tiled would have 2 blocks: gemv spreads K over warps
    (4096, 1024, "dense_tiled"),  # 256 tiles: tiled fills the GPU
])
def test_the_default_pick_of_a_dense_conv_is_the_gemm_heuristics_unless_its_grid_is_short(batch, maps, family):
    spec = conv(batch, 480, maps, (1, 1), (1, 1))
    config = heuristic_config(spec, weights(spec), Epilogue("Silu"))
    assert config.family == family
    assert nonfinite_exact_config(spec, weights(spec)).family == family  # FP32 multiply-adds: NaN and Inf kept


def test_a_dense_conv_with_a_residual_add_goes_to_a_direct_family():
    spec = conv(1, 64, 16, (1, 1), (1, 1))
    assert not heuristic_config(spec, weights(spec), Epilogue("Relu", residual=True)).family.startswith("dense_")


@pytest.mark.parametrize("batch", [1, 32])
def test_an_offline_sm90_plan_runs_the_se_convs_on_the_gemm_kernels(batch):
    plan = make_plan(Model(se_block(96, 24, 7, np.random.default_rng(0)), "se"), batch, OFFLINE_SM90)
    named = {step.node.name: step.plugin.kernel_name(step.node, OFFLINE_SM90, None, step.fused)
             for step in plan.plugin_steps if step.node.op_type == "Conv"}
    assert set(named) == {"squeeze", "excite"}  # each step keeps its Conv node's name
    assert named["squeeze"].startswith("conv.dense_") and named["squeeze"].endswith("+relu"), named
    assert named["excite"].startswith("conv.dense_") and named["excite"].endswith("+hardsigmoid"), named


def test_the_se_block_on_the_cpu_device_matches_onnxruntime():
    rng = np.random.default_rng()
    proto = se_block(48, 12, 5, rng)
    x = rng.random((3, 48, 5, 5), dtype=np.float32) + np.float32(0.5)
    got = Runner(Model(proto, "se"), 3, "cpu").run({"x": x}).outputs["y"]
    [expected] = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
