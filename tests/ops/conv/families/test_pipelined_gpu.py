"""On the GPU: the pipelined implicit GEMMs on a K past the 8192-row __constant__ tap table, where
the table holds one channel's window and the kernel adds each k's channel offset (TAPS_BY_CHANNEL),
against the float64 reference with fresh random inputs and the output poisoned with NaN first:
each family's pick (split K) and its tile unsplit, a fused residual and activation, a prologue scale."""
from __future__ import annotations

import numpy as np
import pytest
from family_gpu_checks import draw, run_and_compare
from onnx_builders import conv_spec as conv

from opplugin.ops.conv import families
from opplugin.ops.activation import Activation
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined
from opplugin.ops.conv.prologue import AFFINE, SCALE, Prologue

pytestmark = pytest.mark.gpu

GEMMS = ("tc_3xtf32", *(("wg_3xtf32",) if families.FAMILIES["wg_3xtf32"].runs_here() else ()), "simt_gemm")  # wgmma: Hopper alone
SPECS = {
    "3x3x960": conv(2, 960, 96, (7, 7), (3, 3), pads=(1, 1, 1, 1)),  # selecsls42b's head, fewer maps
    "grouped_3x3x1024": conv(1, 2048, 64, (5, 6), (3, 3), group=2),  # a group's K = 9216
    "7x7x168_stride2": conv(2, 168, 40, (20, 20), (7, 7), pads=(3, 3, 3, 3), strides=(2, 2)),
}
CASES = [
    (name, config)
    for name, spec in SPECS.items()
    for family in GEMMS
    if families.unsupported_reason(spec, family, (np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32))) is None  # wg: 32 channels a group
    for config in dict.fromkeys([families.configure(spec, family), pipelined.with_split(families.configure(spec, family), 1)])
]


@pytest.mark.parametrize(("layer", "config"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_a_long_k_matches_float64(layer, config):
    spec = SPECS[layer]
    seed, x, w, b, _ = draw(spec)
    assert pipelined.taps_by_channel(spec) and families.unsupported_reason(spec, config, (w, b)) is None
    run_and_compare(spec, config, NONE, x, w, b, None, f"{config} on {layer} (seed {seed})")


@pytest.mark.parametrize("family", GEMMS)
@pytest.mark.parametrize("kind", ["scale", "bn_relu"])
def test_a_long_k_fuses_its_residual_and_prologue(family, kind):
    spec = SPECS["3x3x960"]
    seed, x, w, b, r = draw(spec, residual=True)
    rng = np.random.default_rng(seed)
    channels = spec.in_channels
    if kind == "scale":
        prologue, scale = Prologue(SCALE), rng.uniform(-2.0, 2.0, (spec.batch, channels, 1, 1)).astype(np.float32)
    else:  # positive shifts: a padded tap the prologue wrongly touched would show
        a, shift = rng.uniform(0.5, 2.0, channels), rng.uniform(0.1, 1.0, channels)
        prologue, scale = Prologue(AFFINE, tuple(map(float, a)), tuple(map(float, shift)), Activation.plain("Relu")), None
    epilogue = Epilogue("Relu", residual=True, prologue=prologue)
    config = families.configure(spec, family)
    assert families.unsupported_reason(spec, config, (w, b), epilogue) is None
    run_and_compare(spec, config, epilogue, x, w, b, r, f"{config} {kind} + add + relu (seed {seed})", scale=scale)
