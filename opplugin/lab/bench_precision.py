"""The Conv suites in a 16-bit format (`bench --suite cnn|models --precision fp16|bf16`): opplugin's
candidate per Conv is the family `run --precision` runs it in (precision_fit of ops/conv/plugin.py: wg_fp16 or
wg_bf16, or for a depthwise Conv dw_fp16 or dw_bf16), beside cuDNN in the same format (peers.cudnn_peer); each
candidate is checked within the format's element bound (format_bound.py) before it is timed.
"""
from __future__ import annotations

from ..core.number_formats import FP32
from ..ops.conv.epilogue import NONE
from ..ops.conv.families import Config
from ..ops.conv.families.base import Weights
from ..ops.conv.plugin import CONV_PRECISIONS, PRECISION_FAMILIES, precision_fit
from ..ops.conv.spec import ConvSpec
from .format_bound import FormatBound

SUITE_PRECISIONS = CONV_PRECISIONS  # what the Conv suites take: fp32 (every family), fp16, bf16


def precision_families(precision: str) -> tuple[str, ...]:
    """The families opplugin's candidates come from in a 16-bit run, one a Conv."""
    return PRECISION_FAMILIES[precision]


def precision_family(spec: ConvSpec, weights: Weights, precision: str) -> str:
    """The family of this Conv's candidate: the one `run --precision` runs it in, or where none can, the one whose
    reason the bench lists (the depthwise family's for a depthwise Conv)."""
    return precision_fit(spec, weights, NONE, precision)[0]


def precision_pick(spec: ConvSpec, weights: Weights, precision: str) -> tuple[Config | None, str | None]:
    """(the configuration `run --precision` runs this Conv in, None), or (None, why no family can run it: the
    step stays FP32 in such a run, and the bench lists the reason)."""
    _, config, _, reason = precision_fit(spec, weights, NONE, precision)
    return (None, reason) if reason else (config, None)


def candidate_bound(precision: str, output_format: str | None = None) -> FormatBound | None:
    """The element bound a candidate of a 16-bit run is held to (None under fp32: the relative L2 tolerances);
    `output_format`: the format the candidate stores its result in (cuDNN's), None for FP32 (opplugin's)."""
    return None if precision == FP32 else FormatBound(precision, rounded_output=output_format is not None)


def cudnn_name(precision: str) -> str:
    return f"cudnn_{precision}"
