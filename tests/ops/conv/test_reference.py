"""The numpy reference Conv against onnxruntime on configurations drawn by hypothesis."""
import functools

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conv_strategies import ConvConfig, assert_within_bound, conv_configs, error_bound
from onnx_builders import single_conv
from opplugin.ops.conv.spec import ConvSpec
from opplugin.ops.conv.reference import conv
from opplugin.errors import PluginError


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs(auto_pad=True), st.integers(0, 2**31 - 1))
def test_reference_matches_onnxruntime(config: ConvConfig, seed):
    x, w, b = config.random_arrays(np.random.default_rng(seed))
    model = single_conv(config.x_shape, config.w_shape, config.attributes, config.bias, weights_as_input=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x, "w": w} | ({"b": b} if config.bias else {})
    (expected,) = session.run(None, feeds)

    spec = config.spec
    assert spec.output_shape() == expected.shape
    got = conv(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
               spec.strides, spec.pads, spec.dilations, spec.group)
    # the float64 oracle is (almost) exact: onnxruntime's FP32 rounding is all the bound has to cover
    assert_within_bound(got, expected.astype(np.float64), error_bound(spec, x, w, b), f"{config}")


def test_one_dimensional_and_three_dimensional_convolutions():
    rng = np.random.default_rng(3)
    for x_shape, w_shape, attributes in [
        ((2, 3, 17), (4, 3, 3), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
        ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [0, 1, 1, 1, 0, 0]}),
    ]:
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        model = single_conv(x_shape, w_shape, attributes, bias=False, weights_as_input=True)
        (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "w": w})
        spec = ConvSpec.from_shapes(x_shape, w_shape, attributes, has_bias=False)
        np.testing.assert_allclose(conv(x, w, None, spec.strides, spec.pads, spec.dilations), expected, rtol=1e-4, atol=1e-4)


def test_spec_counts_flops_and_bytes():
    spec = ConvSpec.from_shapes((10, 1, 86, 86), (4, 1, 7, 7), {}, has_bias=True)
    assert spec.out_size == (80, 80)
    outputs = 10 * 4 * 80 * 80
    assert spec.flops() == outputs * 2 * 49 + outputs
    assert spec.bytes_moved() == 4 * (10 * 86 * 86 + outputs + 4 * 49 + 4)


def test_spec_rejects_inconsistent_shapes():
    with pytest.raises(PluginError, match="do not fit"):
        ConvSpec.from_shapes((1, 3, 8, 8), (4, 2, 3, 3), {}, has_bias=False)
    with pytest.raises(PluginError, match="empty"):
        ConvSpec.from_shapes((1, 1, 2, 2), (1, 1, 5, 5), {}, has_bias=False)


def test_an_image_gives_the_same_bits_whatever_batch_it_comes_in():
    # the CPU backend runs a batch in chunks; BLAS rounds by matrix size, so the
    # reference must not let the batch size reach an image's product
    rng = np.random.default_rng(5)
    x = rng.standard_normal((23, 4, 40, 40), dtype=np.float32)
    w = rng.standard_normal((16, 4, 7, 7), dtype=np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    whole = conv(x, w, b)
    for start, stop in [(0, 1), (0, 7), (7, 14), (14, 23)]:
        np.testing.assert_array_equal(conv(x[start:stop], w, b), whole[start:stop])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_epilogue_pools_before_a_nondecreasing_activation_with_the_same_values(dtype):
    """Epilogue.apply pools the raw sums first where the kernels may (pool_first): a nondecreasing
    activation commutes with max, so the values, NaN and infinities included, are ONNX's order's exactly."""
    from opplugin.ops.activation import KINDS, Activation
    from opplugin.ops.conv.epilogue import Epilogue

    rng = np.random.default_rng(11)
    y = (rng.standard_normal((3, 4, 9, 10)) * 5).astype(dtype)
    y[0, 0, 0, 0] = y[2, 3, 5, 5] = np.nan
    y[1, 1, 2, 3] = y[2, 3, 5, 4] = np.inf
    y[2, 2, 4, 4] = -np.inf
    taken = 0
    for op in KINDS:
        activation = Activation(op, *KINDS[op].defaults)
        for pool in [(2, 2), (3, 3), (4, 4)]:
            epilogue = Epilogue(activation=activation, pool=pool)
            if not epilogue.pool_first:
                continue
            activated, (kh, kw) = activation.apply(y, np), pool
            windows = [activated[:, :, i : y.shape[2] // kh * kh : kh, j : y.shape[3] // kw * kw : kw]
                       for i in range(kh) for j in range(kw)]
            onnx_order = functools.reduce(np.maximum, windows)
            got = epilogue.apply(y)
            assert got.dtype == onnx_order.dtype and np.array_equal(got, onnx_order, equal_nan=True), (op, pool)
            taken += 1
    assert taken >= 15  # Relu, LeakyRelu, Sigmoid, Tanh, Clip, HardSigmoid at three pools
