"""LayerNormalization over NCHW's channels on tensors kept channel-last in 16 bits (ops/reduction/channel_last.py,
linked_kernel.py, kernels/norm_channel_last.cu). CPU: the names, what it links and why not, how many threads take a
pixel, and that a linked Y is watched for NaN/Inf (tests/ops/test_kernel_compile.py compiles the kernel). GPU: the
linked kernel fed the format's bits against float64 within the format's bound, NaN/Inf flagged as stored, and a
Runner in fp16 or bf16 on ConvNeXt's start against onnxruntime, also when a chunk meets NaN and reruns exactly."""
from __future__ import annotations

import numpy as np
import pytest
from channel_last_models import convnext_stage
from linked_runs import assert_within_the_formats_rule, runner_and_session
from onnx_builders import save

from opplugin.core.number_formats import UNIT_ROUNDOFF, half_bits, round_to
from opplugin.errors import PluginError
from opplugin.gpu.device import Device
from opplugin.graph.model import load_model
from opplugin.ops.channel_last import INPUT, OUTPUT, channel_last_shape
from opplugin.ops.reduction.channel_last import MAX_CHANNELS, LinkedNorm, linked, linked_config, offered
from opplugin.ops.reduction.kernel import expected
from opplugin.ops.reduction.linked_kernel import pieces_a_thread, pixel_lanes
from opplugin.ops.reduction.rows import Rows
from opplugin.ops.reduction.spec import GROUP, LAYER, NormSpec
from opplugin.plan.partition import make_plan

GPU, CPU = Device("cuda", "test GPU"), Device("cpu")
FORMATS = ("fp16", "bf16")
EPSILON = 1e-6


def over_channels(shape) -> NormSpec:
    """The spec the graph passes make of ConvNeXt's LayerNorm: over axis 1 of an N x C x H x W tensor."""
    n, c, h, w = shape
    return NormSpec(LAYER, tuple(shape), Rows(1, c, h * w), EPSILON, 1, 1, c, 1)


SHAPES = {  # x: pixels that are no multiple of a block's, every lane count
    "ConvNeXt's first stage, 96 channels: 4 lanes a pixel": (2, 96, 14, 13),
    "ConvNeXt's last stage, 768 channels: 32 lanes a pixel": (3, 768, 7, 7),
    "40 channels: 2 lanes, one a piece fewer": (2, 40, 9, 11),
    "8 channels: one lane a pixel": (5, 8, 3, 7),
    f"{MAX_CHANNELS} channels: 32 lanes of 8 pieces": (1, MAX_CHANNELS, 3, 3),
}
LINKS = (INPUT, OUTPUT, INPUT | OUTPUT)
CASES = [(shape, fmt, links) for shape in SHAPES for fmt in FORMATS for links in LINKS]


def test_a_linked_layernorms_variant_names_its_format_and_links_in_the_names_grammar():
    spec = over_channels((1, 96, 56, 56))
    config = linked(spec, "fp16", frozenset({0}), True)
    assert config == LinkedNorm("cuda_fp16", INPUT | OUTPUT) and config.name() == "cuda_fp16_h3" and config.format == "fp16"
    assert linked_config(spec, GPU, "cuda_bf16_h2") == LinkedNorm("cuda_bf16", OUTPUT)
    assert linked_config(spec, GPU, "cuda") is None and linked_config(spec, GPU, None) is None  # the plain kernel
    with pytest.raises(PluginError, match="names no links: cuda_fp16_h<int>"):
        linked_config(spec, GPU, "cuda_fp16")
    with pytest.raises(PluginError, match="needs a CUDA device"):
        linked_config(spec, CPU, "cuda_fp16_h1")
    with pytest.raises(PluginError, match="links 4"):
        linked_config(spec, GPU, "cuda_fp16_h4")


def test_only_a_layernorm_over_the_channel_axis_of_a_multiple_of_8_channels_is_offered():
    assert (offered(over_channels((1, 96, 7, 7)), GPU).format, offered(over_channels((1, 96, 7, 7)), GPU).output) == (None, True)
    assert offered(over_channels((1, 96, 7, 7)), CPU) is None
    nhwc = NormSpec(LAYER, (1, 7, 7, 96), Rows(49, 96, 1), EPSILON, 1, 1, 96, 3)  # over the last axis: the plain kernel's
    group = NormSpec(GROUP, (1, 96, 7, 7), Rows(8, 12 * 49, 1), EPSILON, 8, 49, 96)
    over_chw = NormSpec(LAYER, (1, 96, 7, 7), Rows(1, 96 * 49, 1), EPSILON, 1, 1, 96 * 49, 1)  # ONNX's axis 1: C, H and W
    for spec in (nhwc, group, over_chw):
        assert offered(spec, GPU) is None
        with pytest.raises(PluginError, match="over the channel axis of an N x C x H x W tensor alone"):
            linked_config(spec, GPU, "cuda_fp16_h3")
    with pytest.raises(PluginError, match="8 at a time \\(16 bytes\\); this LayerNormalization has 12"):
        linked_config(over_channels((1, 12, 7, 7)), GPU, "cuda_fp16_h1")
    with pytest.raises(PluginError, match=f"at most {MAX_CHANNELS}, this LayerNormalization has {2 * MAX_CHANNELS}"):
        linked_config(over_channels((1, 2 * MAX_CHANNELS, 7, 7)), GPU, "cuda_fp16_h1")


