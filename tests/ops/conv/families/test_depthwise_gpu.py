"""On the GPU: the depthwise and grouped families and the grouped GEMMs on the grouped and depthwise layers of
`opplugin bench --suite cnn` (ResNeXt, RegNet, EfficientNet, ConvNeXt, MobileNetV2), at batch 1
and 2, against the float64 reference, inputs drawn fresh and the output poisoned with NaN first;
their fused residual Add and ReLU; and a one-Conv model of each kind through the Runner's default
pick against onnxruntime. The odd shapes (depth multipliers, asymmetric pads, dilation, tails of
tiles) reach both through ops/conv/test_families_gpu.py, which runs every exact family."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import conv_model
from family_gpu_checks import MAX_RELATIVE_L2, draw, run_and_compare
from onnx_builders import conv_spec as conv

from opplugin.verify.check import check
from opplugin.errors import PluginError
from opplugin.lab import cnn_layers
from opplugin.graph.model import Model
from opplugin.ops.conv import families, reference
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu

GROUPED_LAYERS = {layer.name: layer for layer in cnn_layers.LAYERS if layer.group > 1}


def offered(spec):
    """The configurations tried here: the depthwise family's first three and first two unstaged ones on
    depthwise layers, else the grouped family's first two and first unstaged one, the SIMT GEMM's first
    two and the tensor-core GEMM's first."""
    if spec.in_channels == spec.group:
        configs = families.FAMILIES["depthwise"].configs(spec)
        return [*configs[:3], *[c for c in configs if not c.staged][:2]]
    wgmma = [c for c in families.FAMILIES["wg_3xtf32"].configs(spec)[:1] if families.unsupported_reason(spec, c, ones(spec)) is None]
    grouped = families.FAMILIES["grouped"].configs(spec)
    several = [c for c in grouped if c.maps > 1]
    return [*grouped[:2], *[c for c in grouped if not c.staged][:1], *several[:1], *[c for c in several if c.maps >= 4][:1],
            *families.FAMILIES["simt_gemm"].configs(spec)[:2],
            *families.FAMILIES["tc_3xtf32"].configs(spec)[:1], *wgmma]


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)


CASES = [(name, batch, config) for name in GROUPED_LAYERS for batch in (1, 2) for config in offered(GROUPED_LAYERS[name].spec(batch))]


@pytest.mark.parametrize(("layer", "batch", "config"), CASES, ids=[f"{n}-b{b}-{c}" for n, b, c in CASES])
def test_configurations_match_float64_on_the_grouped_suite_layers(layer, batch, config):
    spec = GROUPED_LAYERS[layer].spec(batch)
    seed, x, w, b, _ = draw(spec)
    assert families.unsupported_reason(spec, config, (w, b)) is None
    run_and_compare(spec, config, NONE, x, w, b, None, f"{config} on {layer} batch {batch} (seed {seed})")


RESIDUAL = {
    # a depth multiplier of 2 with dilation; several maps a block with a tile tail; groups of 4 and 16, split K
    "depthwise_t2x4_b8x8_p2": conv(2, 12, 24, (15, 13), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=12),
    "depthwise_t1x4_b7x8_p4": conv(3, 40, 40, (7, 7), (7, 7), pads=(3, 3, 3, 3), group=40),
    # unstaged: windows read from global memory, with their pads, a depth multiplier, maps past M and a stride
    "depthwise_t2x2_b8x8_p2_l0": conv(2, 12, 24, (15, 13), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=12),
    "depthwise_t1x1_b7x8_p3_l0": conv(3, 40, 40, (7, 7), (5, 5), strides=(2, 2), pads=(2, 2, 2, 2), group=40),
    "grouped_t1x2_b8x8_p2_l0": conv(2, 24, 48, (11, 13), (5, 5), strides=(2, 1), pads=(2, 1, 2, 3), group=6),
    "grouped_t2x4_b8x8_p2": conv(2, 24, 48, (11, 13), (5, 5), strides=(2, 1), pads=(2, 1, 2, 3), group=6),
    # several maps a thread: staged (vector tap loads of 2 and 4 maps) and unstaged, tails of tiles, dilation
    "grouped_t2x2_b8x8_p4_m4": conv(2, 24, 48, (11, 13), (5, 5), strides=(2, 1), pads=(2, 1, 2, 3), group=6),
    "grouped_t1x2_b6x8_p8_m2": conv(3, 32, 64, (13, 9), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2), group=4),
    "grouped_t2x1_b4x4_p8_m8_l0": conv(2, 32, 64, (9, 11), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=4),
    "simt_gemm_b8x128x16_t1x8_s4_o4": conv(2, 64, 64, (12, 12), (3, 3), pads=(1, 1, 1, 1), group=16),
    "simt_gemm_b16x64x16_t2x4_s4_o4_k4": conv(1, 96, 96, (7, 7), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1), group=2),
    "tc_3xtf32_b32x64x32_w32x16_s3_k2": conv(1, 96, 96, (7, 7), (3, 3), pads=(1, 1, 1, 1), group=3),
}


