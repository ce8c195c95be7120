"""Pools on tensors kept channel-last in 16 bits (ops/pool/channel_last.py, linked_kernel.py, kernels/pool_channel_last.cu).
CPU: the names, the links a pool can keep and why not, and that every kernel compiles for Ampere and Hopper without
spills. GPU: a linked pool fed the format's bits writes, bit for bit, what the plain kernel's FP32 output rounds to (a
max is exact in the format; a window average is the plain kernel's arithmetic on the same values), a global pool
matches float64; NaN and Inf are flagged as stored; a Runner in fp16 or bf16 on stem > MaxPool > block (and a
network's end) matches onnxruntime within the format's rule, also when a chunk meets NaN and reruns exactly."""
from __future__ import annotations

import numpy as np
import pytest
from linked_runs import assert_within_the_formats_rule, runner_and_session
from onnx_builders import save
from precision_cases import conv_head_model, conv_pool_model

from opplugin.core.number_formats import UNIT_ROUNDOFF, half_bits, round_to
from opplugin.errors import InputError, PluginError
from opplugin.gpu.device import Device
from opplugin.lab import nvrtc_check
from opplugin.ops.channel_last import INPUT, OUTPUT, channel_last_shape
from opplugin.ops.pool import reference
from opplugin.ops.pool.channel_last import LinkedPool, linked, linked_config, offered
from opplugin.ops.pool.kernel import kernel_name
from opplugin.ops.pool.spec import AVERAGE, MAX, PoolSpec

GPU, CPU = Device("cuda", "test GPU"), Device("cpu")
FORMATS = ("fp16", "bf16")
WINDOWS = {  # (x shape, spec): channels a multiple of 8, odd sizes, every part of the window
    "resnet stem max 3x3 s2 p1": ((3, 64, 23, 21), PoolSpec(MAX, False, 64, (23, 21), (3, 3), (2, 2), pads=(1, 1, 1, 1))),
    "average 3x3 p1, pads not counted": ((2, 24, 9, 11), PoolSpec(AVERAGE, False, 24, (9, 11), (3, 3), pads=(1, 1, 1, 1))),
    "average 3x2 s2x3, asymmetric pads counted, ceil": (
        (2, 16, 17, 13), PoolSpec(AVERAGE, False, 16, (17, 13), (3, 2), (2, 3), pads=(0, 1, 2, 1), ceil_mode=True, count_include_pad=True)),
    "max 3x3 dilated 2, asymmetric pads": ((2, 8, 19, 21), PoolSpec(MAX, False, 8, (19, 21), (3, 3), (1, 2), (2, 2), pads=(2, 1, 2, 1))),
}
GLOBALS = {
    "global average 7x7, 2048 maps (ResNet-50's head)": ((3, 2048, 7, 7), PoolSpec(AVERAGE, True, 2048, (7, 7), (7, 7))),
    "global average, 96 maps: a tile of 12 groups": ((2, 96, 9, 11), PoolSpec(AVERAGE, True, 96, (9, 11), (9, 11))),
    "global max over a 56x56 plane": ((2, 64, 56, 56), PoolSpec(MAX, True, 64, (56, 56), (56, 56))),
    "ReduceMean over H and W, keepdims 0": ((4, 512, 7, 7), PoolSpec(AVERAGE, True, 512, (7, 7), (7, 7), keep_dims=False)),
}
POOLS = WINDOWS | GLOBALS


def links_of(spec: PoolSpec) -> tuple[int, ...]:
    return (INPUT,) if spec.is_global else (INPUT, OUTPUT, INPUT | OUTPUT)


CASES = [(pool, fmt, links) for pool in POOLS for fmt in FORMATS for links in links_of(POOLS[pool][1])]


