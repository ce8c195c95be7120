"""The CUDA variants of Conv: the registry of families, their limits, and building them.

Every shape constant of the node is compiled in through NVRTC -D macros (see
`common.shape_defines`); only the batch size is a kernel argument. Variants
with filters in __constant__ memory get their own module per distinct (W, B).

A variant is a family and its configuration, a frozen `Config`. Its name is made
from the Config in one grammar (ops/config_grammar.py), e.g. "const_mo_m8"; a
family's name alone ("const_mo") stands for the configuration its heuristic picks
for the node. The functions here take a `Variant`: a Config, a Family (its pick),
or a name, which `parse` reads here, where names come in (--variant, the tuning
cache, tests). Built kernels are named "conv.<configured name><epilogue>", e.g.
"conv.const_rb_t8x1_m4+relu+maxpool2".
"""
from __future__ import annotations

import importlib
from typing import Union

import numpy as np

from ....gpu import cuda
from ....gpu.kernel_cache import CompileJob
from ....errors import PluginError
from ... import config_grammar
from ...config_grammar import Config
from ..epilogue import NONE, Epilogue
from ..spec import ConvSpec
from .base import CONSTANT_MEMORY_BYTES, INT32_MAX, CompileUnit, ConvKernel, Family, Weights, constant_bytes
from .direct import default_maps_per_thread

__all__ = [
    "CONSTANT_MEMORY_BYTES",
    "FAMILIES",
    "VARIANTS",
    "CompileUnit",
    "Config",
    "ConvKernel",
    "Variant",
    "build_checked",
    "build_kernel",
    "checked",
    "compile_jobs",
    "compile_units",
    "configure",
    "constant_bytes",
    "default_maps_per_thread",
    "family_configs",
    "family_of",
    "parse",
    "tuning_configs",
    "unsupported_reason",
    "usable_families",
]

# The modules of this package that define families, in the order of the seeds'
# optimisation story: each family is one step. Each module has a FAMILIES list.
FAMILY_MODULES = ("direct", "unrolled", "tiled", "reduction", "blocked", "gemm", "fp16", "tf32_mma", "tc_gemm", "wgmma", "simt_gemm", "depthwise", "depthwise_half", "grouped_half", "dense")
FAMILIES: dict[str, Family] = {
    family.name: family
    for module in FAMILY_MODULES
    for family in importlib.import_module(f"{__name__}.{module}").FAMILIES
}
VARIANTS: dict[str, str] = {name: family.summary for name, family in FAMILIES.items()}
CONFIG_TYPES = {name: family.config_type for name, family in FAMILIES.items()}  # what the grammar parses names into

Variant = Union[Config, Family, str]


def parse(name: str) -> tuple[Family, Config | None]:
    """The family a variant name belongs to and the Config it spells (None for the family's
    name alone); a PluginError that says what is wrong with a bad name."""
    family, config = config_grammar.parse(name, CONFIG_TYPES, "Conv")
    return FAMILIES[family], config


def _parsed(variant: Variant) -> tuple[Family, Config | None]:
    if isinstance(variant, Config):
        return FAMILIES[variant.family], variant
    if isinstance(variant, Family):
        return variant, None
    return parse(variant)


def family_of(variant: Variant) -> Family:
    return _parsed(variant)[0]


def configure(spec: ConvSpec, variant: Variant, epilogue: Epilogue = NONE) -> Config:
    """The Config `variant` stands for on this node: a family's (or its name's) is its
    heuristic's pick; a PluginError when none of its configurations fits."""
    family, config = _parsed(variant)
    if config is None:
        config = family.default(spec, epilogue)
    if config is None:
        raise PluginError(f"{family.name}: {family.unconfigured_reason(spec, epilogue)}")
    return config


def _shared_reason(spec: ConvSpec, family: Family, epilogue: Epilogue) -> str | None:
    if spec.rank != 2:
        return f"only 2-D convolution is implemented (this Conv is {spec.rank}-D)"
    if not family.runs_here():
        capabilities = " or ".join(f"{int(arch[3:]) // 10}.{int(arch[3:]) % 10}" for arch in family.archs)
        return f"{family.name} runs on compute capability {capabilities} alone; this GPU's code is {cuda.device_arch()}"
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
    if epilogue.prologue and not family.takes_prologue:
        return f"{family.name} applies no prologue ({epilogue.prologue.prefix.rstrip('*')}) to its input"
    if epilogue.without_prologue() != NONE and not family.fuses:
        return f"{family.name} has no fused epilogue ({epilogue.suffix.lstrip('+')})"
    return None


