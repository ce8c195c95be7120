"""The float64 acquittal judged over the whole tensor: one element of onnxruntime's decides
nothing, a kernel a little wrong everywhere is convicted, and a correct kernel whose rounding
differs from onnxruntime's is acquitted."""
import numpy as np
from onnx import helper

from opplugin.verify.closeness import NORM_SLACK, judge, norm_slack, why_specials_differ

N = 10_000


def _exact(seed=0):
    return np.random.default_rng(seed).standard_normal((4, N // 4))


def _rounded(exact, sigma, seed):
    """`exact` with independent errors of size `sigma`, as a float32 implementation's rounding."""
    return exact + np.random.default_rng(seed).standard_normal(exact.shape) * sigma


def _judge(ours, theirs, exact, bound=None):
    return judge([ours], [theirs], [exact], bound, atol=1e-7, rtol=1e-7)


def test_a_kernel_a_little_wrong_everywhere_cannot_hide_behind_one_bad_element_of_onnxruntimes():
    e = _exact()
    theirs = _rounded(e, 1e-6, 1)
    theirs[0, 0] += 1e-2  # onnxruntime badly off at a single element
    ours = _rounded(e, 1e-6, 2) + 1e-3  # wrong everywhere, by a tenth of onnxruntime's worst
    loose = np.full(e.shape, 1.0)  # an FP32 bound far too loose to tell
    c = _judge(ours, theirs, e, loose)
    assert c.max_abs["opplugin"] < c.max_abs["onnxruntime"]  # the worst element alone would acquit it
    assert c.elementwise_passes and c.worst_passes and not c.norm_passes and not c.acquits
    assert c.norm_ratio > 5 * c.norm_limit and "rel L2" in c.why()


def test_a_kernel_wrong_at_a_few_elements_is_convicted_element_by_element():
    e = _exact()
    theirs, ours = _rounded(e, 1e-6, 1), _rounded(e, 1e-6, 2)
    ours[1, :3] += 3e-5  # three elements: the norm and the worst element barely notice
    tight = np.full(e.shape, 6e-6)
    c = _judge(ours, theirs, e, tight)
    assert c.beyond == 3 and c.worst_excess > 2 and c.norm_passes and not c.acquits
    assert "at 3 of 10,000 elements" in c.why()


def test_a_correct_kernel_with_other_rounding_is_acquitted_whichever_worst_element_is_larger():
    e = _exact()
    theirs = _rounded(e, 1e-6, 1)
    tight = np.full(e.shape, 8e-6)  # the bound any FP32 implementation meets
    for seed in range(2, 8):
        ours = _rounded(e, 1.1e-6, seed)  # a little rougher than onnxruntime, as another order may be
        c = _judge(ours, theirs, e, tight)
        assert not c.within_tolerance and c.acquits, c.why()
        assert c.norm_ratio < 1.2 < c.norm_limit and c.worst_excess < 0.75
    without_bound = _judge(_rounded(e, 1.1e-6, 9), theirs, e)  # no bound known: onnxruntime's worst error stands for it
    assert without_bound.acquits and not without_bound.bound_known


def test_within_the_tolerance_of_float64_acquits_at_once():
    e = _exact()
    c = judge([e + 1e-9], [e], [e], None, atol=1e-4, rtol=1e-3)  # onnxruntime exact, opplugin within tolerance
    assert c.within_tolerance and c.acquits and c.norm_ratio == float("inf")


def test_the_norm_slack_narrows_with_the_size_of_the_tensor():
    assert norm_slack(16) > norm_slack(10_000) > NORM_SLACK


def test_nan_and_inf_must_sit_where_float64_has_them():
    e = _exact()
    e[0, :5] = np.nan
    e[1, 0] = np.inf
    theirs = e.copy()
    theirs[0, :5] = 0.5  # onnxruntime has numbers where float64 has NaN
    c = _judge(e.copy(), theirs, e)
    assert c.specials_as_exact and not c.onnxruntime_specials_as_exact and c.specials_explained and c.acquits
    assert c.specials_unlike_onnxruntime == 5
    ours = e.copy()
    ours[1, 0] = -np.inf  # the wrong sign of infinity
    wrong = _judge(ours, e.copy(), e)
    assert not wrong.specials_as_exact and not wrong.acquits and "NaN or Inf" in wrong.why()


def test_onnxruntimes_non_finite_elements_excuse_nothing():
    e = _exact()
    theirs = e.copy()
    theirs[0, 0] = np.nan  # onnxruntime off at one element: not a licence to be off there
    ours = e.copy()
    ours[0, 0] += 1.0
    c = _judge(ours, theirs, e, np.full(e.shape, 1e-6))
    assert c.beyond == 1 and not c.acquits


def test_why_nan_and_inf_differ_names_a_padded_conv_with_non_finite_weights():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv3", pads=[1, 1, 1, 1])
    w = np.ones((2, 2, 3, 3), np.float32)
    w[0, 0, 0, 0] = np.nan
    assert "conv3" in why_specials_differ([conv], {"w": w}) and "padding" in why_specials_differ([conv], {"w": w})
    unpadded = helper.make_node("Conv", ["x", "w"], ["y"], name="conv4")
    assert "padding" not in why_specials_differ([unpadded], {"w": w})
    assert "padding" not in why_specials_differ([conv], {"w": np.ones_like(w)})
