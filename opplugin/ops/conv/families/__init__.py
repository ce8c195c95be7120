"""The CUDA variants of Conv: the registry of families, their limits, and building them.

Every shape constant of the node is compiled in through NVRTC -D macros (see
`common.shape_defines`); only the batch size is a kernel argument. Variants
with filters in __constant__ memory get their own module per distinct (W, B).

A variant name is a family name ("const_mo"), which picks the configuration by
a heuristic, or a configured name ("const_mo8"). Built kernels are named
"conv.<configured name><epilogue>", e.g. "conv.const_rb_r8m4+relu+maxpool2".
"""
from __future__ import annotations

import importlib

import numpy as np

from ....errors import PluginError
from ..epilogue import NONE, Epilogue
from ..spec import ConvSpec
from .common import CONSTANT_MEMORY_BYTES, INT32_MAX, CompileUnit, ConvKernel, Family, Weights, constant_bytes
from .direct import default_maps_per_thread

__all__ = [
    "CONSTANT_MEMORY_BYTES",
    "FAMILIES",
    "VARIANTS",
    "CompileUnit",
    "ConvKernel",
    "build_kernel",
    "compile_units",
    "constant_bytes",
    "default_maps_per_thread",
    "family_of",
    "resolve",
    "tuning_configs",
    "unsupported_reason",
    "usable_families",
]

# The modules of this package that define families, in the order of the seeds'
# optimisation story: each family is one step. Each module has a FAMILIES list.
FAMILY_MODULES = ("direct", "unrolled", "tiled", "reduction", "blocked", "gemm", "mixed", "tensor_gemm", "simt_gemm")
FAMILIES: dict[str, Family] = {
    family.name: family
    for module in FAMILY_MODULES
    for family in importlib.import_module(f"{__name__}.{module}").FAMILIES
}
VARIANTS: dict[str, str] = {name: family.summary for name, family in FAMILIES.items()}


def family_of(variant: str) -> Family:
    for family in FAMILIES.values():
        if family.owns(variant):
            return family
    raise PluginError(f"unknown Conv variant {variant!r}; choose from {', '.join(FAMILIES)} (or a configured name such as const_mo8)")


def resolve(spec: ConvSpec, variant: str, epilogue: Epilogue = NONE) -> str:
    """The configured name `variant` stands for on this node ("const_mo" -> "const_mo4")."""
    return family_of(variant).resolve(spec, variant, epilogue)


def _shared_reason(spec: ConvSpec, family: Family, epilogue: Epilogue) -> str | None:
    if spec.rank != 2:
        return f"only 2-D convolution is implemented (this Conv is {spec.rank}-D)"
    if spec.out_channels > 65535:
        return f"{spec.out_channels} output maps exceed the grid's y limit of 65535"
    pixels = int(np.prod(spec.out_size))
    if spec.batch * pixels > INT32_MAX:
        return f"batch {spec.batch} x {pixels} output pixels exceeds 32-bit indexing; split the batch"
    if family.constant_weights and constant_bytes(spec) > CONSTANT_MEMORY_BYTES:
        return (
            f"filters and bias need {constant_bytes(spec)} bytes, more than the 64 KiB "
            f"({CONSTANT_MEMORY_BYTES} bytes) of __constant__ memory"
        )
    if epilogue != NONE and not family.fuses:
        return f"{family.name} has no fused epilogue ({epilogue.suffix.lstrip('+')})"
    return None


def unsupported_reason(spec: ConvSpec, variant: str, weights: Weights | None, epilogue: Epilogue = NONE) -> str | None:
    """None when `variant` can run this Conv (with this epilogue), else the reason (shown by `opplugin plan`)."""
    try:
        family = family_of(variant)
    except PluginError as err:
        return str(err)
    reason = _shared_reason(spec, family, epilogue) or family.reason(spec, family.resolve(spec, variant, epilogue), epilogue)
    if reason:
        return reason
    if family.constant_weights and weights is None:
        return "the weights are not constant (not initializers): __constant__ memory is filled once, at build time"
    return None


def usable_families(spec: ConvSpec, weights: Weights | None, epilogue: Epilogue = NONE, exact_only: bool = True) -> list[str]:
    """Family names that can run this node, FP32-exact ones only unless asked."""
    return [
        name
        for name, family in FAMILIES.items()
        if (family.exact or not exact_only) and unsupported_reason(spec, name, weights, epilogue) is None
    ]


def tuning_configs(spec: ConvSpec, weights: Weights | None, epilogue: Epilogue = NONE, exact_only: bool = True) -> list[str]:
    """Every configured variant that can run this node: what `opplugin tune` times."""
    names: list[str] = []
    for family in usable_families(spec, weights, epilogue, exact_only):
        names += [v for v in FAMILIES[family].configs(spec, epilogue) if unsupported_reason(spec, v, weights, epilogue) is None]
    return list(dict.fromkeys(names))


def compile_units(spec: ConvSpec, variant: str, epilogue: Epilogue = NONE) -> list[CompileUnit]:
    """The specialised sources of a variant, for the offline compile check."""
    family = family_of(variant)
    reason = _shared_reason(spec, family, epilogue) or family.reason(spec, family.resolve(spec, variant, epilogue), epilogue)
    if reason:
        raise PluginError(f"variant {variant!r}: {reason}")
    return family.compile_units(spec, family.resolve(spec, variant, epilogue), epilogue)


def build_kernel(spec: ConvSpec, variant: str, weights: Weights | None, epilogue: Epilogue = NONE) -> ConvKernel:
    """Compile `variant` for this Conv; the constant variants upload (W, B) into their module now."""
    family = family_of(variant)
    reason = unsupported_reason(spec, variant, weights, epilogue)
    if reason:
        raise PluginError(f"variant {variant!r} cannot run this Conv: {reason}")
    if weights is not None:
        w, b = weights
        if tuple(w.shape) != spec.weight_shape or (b is not None) != spec.has_bias:
            raise PluginError(f"weights {tuple(w.shape)} (bias {b is not None}) do not match the Conv {spec}")
    return family.build(spec, family.resolve(spec, variant, epilogue), weights, epilogue)
