"""On the GPU: every configuration simt_gemm offers for the layers of `opplugin bench --suite cnn`
(group 1), at batch 1 and 2, against the float64 reference, with fresh random inputs and the
output poisoned with NaN first; and its fused residual epilogue with and without split K.
The hypothesis-style shapes, fused activations and NaN/Inf cases reach the family through
ops/conv/test_families_gpu.py and ops/conv/test_epilogue_gpu.py, which run every registered exact family."""
from __future__ import annotations

import pytest
from family_gpu_checks import draw, run_and_compare
from onnx_builders import conv_spec as conv

from opplugin.lab import cnn_layers
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import NONE, Epilogue

pytestmark = pytest.mark.gpu

FAMILY = families.FAMILIES["simt_gemm"]
LAYERS = {layer.name: layer for layer in cnn_layers.LAYERS if layer.group == 1}
CASES = [(name, batch, config) for name in LAYERS for batch in (1, 2) for config in FAMILY.configs(LAYERS[name].spec(batch))]


@pytest.mark.parametrize(("layer", "batch", "config"), CASES, ids=[f"{n}-b{b}-{c}" for n, b, c in CASES])
def test_every_configuration_matches_float64_on_the_cnn_layers(layer, batch, config):
    spec = LAYERS[layer].spec(batch)
    assert families.unsupported_reason(spec, config, None) is None
    seed, x, w, b, _ = draw(spec)
    run_and_compare(spec, config, NONE, x, w, b, None, f"{config} on {layer} batch {batch} (seed {seed})")


RESIDUAL = {
    # unsplit with float4 stores, split K with scalar stores (49 pixels), tails in maps and pixels
    "simt_gemm_b64x128x16_t8x8_s4_o3": conv(2, 64, 64, (28, 28), (3, 3), pads=(1, 1, 1, 1)),
    "simt_gemm_b128x128x16_t8x8_s4_o1_k8": conv(1, 512, 512, (7, 7), (3, 3), pads=(1, 1, 1, 1)),
    "simt_gemm_b32x64x16_t4x4_s4_o4_k2": conv(3, 37, 70, (9, 11), (3, 3), pads=(1, 1, 1, 1)),
}


@pytest.mark.parametrize("config", list(RESIDUAL))
def test_residual_add_and_relu_fuse_with_and_without_split_k(config):
    spec = RESIDUAL[config]
    seed, x, w, b, r = draw(spec, residual=True)
    run_and_compare(spec, config, Epilogue("Relu", residual=True), x, w, b, r, f"{config}+add+relu (seed {seed})")