def test_a_pixel_takes_as_many_threads_as_share_its_pieces_evenly_up_to_a_warp():
    lanes = {c: (pixel_lanes(c), pieces_a_thread(c)) for c in (96, 192, 384, 768, 40, 24, 8, 64, MAX_CHANNELS)}
    assert lanes == {96: (4, 3), 192: (8, 3), 384: (16, 3), 768: (32, 3), 40: (2, 3), 24: (1, 3), 8: (1, 1), 64: (8, 1),
                     MAX_CHANNELS: (32, 8)}


@pytest.fixture(scope="module")
def stage_step(tmp_path_factory):
    """The block's LayerNormalization step of convnext_stage on a GPU plan (its node over axis 1 of NCHW)."""
    path = save(convnext_stage(), tmp_path_factory.mktemp("stage") / "stage.onnx")
    return next(s for s in make_plan(load_model(path), 8, GPU).plugin_steps if s.name == "layernormalization_ln")


def test_a_linked_layernorm_that_may_overflow_as_it_stores_is_watched(stage_step):
    """An FP32 result rounded into FP16 may pass its range: the plain kernel is the step's NaN/Inf-exact rerun; the
    plain kernel keeps NaN and Inf as onnxruntime does, so an unlinked step is not watched."""
    from opplugin.runtime.exact import reruns_differently

    plugin, node = stage_step.plugin, stage_step.node

    class Kernel:  # what LinkedNormKernel says of one that writes Y in the format (it needs a GPU to build)
        nonfinite_exact = False

    class Plain:  # what RowKernel says of a normalisation
        nonfinite_exact = True

    assert plugin.nonfinite_exact_variant(node, GPU) == "cuda" and plugin.nonfinite_exact_variant(node, CPU) is None
    assert reruns_differently(stage_step, Kernel(), GPU) and not reruns_differently(stage_step, Plain(), GPU)


def test_a_linked_variant_is_refused_by_the_cpu_devices_build(stage_step):
    plugin, node = stage_step.plugin, stage_step.node
    assert plugin.kernel_name(node, GPU, "cuda_bf16_h1") == "layernorm.cuda_bf16_h1.4lanes"
    with pytest.raises(PluginError, match="needs a CUDA device"):
        plugin.build(node, CPU, "cuda_fp16_h3")
    with pytest.raises(PluginError, match="has no variant 'cuda_tf32_h1'"):
        plugin.build(node, CPU, "cuda_tf32_h1")
    assert plugin.compile_jobs(node, CPU, None) == []


# ---- GPU ----


def _affine(channels: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 1.5, channels) * rng.choice([-1.0, 1.0], channels)
    return scale.astype(np.float32), rng.uniform(-0.5, 0.5, channels).astype(np.float32)


def _fresh(shape, seed: int, fmt: str, linked_x: bool) -> np.ndarray:
    """None zero; values the format holds where X is linked (what a linked producer would have stored)."""
    rng = np.random.default_rng(seed)
    x = (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape) + rng.uniform(-1.0, 1.0, shape[:2] + (1, 1))).astype(np.float32)
    return round_to(x, fmt) if linked_x else x