@pytest.mark.parametrize("config", list(RESIDUAL))
def test_residual_add_and_relu_fuse(config):
    spec = RESIDUAL[config]
    seed, x, w, b, r = draw(spec, residual=True)
    run_and_compare(spec, config, Epilogue("Relu", residual=True), x, w, b, r, f"{config}+add+relu (seed {seed})")


MODELS = {
    "depthwise 5x5 s2 480ch": ((4, 480, 14, 14), {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [2, 2, 2, 2], "group": 480}, "depthwise"),
    "grouped 3x3 256ch g32": ((4, 256, 14, 14), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 32}, "grouped"),
    "grouped 3x3 s2 2048ch g32": ((2, 2048, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "group": 32}, "simt_gemm"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_one_conv_model_on_the_default_pick_matches_onnxruntime(name, tmp_path, monkeypatch):
    from opplugin.core.paths import CACHE_DIR_ENV

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))  # the heuristic's pick, not a tuned one
    x_shape, attributes, family = MODELS[name]
    rng = np.random.default_rng()
    c, group = x_shape[1], attributes["group"]
    w = rng.standard_normal((c, c // group, *attributes["kernel_shape"]), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    model = Model(conv_model(x_shape, w, b, attributes), "grouped")
    runner = Runner(model, x_shape[0], "cuda")
    [kernel] = [k for k in runner.kernels.values() if k.name.startswith("conv.")]
    assert kernel.name.startswith(f"conv.{family}"), kernel.name
    feeds = {"x": rng.standard_normal(x_shape, dtype=np.float32)}
    result = check(runner.run, runner.plan_record(x_shape[0]), feeds)
    assert result.passed, result.records


def test_new_weights_and_weights_written_in_place_are_used():
    """The kernel checks W and B once while the same arrays come back; other arrays, or new values
    written into the same ones, still give their own result."""
    import cupy

    spec = conv(2, 32, 32, (9, 9), (5, 5), pads=(2, 2, 2, 2), group=32)
    kernel = families.build_kernel(spec, "depthwise", None)
    seed, x, w, b, _ = draw(spec)
    rng = np.random.default_rng(seed + 1)
    w2 = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    xd, wd, bd = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
    for weights, expected_w in (((wd, bd), w), ((cupy.asarray(w2), bd), w2)):
        [y] = kernel([xd, *weights], None)
        got = cupy.asnumpy(y)
        expected = reference.expected(spec, NONE, x, expected_w, b, None)
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= MAX_RELATIVE_L2, f"seed {seed}"
    wd[...] = cupy.asarray(w2)  # the first arrays again, with new values
    [y] = kernel([xd, wd, bd], None)
    expected = reference.expected(spec, NONE, x, w2, b, None)
    assert np.linalg.norm(cupy.asnumpy(y) - expected) / np.linalg.norm(expected) <= MAX_RELATIVE_L2, f"seed {seed}"
    wrong = cupy.zeros((32, 1, 3, 3), dtype=cupy.float32)
    with pytest.raises(PluginError, match="weights W have shape"):
        kernel([xd, wrong, bd], None)
