"""Whether opplugin's output of a step is no further from the float64 result than
onnxruntime's, judged over the whole tensor: first_bad.py's acquittal.

One worst element decides nothing: in an ill-conditioned step onnxruntime's largest error
sits at one element by chance, so comparing the two worst elements flips between CPUs, and a
kernel a little wrong everywhere could hide behind one bad element of onnxruntime's.
With o opplugin's output, t onnxruntime's and e the float64 result, opplugin is acquitted when
its NaN and Inf sit exactly where e has them, and either it is within the check's tolerance
of e, or all three of these hold:

- element by element, |o - e| <= |t - e| + b: no further than onnxruntime, give or take b, the
  FP32 allowance of the element: the FP32 error bound of the step's op where one is known
  (float64.fp32_bound, which follows the size of the terms summed, not of their sum), else
  onnxruntime's largest error (the only measure of the step's conditioning there is), plus a
  few roundings of the element and of the tensor's scale;
- in norm, ||o - e|| <= norm_slack * ||t - e||, the slack for another summation order (on
  an ill-conditioned net a correct sequential sum lands at 0.97 to 1.2 times onnxruntime's
  error norm, depending on the data) and, in a small tensor, for chance;
- at the worst element, max |o - e| <= WORST_SLACK * max |t - e| (extremes vary more: up to
  1.6 times there).

A correct FP32 kernel that sums in another order than onnxruntime meets all three; one off by
a little everywhere fails the first wherever the bound is tight, or the norm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import onnx

from .check import ErrorStats

# float32's unit roundoff
UNIT_ROUNDOFF = 2.0 ** -24
# Roundings of its own a step may add to an element beyond the bound of its op: the few of a
# fused activation's exp and division, or of a chain of pointwise ops
ROUNDINGS = 16
# How much further than onnxruntime's the worst element may be: extremes of rounding vary by order
WORST_SLACK = 3.0
# How much larger than onnxruntime's opplugin's error norm may be, for another summation order
NORM_SLACK = 1.5


def norm_slack(elements: int) -> float:
    """How much larger than onnxruntime's opplugin's error norm may be: NORM_SLACK, and more for
    chance in a small tensor (the norm of n random errors varies by about 1/sqrt(2n) of itself)."""
    return NORM_SLACK + 4.0 / np.sqrt(max(1, elements))


@dataclass(frozen=True)
class Closeness:
    """Both sides of a step against the float64 result (see the module's docstring)."""

    elements: int
    within_tolerance: bool  # opplugin within the check's atol/rtol of float64, NaN and Inf included
    specials_as_exact: bool  # opplugin's NaN and +-Inf exactly where float64 has them
    onnxruntime_specials_as_exact: bool
    specials_unlike_onnxruntime: int  # elements where one side is NaN or Inf and the other is not, or another one
    max_abs: dict[str, float]  # each side's largest error over the elements float64 and it hold finite
    rel_l2: dict[str, float]  # each side's ||error|| / ||e|| over those elements
    bound_known: bool  # whether the step's op has an FP32 error bound (float64.fp32_bound)
    beyond: int  # finite elements where opplugin is further than |t - e| + b
    worst_excess: float  # the largest |o - e| / (|t - e| + b): at most 1 passes
    norm_ratio: float  # ||o - e|| / ||t - e|| (inf where onnxruntime is exact and opplugin is not)
    norm_limit: float
    worst_ratio: float  # max |o - e| / max |t - e|
    norm_passes: bool
    worst_passes: bool

    @property
    def elementwise_passes(self) -> bool:
        return self.beyond == 0

    @property
    def no_further_than_onnxruntime(self) -> bool:
        return self.elementwise_passes and self.norm_passes and self.worst_passes

    @property
    def acquits(self) -> bool:
        return self.specials_as_exact and (self.within_tolerance or self.no_further_than_onnxruntime)

    @property
    def specials_explained(self) -> bool:
        """opplugin's NaN and Inf are float64's and onnxruntime's are not: float64 sides with opplugin."""
        return self.specials_as_exact and not self.onnxruntime_specials_as_exact

    def why(self) -> str:
        """The verdict in a few words, with the figure that decided it."""
        if not self.specials_as_exact:
            return "NaN or Inf where float64 has none, or a number where it has NaN or Inf: wrong"
        if self.within_tolerance:
            return "opplugin within the tolerance of float64: sound"
        if self.no_further_than_onnxruntime:
            return (f"opplugin no further than onnxruntime over the whole tensor (rel L2 {self.rel_l2['opplugin']:.2e} "
                    f"vs {self.rel_l2['onnxruntime']:.2e}, every element within onnxruntime's error plus the FP32 "
                    f"{'bound' if self.bound_known else 'allowance'}): sound")
        failed = []
        if not self.elementwise_passes:
            failed.append(f"at {self.beyond:,} of {self.elements:,} elements beyond onnxruntime's error plus the FP32 "
                          f"{'bound' if self.bound_known else 'allowance'} (up to {self.worst_excess:.3g}x)")
        if not self.norm_passes:
            failed.append(f"rel L2 {self.rel_l2['opplugin']:.2e}, {self.norm_ratio:.3g}x onnxruntime's "
                          f"(at most {self.norm_limit:.3g}x)")
        if not self.worst_passes:
            failed.append(f"worst element {self.worst_ratio:.3g}x onnxruntime's (at most {WORST_SLACK:g}x)")
        return f"opplugin further from float64 than onnxruntime: {'; '.join(failed)}: wrong"

    def as_json(self) -> dict[str, Any]:
        return {"elements": self.elements, "within_tolerance": self.within_tolerance,
                "nan_inf_as_float64": {"opplugin": self.specials_as_exact, "onnxruntime": self.onnxruntime_specials_as_exact},
                "max_abs": self.max_abs, "rel_l2": self.rel_l2, "fp32_bound_known": self.bound_known,
                "elements_beyond": self.beyond, "worst_excess": _finite_or_none(self.worst_excess),
                "norm_ratio": _finite_or_none(self.norm_ratio), "norm_limit": self.norm_limit,
                "worst_ratio": _finite_or_none(self.worst_ratio), "worst_limit": WORST_SLACK}


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None


def _special_codes(a: np.ndarray) -> np.ndarray:
    """0 for a number, 1 and -1 for +Inf and -Inf, 2 for NaN."""
    return np.where(np.isnan(a), 2, np.where(np.isinf(a), np.sign(np.nan_to_num(a, nan=0.0)), 0)).astype(np.int8)


def judge(ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray], exact: Sequence[np.ndarray],
          bound: np.ndarray | None, atol: float, rtol: float) -> Closeness:
    """opplugin's (`ours`) and onnxruntime's (`theirs`) outputs of a step against its float64
    result (`exact`), output by output; `bound`: the FP32 error bound of a single output's
    elements (float64.fp32_bound), or None where none is known."""
    tolerance = ErrorStats(atol, rtol)
    for o, e in zip(ours, exact):
        tolerance.add(np.asarray(o), np.asarray(e))
    o, t, e = (np.concatenate([np.asarray(a, np.float64).ravel() for a in side]) for side in (ours, theirs, exact))
    if bound is not None and (len(exact) != 1 or bound.shape != np.shape(exact[0])):
        bound = None
    codes = [_special_codes(a) for a in (o, t, e)]
    specials_as_exact = bool(np.array_equal(codes[0], codes[2]))
    finite = np.isfinite(e) & np.isfinite(o)
    theirs_finite = np.isfinite(t[finite])
    magnitude = np.abs(e[finite])
    ours_error = np.abs(o[finite] - e[finite])
    # where onnxruntime is not finite and float64 is, onnxruntime is off: it excuses nothing there
    theirs_error = np.where(theirs_finite, np.abs(np.where(np.isfinite(t), t, 0.0)[finite] - e[finite]), 0.0)
    scale = float(np.sqrt(np.mean(magnitude * magnitude))) if magnitude.size else 0.0
    roundings = ROUNDINGS * UNIT_ROUNDOFF * (magnitude + scale)
    worst_theirs = float(theirs_error.max()) if theirs_error.size else 0.0
    if bound is not None:
        allowance = np.nan_to_num(np.asarray(bound, np.float64).ravel()[finite], nan=np.inf)
    else:
        allowance = np.full(magnitude.shape, worst_theirs)
    limit = theirs_error + allowance + roundings
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(limit > 0, ours_error / limit, np.where(ours_error > 0, np.inf, 0.0))
    norms = [float(np.linalg.norm(x)) for x in (ours_error, theirs_error, magnitude)]
    worst_ours = float(ours_error.max()) if ours_error.size else 0.0
    norm_limit = norm_slack(int(ours_error.size))
    return Closeness(
        elements=int(o.size), within_tolerance=tolerance.passed, specials_as_exact=specials_as_exact,
        onnxruntime_specials_as_exact=bool(np.array_equal(codes[1], codes[2])),
        specials_unlike_onnxruntime=int(np.count_nonzero(codes[0] != codes[1])),
        max_abs={"opplugin": worst_ours, "onnxruntime": worst_theirs},
        rel_l2={side: (n / norms[2] if norms[2] > 0 else n) for side, n in (("opplugin", norms[0]), ("onnxruntime", norms[1]))},
        bound_known=bound is not None, beyond=int(np.count_nonzero(excess > 1)),
        worst_excess=float(excess.max()) if excess.size else 0.0,
        norm_ratio=_ratio(norms[0], norms[1]), norm_limit=norm_limit, worst_ratio=_ratio(worst_ours, worst_theirs),
        norm_passes=norms[0] <= norm_limit * norms[1] + ROUNDINGS * UNIT_ROUNDOFF * norms[2],
        worst_passes=worst_ours <= WORST_SLACK * worst_theirs + ROUNDINGS * UNIT_ROUNDOFF * (float(magnitude.max(initial=0.0)) + scale))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (0.0 if a == 0 else float("inf"))