def checked(spec: ConvSpec, variant: Variant, weights: Weights | None, epilogue: Epilogue = NONE) -> tuple[Config | None, str | None]:
    """(the Config `variant` stands for on this node, None when it can run the node with this
    epilogue, else the reason, shown by `opplugin plan`); the Config is None where there is none."""
    config, reason = _fitting(spec, variant, epilogue)
    if reason or weights is not None:
        return config, reason
    family = FAMILIES[config.family]
    if family.constant_weights:
        reason = "the weights are not constant (not initializers): __constant__ memory is filled once, at build time"
    elif family.weights_at_build:
        reason = f"the weights are not constant (not initializers): {family.name} rearranges them once, at build time"
    return config, reason


def _fitting(spec: ConvSpec, variant: Variant, epilogue: Epilogue) -> tuple[Config | None, str | None]:
    """`checked` but for the weights."""
    try:
        family, config = _parsed(variant)
    except PluginError as err:
        return None, str(err)
    reason = _shared_reason(spec, family, epilogue)
    if reason:
        return config, reason
    if config is None:
        config = family.default(spec, epilogue)
    if config is None:
        return None, family.unconfigured_reason(spec, epilogue)
    return config, family.reason(spec, config, epilogue)


def unsupported_reason(spec: ConvSpec, variant: Variant, weights: Weights | None, epilogue: Epilogue = NONE) -> str | None:
    """None when `variant` can run this Conv (with this epilogue), else the reason (shown by `opplugin plan`)."""
    return checked(spec, variant, weights, epilogue)[1]


def usable_families(spec: ConvSpec, weights: Weights | None, epilogue: Epilogue = NONE, exact_only: bool = True) -> list[str]:
    """Family names that can run this node, FP32-exact ones only unless asked."""
    return [
        name
        for name, family in FAMILIES.items()
        if (family.exact or not exact_only) and unsupported_reason(spec, family, weights, epilogue) is None
    ]


def tuning_configs(spec: ConvSpec, weights: Weights | None, epilogue: Epilogue = NONE, exact_only: bool = True) -> list[Config]:
    """Every configuration that can run this node: what `opplugin tune` times."""
    configs: list[Config] = []
    for family in usable_families(spec, weights, epilogue, exact_only):
        configs += family_configs(spec, family, weights, epilogue)
    return list(dict.fromkeys(configs))


def family_configs(spec: ConvSpec, family: str, weights: Weights | None, epilogue: Epilogue = NONE) -> list[Config]:
    """The configurations of one family that can run this node: what `tune --precision fp16` times of wg_fp16."""
    return [c for c in FAMILIES[family].configs(spec, epilogue) if unsupported_reason(spec, c, weights, epilogue) is None]


def compile_units(spec: ConvSpec, variant: Variant, epilogue: Epilogue = NONE) -> list[CompileUnit]:
    """The specialised sources of a variant, for the offline compile check."""
    config, reason = _fitting(spec, variant, epilogue)
    if reason:
        raise PluginError(f"variant '{variant}': {reason}")
    return FAMILIES[config.family].compile_units(spec, config, epilogue)


def build_kernel(spec: ConvSpec, variant: Variant, weights: Weights | None, epilogue: Epilogue = NONE) -> ConvKernel:
    """Compile `variant` for this Conv; the constant variants upload (W, B) into their module now."""
    config, reason = checked(spec, variant, weights, epilogue)
    if reason:
        raise PluginError(f"variant '{variant}' cannot run this Conv: {reason}")
    return build_checked(spec, config, weights, epilogue)


def compile_jobs(spec: ConvSpec, config: Config, weights: Weights | None, epilogue: Epilogue, arch: str) -> list[CompileJob]:
    """What build_checked compiles for a configuration `checked` found can run this Conv, on a GPU
    of `arch`, without compiling it."""
    return FAMILIES[config.family].compile_jobs(spec, config, weights, epilogue, arch)


def build_checked(spec: ConvSpec, config: Config, weights: Weights | None, epilogue: Epilogue = NONE) -> ConvKernel:
    """Compile a configuration `checked` found can run this Conv with this epilogue."""
    if weights is not None:
        w, b = weights
        if tuple(w.shape) != spec.weight_shape or (b is not None) != spec.has_bias:
            raise PluginError(f"weights {tuple(w.shape)} (bias {b is not None}) do not match the Conv {spec}")
    return FAMILIES[config.family].build(spec, config, weights, epilogue)
