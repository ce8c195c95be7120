"""The numpy reference Conv against onnxruntime on configurations drawn by hypothesis."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_builders import single_conv
from opplugin.ops.conv import ConvSpec
from opplugin.ops.reference import conv
from opplugin.errors import PluginError


@st.composite
def conv_configs(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    c = group * draw(st.integers(1, 3))
    m = group * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[2]), 14))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[1] - pads[3]), 14))
    batch = draw(st.integers(1, 3))
    bias = draw(st.booleans())
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    attributes = {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw], "group": group}
    if auto_pad == "NOTSET":
        attributes["pads"] = pads
    else:
        attributes["auto_pad"] = auto_pad
        if auto_pad == "VALID" and (h < dh * (kh - 1) + 1 or w < dw * (kw - 1) + 1):
            attributes["auto_pad"] = "SAME_UPPER"
        if attributes["auto_pad"] != "VALID":
            attributes["dilations"] = [1, 1]  # onnxruntime refuses dilation with SAME_*
    return (batch, c, h, w), (m, c // group, kh, kw), attributes, bias


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_configs(), st.integers(0, 2**31 - 1))
def test_reference_matches_onnxruntime(config, seed):
    x_shape, w_shape, attributes, bias = config
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    model = single_conv(x_shape, w_shape, attributes, bias, weights_as_input=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"x": x, "w": w} | ({"b": b} if bias else {})
    (expected,) = session.run(None, feeds)

    spec = ConvSpec.from_shapes(x_shape, w_shape, attributes, has_bias=bias)
    assert spec.output_shape() == expected.shape
    got = conv(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
               spec.strides, spec.pads, spec.dilations, spec.group)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


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