def _run_linked(spec, config, x, scale, bias, nonfinite=0):
    """The linked kernel on x (FP32 NCHW), its output poisoned first; Y as FP32 NCHW values (from the format's bits
    where linked)."""
    import cupy

    from opplugin.ops.reduction.linked_kernel import LinkedNormKernel

    fmt = config.format
    kernel = LinkedNormKernel(spec, config, scale, bias)
    x_in = cupy.asarray(np.ascontiguousarray(half_bits(x, fmt).transpose(0, 2, 3, 1))) if config.links & INPUT else cupy.asarray(x)
    if config.links & OUTPUT:
        out = cupy.full(channel_last_shape(x.shape), 0xFFFF, cupy.uint16)  # NaN in both formats
    else:
        out = cupy.full(x.shape, np.nan, cupy.float32)
    [y] = kernel([x_in], None, out=out, nonfinite=nonfinite)
    assert y is out
    got = cupy.asnumpy(y)
    if not config.links & OUTPUT:
        return got
    values = got.view(np.float16).astype(np.float32) if fmt == "fp16" else (got.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(values.transpose(0, 3, 1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "fmt", "links"), CASES)
def test_a_linked_layernorm_matches_float64_within_the_formats_bound(shape, fmt, links):
    x_shape, spec = SHAPES[shape], over_channels(SHAPES[shape])
    seed = int(np.random.default_rng().integers(2**31))
    x, (scale, bias) = _fresh(x_shape, seed, fmt, bool(links & INPUT)), _affine(x_shape[1], seed)
    config = LinkedNorm(f"cuda_{fmt}", links)
    got = _run_linked(spec, config, x, scale, bias)
    exact = expected(spec, x, scale, bias)
    # FP32 sums over C channels, then (where Y is linked) one rounding to the format
    fp32 = x_shape[1] * 2.0**-23 * float(np.abs(exact).max())
    rounded = UNIT_ROUNDOFF[fmt] if links & OUTPUT else 0.0
    where = f"{config.name()} {shape} (seed {seed})"
    assert not np.isnan(got).any(), f"{where}: an output left unwritten"
    np.testing.assert_allclose(got, exact, rtol=rounded, atol=fp32 * (1 + rounded), err_msg=where)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_linked_layernorm_flags_nan_and_inf_as_it_stores_them(fmt):
    import cupy

    x_shape = SHAPES["ConvNeXt's first stage, 96 channels: 4 lanes a pixel"]
    spec, config = over_channels(x_shape), LinkedNorm(f"cuda_{fmt}", INPUT | OUTPUT)
    x, (scale, bias) = _fresh(x_shape, 7, fmt, True), _affine(x_shape[1], 7)
    flag = cupy.zeros(1, cupy.uint8)
    _run_linked(spec, config, x, scale, bias, nonfinite=flag.data.ptr)
    assert int(flag.get()[0]) == 0  # finite in, nothing flagged
    large = scale.copy()
    large[5] = 1e5  # |x̂| > 0.66 passes FP16's range, never BF16's
    got = _run_linked(spec, config, x, large, bias, nonfinite=flag.data.ptr)
    assert int(flag.get()[0]) == (fmt == "fp16") and np.isinf(got).any() == (fmt == "fp16")
    flag[:] = 0
    x[1, 3, 4, 5] = np.nan  # its pixel's every output is NaN, as float64's, and nothing else
    got = _run_linked(spec, config, x, scale, bias, nonfinite=flag.data.ptr)
    assert int(flag.get()[0]) == 1
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected(spec, x, scale, bias)))
    assert np.isnan(got[1, :, 4, 5]).all() and np.isnan(got).sum() == x_shape[1]


@pytest.mark.gpu
def test_a_linked_layernorm_refuses_an_fp32_tensor_where_it_expects_the_formats_bits():
    import cupy

    from opplugin.ops.reduction.linked_kernel import LinkedNormKernel

    x_shape = SHAPES["8 channels: one lane a pixel"]
    kernel = LinkedNormKernel(over_channels(x_shape), LinkedNorm("cuda_fp16", INPUT), *_affine(x_shape[1], 1))
    with pytest.raises(PluginError, match=r"input X is linked channel-last in 16 bits: expected a uint16 array of shape \(5, 3, 7, 8\)"):
        kernel([cupy.asarray(_fresh(x_shape, 1, "fp16", False))], None)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", FORMATS)
def test_a_runner_keeps_convnexts_layernorms_between_half_convs_channel_last_within_the_formats_rule(precision, tmp_path):
    from opplugin.ops.conv import families
    from opplugin.runtime import Runner

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    model = load_model(save(convnext_stage(), tmp_path / "convnext_stage.onnx"))
    runner, session = runner_and_session(model, precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    block = steps["layernormalization_ln"]
    assert (block.implementation, block.precision, block.channel_last) == (f"layernorm.cuda_{precision}_h3.4lanes", precision,
                                                                          ("dw", "ln_nchw"))
    assert steps["layernormalization_stem_ln"].channel_last == ("stem", "stem_out")
    x = np.random.default_rng().standard_normal((16, 3, 32, 32)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    [expected_y] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected_y, precision)
    eager = Runner(model, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
    # a chunk that meets NaN: the linked LayerNorms flag it as they store, and the chunk runs again on the exact path,
    # where nothing is linked
    x[3, 1, 4, 5] = np.nan
    [with_nan] = session.run(None, {"x": x})
    for run in (runner, eager):
        result = run.run({"x": x})
        again = result.outputs["y"]
        assert result.exact_reruns == 1
        assert np.array_equal(np.isnan(again), np.isnan(with_nan)) and np.isnan(again).any()
        clean = ~np.isnan(with_nan).reshape(16, -1).any(axis=1)  # the rerun chunk's other images come out in FP32
        assert_within_the_formats_rule(again[clean], with_nan[clean], precision, rounded=False)