def test_a_linked_pools_variant_names_its_format_and_links_in_the_names_grammar():
    spec = WINDOWS["resnet stem max 3x3 s2 p1"][1]
    config = linked(spec, "fp16", frozenset({0}), True)
    assert config == LinkedPool("cuda_fp16", INPUT | OUTPUT) and config.name() == "cuda_fp16_h3" and config.format == "fp16"
    assert linked_config(spec, GPU, "cuda_bf16_h2") == LinkedPool("cuda_bf16", OUTPUT)
    assert linked_config(spec, GPU, "cuda") is None and linked_config(spec, GPU, None) is None  # the plain kernel
    assert kernel_name(spec, True, config.name()) == "maxpool.cuda_fp16_h3.3x3s2p1" and kernel_name(spec, True) == "maxpool.cuda.3x3s2p1"
    with pytest.raises(PluginError, match="names no links: cuda_fp16_h<int>"):
        linked_config(spec, GPU, "cuda_fp16")
    with pytest.raises(PluginError, match="needs a CUDA device"):
        linked_config(spec, CPU, "cuda_fp16_h1")


def test_a_pool_offers_x_in_any_format_and_y_but_for_a_global_pools():
    window, head = WINDOWS["average 3x3 p1, pads not counted"][1], GLOBALS["global average 7x7, 2048 maps (ResNet-50's head)"][1]
    assert (offered(window, GPU).format, offered(window, GPU).inputs, offered(window, GPU).output) == (None, {0}, True)
    assert (offered(head, GPU).inputs, offered(head, GPU).output) == ({0}, False)
    assert offered(window, CPU) is None
    odd = PoolSpec(MAX, False, 12, (8, 8), (2, 2), (2, 2))  # 12 channels: no whole 16-byte pieces
    assert offered(odd, GPU) is None
    with pytest.raises(PluginError, match="8 at a time \\(16 bytes\\); this pool has 12"):
        linked_config(odd, GPU, "cuda_fp16_h1")
    with pytest.raises(PluginError, match="a global pool writes its \\[N, C\\] output in FP32"):
        linked_config(head, GPU, "cuda_fp16_h3")
    with pytest.raises(PluginError, match="links 4"):
        linked_config(window, GPU, "cuda_fp16_h4")


def test_a_linked_variant_is_refused_by_the_cpu_devices_build():
    from opplugin.ops.pool.plugin import MaxPoolPlugin
    from pool_cases import node_info

    node = node_info("MaxPool", (2, 64, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    plugin = MaxPoolPlugin()
    assert plugin.kernel_name(node, GPU, "cuda_bf16_h1") == "maxpool.cuda_bf16_h1.3x3s2p1"
    with pytest.raises(PluginError, match="needs a CUDA device"):
        plugin.build(node, CPU, "cuda_fp16_h3")
    with pytest.raises(PluginError, match="has no variant 'cuda_tf32_h1'"):
        plugin.build(node, CPU, "cuda_tf32_h1")


def test_a_linked_average_that_may_overflow_as_it_stores_is_watched():
    """An FP32 average rounded into FP16 may pass its range: the plain kernel is the step's NaN/Inf-exact rerun."""
    from opplugin.ops.pool.plugin import AveragePoolPlugin
    from opplugin.runtime.exact import reruns_differently
    from pool_cases import node_info
    from opplugin.plan.partition import PluginStep

    node = node_info("AveragePool", (2, 16, 9, 9), {"kernel_shape": [3, 3]})
    step = PluginStep("pool", node, AveragePoolPlugin(), ["x"], ["y"])

    class Kernel:  # what LinkedPoolKernel says of one that reads FP32 and writes FP16 (it needs a GPU to build)
        nonfinite_exact = False

    assert AveragePoolPlugin().nonfinite_exact_variant(node, GPU) == "cuda" and AveragePoolPlugin().nonfinite_exact_variant(node, CPU) is None
    assert reruns_differently(step, Kernel(), GPU) and not reruns_differently(step, Kernel(), CPU)


@pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="cuda-bindings' NVRTC is not importable")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("pool", "fmt", "links"), CASES)
def test_every_linked_pool_compiles_without_spills(pool, fmt, links, arch):
    usage = nvrtc_check.check_pool(POOLS[pool][1], arch, LinkedPool(f"cuda_{fmt}", links))
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 64, usage.log  # eight accumulators and an index
    assert usage.spill_stores == usage.spill_loads == usage.stack_frame == 0, usage.log


