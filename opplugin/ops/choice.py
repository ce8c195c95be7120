"""Which CUDA variant a Conv node gets when the user names none.

The heuristic prefers the families in the order the seeds' optimisations build
on each other, most refined first, taking the first one that can run the node
(with its fused epilogue, if any): register blocking, then several maps per
thread, then one output per thread from constant memory, then the baseline,
which runs everything 2-D.
"""
from __future__ import annotations

from ..registry import Device, PluginError
from . import conv_cuda
from .conv import ConvSpec
from .epilogue import Epilogue

PREFERENCE = ("const_rb", "const_mo", "const", "baseline")


def heuristic_variant(spec: ConvSpec, weights, epilogue: Epilogue) -> str:
    for name in PREFERENCE:
        if conv_cuda.unsupported_reason(spec, name, weights, epilogue) is None:
            return conv_cuda.resolve(spec, name, epilogue)
    for name in PREFERENCE:  # none fuses: the plain kernel runs, the epilogue follows in CuPy
        if conv_cuda.unsupported_reason(spec, name, weights) is None:
            return conv_cuda.resolve(spec, name)
    raise PluginError(f"no CUDA variant can run this Conv ({spec})")


def choose_variant(spec: ConvSpec, weights, epilogue: Epilogue, device: Device) -> str:
    """The configured variant name for this node on this device."""
    return heuristic_variant(spec, weights, epilogue)
