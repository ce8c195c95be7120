"""On the GPU: the Conv prologue (ops/conv/prologue.py) in the implicit-GEMM families (tc_3xtf32,
wg_3xtf32 on Hopper, simt_gemm), both kinds, against the float64 reference with fresh random inputs and the output
poisoned with NaN first: 1x1 layers with float4 and scalar B copies, a padded 3x3 (padding stays
zero), split K, groups, X read in place as a channel slice of a larger buffer; then plans whose
pointwise steps fuse, run against onnxruntime CPU."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from family_gpu_checks import draw, run_and_compare
from onnx_builders import conv_spec as conv
from onnx_builders import save
from prologue_models import bn_model, dense_model, feeds, se_model

from opplugin.graph.model import load_model
from opplugin.ops.activation import Activation
from opplugin.ops.conv import families
from opplugin.ops.conv.epilogue import Epilogue
from opplugin.ops.conv.prologue import AFFINE, SCALE, Prologue
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu

FAMILIES = ("tc_3xtf32", *(("wg_3xtf32",) if families.FAMILIES["wg_3xtf32"].runs_here() else ()), "simt_gemm")
SHAPES = {
    "1x1-float4": conv(2, 64, 48, (14, 14), (1, 1)),
    "1x1-scalar": conv(3, 40, 24, (7, 7), (1, 1)),
    "3x3-padded": conv(2, 24, 32, (9, 11), (3, 3), pads=(1, 1, 1, 1)),
    "3x3-stride2": conv(2, 16, 32, (10, 10), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    "3x3-stride2-c32": conv(2, 32, 40, (11, 10), (3, 3), strides=(2, 2), pads=(1, 0, 1, 1)),  # wg_3xtf32 takes 32 channels a group
    "grouped": conv(2, 32, 32, (8, 8), (3, 3), pads=(1, 1, 1, 1), group=2),
    "1x1-split-k": conv(1, 512, 64, (7, 7), (1, 1)),
}
KINDS = ("scale", "bn_relu", "bn_hardswish", "bn")


def prologue_of(kind: str, channels: int, rng) -> Prologue:
    if kind == "scale":
        return Prologue(SCALE)
    a = tuple(float(v) for v in rng.uniform(0.5, 2.0, channels) * rng.choice([-1, 1], channels))
    b = tuple(float(v) for v in rng.uniform(0.1, 1.0, channels))  # positive: an activated pad would show
    activation = {"bn_relu": Activation.plain("Relu"), "bn_hardswish": Activation.plain("HardSwish"), "bn": None}[kind]
    return Prologue(AFFINE, a, b, activation)


def configs(family: str, spec):
    """The family's pick and, where K allows, its first split-K configuration."""
    offered = families.FAMILIES[family].configs(spec)
    split = [c for c in offered if c.splits > 1]
    return list(dict.fromkeys([offered[0], *split[:1]]))


def takes(family: str, spec) -> bool:
    """wg_3xtf32 reads groups of 32 channels alone; the other two take every shape here."""
    weights = np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)
    return families.unsupported_reason(spec, family, weights) is None


CASES = [(family, shape, kind) for family in FAMILIES for shape in SHAPES if takes(family, SHAPES[shape]) for kind in KINDS]


@pytest.mark.parametrize(("family", "shape", "kind"), CASES, ids=["-".join(c) for c in CASES])
def test_the_prologue_matches_float64(family, shape, kind):
    spec = SHAPES[shape]
    seed, x, w, b, r = draw(spec, residual=shape == "1x1-float4")
    rng = np.random.default_rng(seed)
    prologue = prologue_of(kind, spec.in_channels, rng)
    scale = rng.uniform(-2.0, 2.0, (spec.batch, spec.in_channels, 1, 1)).astype(np.float32) if kind == "scale" else None
    epilogue = Epilogue("Relu", residual=r is not None, prologue=prologue)
    for config in configs(family, spec):
        assert families.unsupported_reason(spec, config, (w, b), epilogue) is None
        run_and_compare(spec, config, epilogue, x, w, b, r, f"{config} {kind} on {shape} (seed {seed})", scale=scale)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("start", [0, 8])
def test_x_read_in_place_as_a_channel_slice_of_a_larger_buffer(family, start):
    import cupy

    spec = conv(3, 64, 32, (14, 14), (1, 1))
    seed, x, w, b, _ = draw(spec)
    rng = np.random.default_rng(seed)
    buffer = cupy.asarray(rng.standard_normal((3, 96, 14, 14), dtype=np.float32))
    buffer[:, start:start + 64] = cupy.asarray(x)
    view = buffer[:, start:start + 64]
    epilogue = Epilogue(prologue=prologue_of("bn_relu", 64, rng))
    config = families.configure(spec, family, epilogue)
    kernel = families.build_kernel(spec, config, (w, b), epilogue)
    assert kernel.in_views and kernel._input_array(cupy, view) is view  # no copy: the kernel is told the image stride
    run_and_compare(spec, config, epilogue, x, w, b, None, f"{config} on a view at channel {start} (seed {seed})", x_on_device=view)


def test_a_plain_conv_reads_a_view_in_place_too():
    import cupy

    spec = conv(2, 64, 64, (14, 14), (1, 1))
    seed, x, w, b, _ = draw(spec)
    buffer = cupy.zeros((2, 128, 14, 14), dtype=cupy.float32)
    buffer[:, 64:] = cupy.asarray(x)
    run_and_compare(spec, families.configure(spec, "tc_3xtf32"), Epilogue(), x, w, b, None, f"view (seed {seed})",
                    x_on_device=buffer[:, 64:])


# --- plans on the GPU against onnxruntime CPU ----------------------------------------------------------


def onnxruntime_output(model, inputs) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], inputs)[0]


MODELS = {
    "se-1x1": lambda: se_model(channels=128, maps=64, size=28),
    "se-residual": lambda: se_model(channels=128, maps=128, size=28, residual=True),
    "bn-relu-1x1": lambda: bn_model(Activation.plain("Relu"), channels=128, maps=64, size=28),
    "bn-relu-3x3": lambda: bn_model(Activation.plain("Relu"), channels=64, maps=64, size=28, kernel=3),
    "dense": lambda: dense_model(),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_fused_plans_match_onnxruntime(name, tmp_path):
    model = MODELS[name]()
    runner = Runner(load_model(save(model, tmp_path / "model.onnx")), 8, "cuda")
    fused = [s for s in runner.plan.plugin_steps if s.prologue]
    assert fused, [s.ops for s in runner.plan.steps]
    assert all(runner.kernels[s.name].name.split("*")[0] in ("conv.scale", "conv.bn_relu") for s in fused)
    inputs = feeds(model, 8, seed=len(name))
    np.testing.assert_allclose(runner.run(inputs).outputs["y"], onnxruntime_output(model, inputs), rtol=1e-4, atol=1e-4)