# ---- GPU ----


def _build(spec, config):
    from opplugin.ops.pool.linked_kernel import LinkedPoolKernel

    return LinkedPoolKernel(spec, config)


def _fresh(shape, seed, fmt):
    """Values the format holds, none zero: what a linked producer would have stored."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return round_to(x.astype(np.float32), fmt)


def _channel_last_bits(values, fmt):
    import cupy

    return cupy.asarray(np.ascontiguousarray(half_bits(values, fmt).transpose(0, 2, 3, 1)))


def _run_linked(spec, config, x, nonfinite=0):
    """The linked kernel on x (FP32 NCHW, values the format holds), its output poisoned first; Y as FP32 NCHW values
    (from the format's bits where linked), and the bits themselves."""
    import cupy

    fmt = config.format
    kernel = _build(spec, config)
    x_in = _channel_last_bits(x, fmt) if config.links & INPUT else cupy.asarray(x)
    shape = spec.output_shape(x.shape[0])
    if config.links & OUTPUT:
        out = cupy.full(channel_last_shape(shape), 0xFFFF, cupy.uint16)  # NaN in both formats
    else:
        out = cupy.full(shape, np.nan, cupy.float32)
    [y] = kernel([x_in], None, out=out, nonfinite=nonfinite)
    assert y is out
    got = cupy.asnumpy(y)
    if not config.links & OUTPUT:
        return got, None
    values = got.view(np.float16).astype(np.float32) if fmt == "fp16" else (got.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(values.transpose(0, 3, 1, 2)), got


def _plain(spec, x):
    import cupy

    from opplugin.ops.pool.kernel import PoolKernel

    out = cupy.full(spec.output_shape(x.shape[0]), np.nan, cupy.float32)
    [y] = PoolKernel(spec)([cupy.asarray(x)], None, out=out)
    return cupy.asnumpy(y)


@pytest.mark.gpu
@pytest.mark.parametrize(("pool", "fmt", "links"), CASES)
def test_a_linked_pool_writes_the_bits_its_plain_self_rounds_to(pool, fmt, links):
    shape, spec = POOLS[pool]
    seed = int(np.random.default_rng().integers(2**31))
    x = _fresh(shape, seed, fmt)
    plain = _plain(spec, x)
    config = LinkedPool(f"cuda_{fmt}", links)
    got, bits = _run_linked(spec, config, x)
    where = f"{config.name()} {pool} (seed {seed})"
    if bits is not None:  # Y in the format: the plain kernel's FP32 output, rounded, bit for bit
        want = half_bits(plain, fmt).transpose(0, 2, 3, 1)
        assert np.array_equal(bits, want), f"{where}: {int((bits != want).sum())} outputs differ"
    elif not spec.is_global or spec.mode == MAX:  # the same arithmetic on the same values: the same FP32
        assert np.array_equal(got, plain), where
    # a global average sums in another order than the plain kernel: each side within FP32's rule of float64
    exact = reference.expected(spec, x.astype(np.float64))
    if spec.mode == MAX:  # the max of values the format holds is one of them
        assert np.array_equal(got, exact.astype(np.float32)), where
    else:
        rounded = UNIT_ROUNDOFF[fmt] if bits is not None else 0.0
        np.testing.assert_allclose(got, exact, rtol=rounded, atol=spec.window * 2.0**-23 * float(np.abs(x).max()), err_msg=where)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pool", ["resnet stem max 3x3 s2 p1", "global max over a 56x56 plane"])
def test_a_linked_max_pool_keeps_nan_and_flags_what_it_stores(pool, fmt):
    import cupy

    shape, spec = POOLS[pool]
    links = INPUT if spec.is_global else INPUT | OUTPUT
    x = _fresh(shape, 5, fmt)
    flag = cupy.zeros(1, cupy.uint8)
    _run_linked(spec, LinkedPool(f"cuda_{fmt}", links), x, nonfinite=flag.data.ptr)
    assert int(flag.get()[0]) == 0  # finite in, nothing flagged
    x[1, 3, 4, 5], x[0, 7, 10, 11] = np.nan, np.inf
    got, _ = _run_linked(spec, LinkedPool(f"cuda_{fmt}", links), x, nonfinite=flag.data.ptr)
    assert int(flag.get()[0]) == 1
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference.expected(spec, x.astype(np.float64))))