# --- why onnxruntime's NaN and Inf differ --------------------------------------------------

def why_specials_differ(nodes: Sequence[onnx.NodeProto], values: dict[str, np.ndarray]) -> str:
    """Where opplugin's NaN and Inf are float64's and onnxruntime's are not, the reason when it
    is known: onnxruntime's Conv leaves out the taps over its padding, where ONNX's definition
    multiplies the weight by a zero, and a NaN or Inf weight times zero is NaN."""
    for node in nodes:
        if node.op_type != "Conv" or len(node.input) < 2 or not _padded(node):
            continue
        weight = values.get(node.input[1])
        if weight is not None and not np.all(np.isfinite(np.asarray(weight, np.float64))):
            return (f"onnxruntime's Conv ({node.name or node.output[0]}) skips the taps over its padding, so a NaN or Inf "
                    f"weight there reaches nothing; ONNX's definition, in float64, multiplies it by the padding's zeros, "
                    f"and 0 x NaN or Inf is NaN")
    return "onnxruntime's NaN and Inf differ from the float64 result of the step's ONNX nodes"


def _padded(node: onnx.NodeProto) -> bool:
    for attribute in node.attribute:
        if attribute.name == "pads" and any(attribute.ints):
            return True
        if attribute.name == "auto_pad" and attribute.s not in (b"", b"NOTSET", b"VALID"):
            return True
    return False