@pytest.mark.gpu
def test_a_linked_pool_refuses_an_fp32_tensor_where_it_expects_the_formats_bits():
    import cupy

    shape, spec = WINDOWS["resnet stem max 3x3 s2 p1"]
    kernel = _build(spec, LinkedPool("cuda_fp16", INPUT))
    with pytest.raises(PluginError, match=r"input X is linked channel-last in 16 bits: expected a uint16 array of shape \(3, 23, 21, 64\)"):
        kernel([cupy.asarray(_fresh(shape, 1, "fp16"))], None)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", FORMATS)
def test_a_runner_keeps_a_max_pool_between_half_convs_channel_last_within_the_formats_rule(precision, tmp_path):
    from opplugin.graph.model import load_model
    from opplugin.ops.conv import families
    from opplugin.runtime import Runner

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    model = load_model(save(conv_pool_model(), tmp_path / "conv_pool.onnx"))
    runner, session = runner_and_session(model, precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["pool"].implementation == f"maxpool.cuda_{precision}_h3.3x3s2p1" and steps["pool"].channel_last == ("r0", "p")
    assert steps["stem"].implementation.endswith("_h2+relu") and steps["conv1x1"].implementation.endswith("_h5+add")
    x = np.random.default_rng().standard_normal((16, 3, 16, 16)).astype(np.float32)
    got = runner.run({"x": x}).outputs["y"]
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(got, expected, precision)
    eager = Runner(model, 16, "cuda", precision=precision, cuda_graphs=False)
    assert np.array_equal(eager.run({"x": x}).outputs["y"], got)
    with pytest.raises(InputError, match=f"cannot keep p: it goes between steps channel-last in {precision}"):
        runner.run({"x": x}, keep=("p",))
    # a chunk that meets NaN: the linked pool flags it as it stores, and the chunk runs again on the exact path, where
    # nothing is linked and the max pool is onnxruntime's
    x[3, 1, 4, 5] = np.nan
    [with_nan] = session.run(None, {"x": x})
    for run in (runner, eager):
        result = run.run({"x": x})
        again = result.outputs["y"]
        assert result.exact_reruns == 1
        assert np.array_equal(np.isnan(again), np.isnan(with_nan)) and np.isnan(again).any()
        clean = ~np.isnan(with_nan).reshape(16, -1).any(axis=1)  # the rerun chunk's other images come out in FP32
        assert_within_the_formats_rule(again[clean], with_nan[clean], precision, rounded=False)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", FORMATS)
@pytest.mark.parametrize("head", ["GlobalAveragePool", "ReduceMean_flat"])
def test_a_runner_reads_the_last_block_channel_last_into_the_head_within_the_formats_rule(head, precision, tmp_path):
    from opplugin.graph.model import load_model
    from opplugin.ops.conv import families

    if not families.FAMILIES["wg_fp16"].runs_here():
        pytest.skip("wg_fp16 and wg_bf16 need an sm_90 GPU (wgmma)")
    model = load_model(save(conv_head_model(head), tmp_path / "conv_head.onnx"))
    runner, session = runner_and_session(model, precision)
    steps = {s.name: s for s in runner.plan_record().steps}
    assert steps["head"].implementation.startswith(f"globalaveragepool.cuda_{precision}_h1.") and steps["head"].channel_last == ("r1",)
    x = np.random.default_rng().standard_normal((16, 3, 12, 12)).astype(np.float32)
    [expected] = session.run(None, {"x": x})
    assert_within_the_formats_rule(runner.run({"x": x}).outputs["y"], expected, precision)
