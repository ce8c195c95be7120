"""Every CUDA Conv, Gemm, pool and reduction kernel compiles with NVRTC, without a GPU, for sm_80 and sm_90; its resources read on sm_90.

Runs in CI: cuda-bindings' NVRTC turns each specialised source into a cubin and
ptxas -v reports its resources. Every distinct compile the tests below ask for is
done once (compile_cache.py): they begin in the background while the suite is
collected (conftest.py), the rest up front in a pool of processes (`compiled_up_front`),
and they are kept in pytest's cache directory between runs; each test then reads its report.

Two kinds of compile:

- the build CuPy makes (full optimisation) for sm_90, Hopper, the target, wherever a
  test reads resources: no spills, no stack frame. That is every constant-memory family
  on every shape class, the heuristic's pick for each shipped step, the tensor-core and
  SIMT GEMMs and the half-precision depthwise kernels on real CNN layers, the wgmma GEMMs on
  windows wider than 3x3 (the ResNet stem's among them), the residual and
  activation epilogues, the explicit map groups, every Gemm configuration and every pool.
- NVRTC's fast-compile mode (compile_cache.FAST_OPTIONS: the same source and macros
  through the front end and ptxas, less optimisation), where a test checks only that
  a configuration compiles: every sm_80 case (compile_cache.FULL_BUILD_ARCHS; ptxas
  still reports the constant bank there, whose size the constant-memory families'
  test holds; the resource assertions read full builds alone), but the long-K 7x7 case
  kept for sm_80's registers and the half-precision depthwise families' picks; the other families on every shape class for sm_80 (their
  sources have no code for sm_80 or sm_90 alone, `variant_archs`); and every
  configuration tuning may time on the shipped steps for sm_90 (tuning screens out a
  spilling kernel itself).

Representatives: the tensor-core and SIMT GEMMs' every configuration on every real
CNN layer is compiled once per code shape (`code_shape`): per kernel, its source and
every macro but SHAPE_CONSTANTS, the shape dimensions these two kernels use only as
arithmetic constants (index maths, bounds tests, the run-time bound of the K loop;
test_shape_constants_only_do_arithmetic reads the sources for #if, if constexpr and
for-loop bounds), with the K split (KSLICES) only as one slice or more: past `#if
KSLICES == 1` the count is arithmetic too, but for the bound of the split-K reduce
kernel's summing loop (test_k_slices_pick_code_only_as_one_or_more), so the
representatives are chosen to compile each family's every K split count on each arch.
Two cases of one code shape differ only in those immediates. Checked against a full
compile of every case (sm_80 and sm_90, 404 compiles): with the K split exact, a
kernel's registers differed within a code shape by at most 4 and no case spilled;
with the K split as one or more (158 compiles instead of 208), by at most 2 in the
GEMM kernels and 4 in the reduce kernel, and no case spilled.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import compile_cache
from opplugin.gpu import cuda
from opplugin.core import paths as resources
from opplugin.lab import cnn_layers, nvrtc_check
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config
from onnx_builders import conv_spec as conv
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined, wgmma
from opplugin.ops.conv.families.channel_last import ALL_LINKS
from opplugin.ops.activation import KINDS as ACTIVATION_KINDS, Activation
from opplugin.ops.gemm import families as gemm_families
from opplugin.ops.gemm.epilogue import NONE as GEMM_NONE, GemmEpilogue
from opplugin.ops.gemm.spec import GemmSpec
from opplugin.ops.pool import kernel as pool_kernel
from opplugin.ops.gemm import matmul as matmul_kernel
from opplugin.ops.channel_last import INPUT, OUTPUT
from opplugin.ops.reduction import kernel as reduction_kernel
from opplugin.ops.reduction import linked_kernel as linked_norm_kernel
from opplugin.ops.reduction.channel_last import MAX_CHANNELS, LinkedNorm
from opplugin.ops.reduction.rows import Rows
from opplugin.ops.reduction.spec import GROUP, INSTANCE, LAYER, NormSpec, ReduceSpec, SoftmaxSpec
from opplugin.ops.pool.spec import AVERAGE, MAX, PoolSpec

pytestmark = pytest.mark.skipif(
    not nvrtc_check.nvrtc_available(),
    reason="cuda-bindings' NVRTC is not importable (pip install cuda-bindings nvidia-cuda-nvrtc)",
)

ARCHS = ("sm_80", "sm_90")


SHAPES = {
    # the Conv nodes of the shipped models, at the course's batch of 10000
    "lenet86.conv1": conv(10000, 1, 4, (86, 86), (7, 7)),
    "lenet86.conv2": conv(10000, 4, 16, (40, 40), (7, 7)),
    "ece408_high.conv": conv(10000, 1, 50, (28, 28), (5, 5)),
    # the semantics the kernels must also cover
    "stride2": conv(8, 3, 8, (17, 23), (3, 3), strides=(2, 2), pads=(1, 1, 1, 1)),
    "asymmetric_pads_no_bias": conv(8, 2, 5, (15, 16), (3, 5), strides=(3, 2), pads=(0, 1, 1, 2), bias=False),
    "dilation2": conv(4, 8, 64, (19, 21), (3, 3), pads=(2, 2, 2, 2), dilations=(2, 2)),
    "depthwise": conv(4, 8, 8, (19, 21), (3, 3), pads=(1, 1, 1, 1), group=8),
}



def variant_archs(variant: str) -> tuple[str, ...]:
    """test_variant_compiles' architectures: both for a constant-memory family, whose resources it
    reads; sm_80 alone for the others, whose fast compile shows only that they compile. Their sources
    have no code for one of the two alone (test_fast_checked_sources_have_no_code_for_one_arch_alone),
    so sm_90's compile would be the same code through another ptxas, and sm_80 is the older target:
    the one an instruction newer than Ampere would fail on."""
    archs = families.FAMILIES[variant].archs
    if archs:
        return archs  # its code runs on these alone (wg_3xtf32: sm_90a), so it compiles for nothing else
    return ARCHS if variant in compile_cache.CONSTANT_FAMILIES else ("sm_80",)


# The shipped models' Conv nodes with the epilogues their plans fuse: tuning may pick any of these.
SHIPPED_STEPS = {
    "lenet86.conv1+relu+maxpool2": (SHAPES["lenet86.conv1"], Epilogue("Relu", (2, 2))),
    "lenet86.conv2+relu+maxpool4": (SHAPES["lenet86.conv2"], Epilogue("Relu", (4, 4))),
    "ece408_high.conv": (SHAPES["ece408_high.conv"], NONE),
    "ece408_high.conv+tanh+maxpool2": (SHAPES["ece408_high.conv"], Epilogue("Tanh", (2, 2))),
    "lenet86.conv1": (SHAPES["lenet86.conv1"], NONE),
    "lenet86.conv2": (SHAPES["lenet86.conv2"], NONE),
}


def _ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32) if spec.has_bias else None


CNN_SPECS = {layer.name: layer.spec(32) for layer in cnn_layers.LAYERS}
TUNING_CASES = [
    (step, config)
    for step, (spec, epilogue) in SHIPPED_STEPS.items()
    for config in families.tuning_configs(spec, _ones(spec), epilogue)
]


# The tensor-core GEMM's every configuration on each layer of `bench --suite cnn` (batch 32)
# that it runs, for Ampere and Hopper: what tuning may pick on a real CNN.
CNN_TENSOR_CORE_CASES = [
    (layer.name, config)
    for layer in cnn_layers.LAYERS
    if families.unsupported_reason(layer.spec(32), "tc_3xtf32", None) is None
    for config in families.FAMILIES["tc_3xtf32"].configs(layer.spec(32))
]


# The SIMT GEMM's every configuration (unsplit at batch 32, split K at batch 1) on each group-1 layer of the suite.
CNN_SIMT_CASES = [
    (layer.name, config)
    for layer in cnn_layers.LAYERS
    if families.unsupported_reason(layer.spec(32), "simt_gemm", None) is None
    for config in dict.fromkeys(families.FAMILIES["simt_gemm"].configs(layer.spec(32)) + families.FAMILIES["simt_gemm"].configs(layer.spec(1)))
]

# The depthwise and grouped families' first three configurations (their pick first) on each layer of
# the suite they run, at batch 32 and 1 (more maps a block at 32), for Ampere and Hopper.
CNN_DEPTHWISE_CASES = [
    (layer.name, batch, config, arch)
    for family in ("depthwise", "grouped")
    for layer in cnn_layers.LAYERS
    if families.unsupported_reason(layer.spec(32), family, None) is None
    for batch in (32, 1)
    for config in dict.fromkeys(families.FAMILIES[family].configs(layer.spec(batch))[:3])
    for arch in ARCHS
]

# The half-precision depthwise families' every configuration on each layer of the suite they run (batch 32: their
# configurations do not change with the batch), with MobileNetV2's fused Add and ReLU6, unlinked and with every
# tensor linked channel-last (dw_bf16 linked alone: its conversions are the same code in the other format), for
# Hopper and Ampere (no code for either alone): Hopper's builds in full, and Ampere's of the family's pick.
HALF_DEPTHWISE_EPILOGUE = Epilogue(Activation("Clip", 0.0, 6.0), residual=True)
CNN_HALF_DEPTHWISE_CASES = [
    (layer.name, dataclasses.replace(config, links=links), arch, arch == "sm_90" or index == 0)
    for family, link_sets in (("dw_fp16", (0, ALL_LINKS)), ("dw_bf16", (ALL_LINKS,)))
    for layer in cnn_layers.LAYERS
    for index, config in enumerate(families.FAMILIES[family].configs(layer.spec(32), HALF_DEPTHWISE_EPILOGUE))
    for links in link_sets
    for arch in ARCHS
]

# The half-precision grouped families' every configuration on each grouped layer of the suite they take (ResNeXt's
# groups of 4), on ResNeXt's groups of 8 and on groups of 16 channels (two loads a pixel) of 8 maps, at batch 32 and 1
# (the first pick changes with the launch), with a fused Add and ReLU, unlinked and with every tensor linked (gw_bf16
# linked alone), for Hopper in full and Ampere's pick (no code for either alone).
HALF_GROUPED_EPILOGUE = Epilogue("Relu", residual=True)
HALF_GROUPED_SPECS = {
    **{name: spec for name, spec in CNN_SPECS.items() if families.FAMILIES["gw_fp16"].configs(spec, HALF_GROUPED_EPILOGUE)},
    "resnext50 stage 2 g32 3x3 256ch 28": conv(32, 256, 256, (28, 28), (3, 3), pads=(1, 1, 1, 1), group=32),
    "16 channels 8 maps a group 3x3 256->128 14": conv(32, 256, 128, (14, 14), (3, 3), pads=(1, 1, 1, 1), group=16),
}
CNN_HALF_GROUPED_CASES = [
    (name, batch, dataclasses.replace(config, links=links), arch, arch == "sm_90" or index == 0)
    for family, link_sets in (("gw_fp16", (0, ALL_LINKS)), ("gw_bf16", (ALL_LINKS,)))
    for name, spec in HALF_GROUPED_SPECS.items()
    for batch in (32, 1)
    for index, config in enumerate(families.FAMILIES[family].configs(dataclasses.replace(spec, batch=batch), HALF_GROUPED_EPILOGUE))
    for links in link_sets
    for arch in ARCHS
]

# wg_fp16's and wg_bf16's narrow map tiles (8 to 32 maps a block: wgmma.NARROW_MAPS), for Hopper alone, with a fused Add and
# ReLU: every configuration the family offers on each layer of the suite with groups of 32 maps or fewer, and on 3x3 Convs
# of 8 and 32 maps (counts no layer of the suite has), unlinked and with every tensor linked (wg_bf16 linked alone: its
# conversions are the same code in the other format); and each narrow map tile on a deep Conv, K split 4 ways, unlinked
# and linked (the split's reduce stores the linked Y). Every one built in full: no spills.
NARROW_EPILOGUE = Epilogue("Relu", residual=True)
NARROW_SPECS = {
    **{name: spec for name, spec in CNN_SPECS.items() if spec.out_channels // spec.group <= wgmma.NARROW_MAPS[-1]
       and families.unsupported_reason(spec, "wg_fp16", _ones(spec), NARROW_EPILOGUE) is None},
    "3x3 64->8 56": conv(32, 64, 8, (56, 56), (3, 3), pads=(1, 1, 1, 1)),
    "3x3 64->32 56": conv(32, 64, 32, (56, 56), (3, 3), pads=(1, 1, 1, 1)),
    **{f"deep 512->{maps} 7": conv(1, 512, maps, (7, 7), (3, 3), pads=(1, 1, 1, 1)) for maps in wgmma.NARROW_MAPS},
}
CNN_NARROW_WGMMA_CASES = [
    (name, dataclasses.replace(config, links=links))
    for family, link_sets in (("wg_fp16", (0, ALL_LINKS)), ("wg_bf16", (ALL_LINKS,)))
    for name, spec in NARROW_SPECS.items()
    for config in (families.FAMILIES[family].configs(spec, NARROW_EPILOGUE) if not name.startswith("deep") else
                   [pipelined.with_split(families.FAMILIES[family].tile_config((spec.out_channels, 64)), 4)])
    for links in link_sets
]

# The wgmma GEMM's first four configurations on each layer of the suite it runs, at batch 32 and 1
# (K splits), for Hopper alone (sm_90a): its producers and consumers share 512 threads' registers.
CNN_WGMMA_CASES = [
    (layer.name, batch, config)
    for layer in cnn_layers.LAYERS
    if families.unsupported_reason(layer.spec(32), "wg_3xtf32", _ones(layer.spec(32))) is None
    for batch in (32, 1)
    for config in dict.fromkeys(families.FAMILIES["wg_3xtf32"].configs(layer.spec(batch))[:4])
]

# The pipelined implicit GEMMs (conv_tc_gemm.cu, conv_simt_gemm.cu, conv_wgmma.cu, all on
# conv_implicit_tiles.cuh) use these macros only as arithmetic constants: in index maths, bounds tests and the runtime
# bound of the K loop, never in an #if or a for loop's bound (test_shape_constants_only_do_arithmetic
# reads the sources for that). KH and KW are not among them: the tap mask unrolls a loop over KH*KW.
SHAPE_CONSTANTS = frozenset({"C", "M", "G", "H", "W", "OH", "OW", "POH", "POW", "KPAD", "PH", "PW", "SH", "SW", "DH", "DW"})
REPRESENTED_FAMILIES = ("tc_3xtf32", "simt_gemm", "wg_3xtf32")
# The K split picks code only as one slice or more (#if KSLICES == 1: the store of finished outputs
# or of partial sums); past that, the GEMM kernel uses the count in arithmetic alone (the length of
# a block's run of K slices), and only conv_k_slices_reduce's loops over a thread's partial sums (SliceSums: all
# loaded, then added) run to KSLICES
# (test_k_slices_pick_code_only_as_one_or_more). So a code shape has the class of its K split,
# and the representatives compile each family's reduce loop for every K split count on each arch.
K_SPLIT = "KSLICES"
REDUCE_LOOPS = frozenset({
    "for (int s = 0; s < KSLICES; ++s) part[s] = inside ? sums[s * apart] : 0.0f;",
    "for (int s = 0; s < KSLICES; ++s) v += part[s];",
})


def _split_class(value) -> str:
    return "1" if int(value) == 1 else "more than 1"


def code_shape(spec, config, arch):
    """What decides the code of `config` on `spec` for `arch`: per kernel, its source, name and
    every macro but the shape constants (tile sizes, vector widths, flags, KH and KW), with the
    K split as one slice or more."""
    return arch, tuple(
        (unit.source, unit.function, tuple((name, _split_class(value) if name == K_SPLIT else str(value))
                                           for name, value in unit.defines.items() if name not in SHAPE_CONSTANTS))
        for unit in nvrtc_check.variant_units(spec, config)
    )


def _case_spec(layer: str, batch: int):
    return dataclasses.replace(CNN_SPECS[layer], batch=batch)


# (layer, batch, config, arch) of every case a representative stands for: the tensor-core and SIMT
# GEMMs' at batch 32 for both archs, the wgmma GEMM's for Hopper
CNN_GEMM_CASES = [(name, 32, config, arch) for name, config in CNN_TENSOR_CORE_CASES + CNN_SIMT_CASES for arch in ARCHS] + [
    (name, batch, config, "sm_90") for name, batch, config in CNN_WGMMA_CASES]


def _case_code_shape(case):
    layer, batch, config, arch = case
    return code_shape(_case_spec(layer, batch), config, arch)


def _k_split(case) -> int:
    layer, batch, config, _ = case
    [split] = {int(unit.defines[K_SPLIT]) for unit in nvrtc_check.variant_units(_case_spec(layer, batch), config)}
    return split


def _split_coverage(case) -> tuple[str, str, int]:
    return families.family_of(case[2]).name, case[3], _k_split(case)


def _representatives():
    """(layer, batch, config, arch) -> the cases of CNN_GEMM_CASES it stands for: one case of each
    code shape is compiled; the others differ from it only in shape constants and in how many ways
    K is split. Each code shape's first case, unless another of its cases brings a K split count
    that its family has not compiled for that arch (the rarest such count first)."""
    groups: dict[tuple, list[tuple[str, int, str, str]]] = {}
    for case in CNN_GEMM_CASES:
        groups.setdefault(_case_code_shape(case), []).append(case)
    rarity: dict[tuple[str, str, int], int] = {}
    for cases in groups.values():
        for coverage in {_split_coverage(case) for case in cases}:
            rarity[coverage] = rarity.get(coverage, 0) + 1
    covered: set[tuple[str, str, int]] = set()
    representatives = {}
    for cases in sorted(groups.values(), key=lambda cases: min(rarity[_split_coverage(case)] for case in cases)):
        fresh = [case for case in cases if _split_coverage(case) not in covered]
        chosen = min(fresh, key=lambda case: rarity[_split_coverage(case)]) if fresh else cases[0]
        covered.add(_split_coverage(chosen))
        representatives[chosen] = cases
    return representatives


CNN_REPRESENTATIVES = _representatives()
# what each test compiles: the tensor-core and SIMT GEMMs' representatives (batch 32, both archs), the wgmma GEMM's (Hopper)
TC_SIMT_REPRESENTATIVES = [(layer, config, arch) for layer, _, config, arch in CNN_REPRESENTATIVES
                           if families.family_of(config).name != "wg_3xtf32"]
WGMMA_REPRESENTATIVES = [(layer, batch, config) for layer, batch, config, _ in CNN_REPRESENTATIVES
                         if families.family_of(config).name == "wg_3xtf32"]


# --- Gemm: every family's configurations on the shipped models' Gemm steps and the bench layers ---

GEMM_STEPS = {  # name -> (spec at the batch the plan or bench uses, the epilogue its plan fuses)
    "lenet86.fc1": (GemmSpec(10000, 32, 1024, trans_b=True, bias="column"), GemmEpilogue(Activation.plain("Relu"))),
    "lenet86.fc2": (GemmSpec(10000, 10, 32, trans_b=True, bias="column"), GemmEpilogue(softmax=True)),
    "ece408_high.fc1": (GemmSpec(10000, 128, 7200, trans_b=True, bias="column"), GemmEpilogue(Activation.plain("Tanh"))),
    "ece408_high.fc2": (GemmSpec(10000, 10, 128, trans_b=True, bias="column"), GemmEpilogue(softmax=True)),
    "mlp_onehidden.fc1": (GemmSpec(10000, 128, 784, trans_b=True, bias="column"), GemmEpilogue(Activation.plain("Sigmoid"))),
    "odd": (GemmSpec(7, 33, 13, trans_a=True, alpha=0.5, bias="full"), GemmEpilogue(Activation("Clip", 0.0, 6.0))),
    **{f"bench {k}->{n} @{m}": (GemmSpec(m, n, k, trans_b=True, bias="column"), GEMM_NONE)
       for k, n in ((25088, 4096), (4096, 1024), (32754, 128), (128, 4), (1024, 32), (7200, 128)) for m in (1, 16, 10000)},
}
GEMM_CONFIGS = ["gemv_w1x1_k1", "gemv_w2x2_k4", "gemv_w4x1_k16", "gemv_w16x2_k1", "gemv_w8x4_k2", "gemv_w16x2_k8",
                *(t.name() for t in gemm_families.TILES), "rowwarp_r1", "rowwarp_r2", "rowwarp_r4",
                *(gemm_families.TensorConfig("tc_3xtf32", (*tile, gemm_families.TENSOR_DEPTH), warp, 3).name()
                  for tile, warp in gemm_families.TENSOR_TILES.items()),
                *(gemm_families.WgmmaConfig("wg_3xtf32", (*tile, gemm_families.TENSOR_DEPTH), 3).name() for tile in gemm_families.WGMMA_TILES)]
GEMM_ACTIVATIONS = [Activation.plain(op) for op in ACTIVATION_KINDS] + [Activation("LeakyRelu", 0.3), Activation("Clip", -1.0)]


def _gemm_cases():
    """(label, spec, config, epilogue, arch) of every Gemm compile the tests ask for."""
    for step, (spec, epilogue) in GEMM_STEPS.items():
        for variant in [*gemm_families.FAMILIES, *GEMM_CONFIGS]:
            config = gemm_families.configure(spec, variant)
            if gemm_families.unsupported_reason(spec, config, epilogue) is None:
                for arch in _gemm_archs(config, both=variant in gemm_families.FAMILIES):
                    yield f"{step} {config} {arch}", spec, config, epilogue, arch
    spec = GemmSpec(9, 10, 56, bias="column")  # K a multiple of 8: every family, the half-precision ones too
    for activation in GEMM_ACTIVATIONS:
        for variant in gemm_families.FAMILIES:
            epilogue = GemmEpilogue(activation, softmax=variant == "rowwarp")
            config = gemm_families.configure(spec, variant)
            yield f"{activation.suffix} {variant}", spec, config, epilogue, _gemm_archs(config, both=False)[0]


def _gemm_archs(config, both: bool) -> tuple[str, ...]:
    """Where a Gemm configuration compiles: wgmma's for Hopper alone (sm_90a), the others for both
    ARCHS, or sm_90 alone."""
    return ("sm_90a",) if config.arch_specific else ARCHS if both else ("sm_90",)


GEMM_CASES = list(_gemm_cases())


# --- the residual epilogue: Add, every activation of the shared table, and the pool after them ---

RESIDUAL_STEPS = {
    # real-CNN layers at batch 32 with what their plans fuse: the tensor-core GEMM's unsplit and split-K stores
    "resnet 64->64 3x3 56+add+relu": (CNN_SPECS["resnet 64->64 3x3 56"], Epilogue("Relu", residual=True)),
    "resnet 512->512 3x3 7+add+relu": (CNN_SPECS["resnet 512->512 3x3 7"], Epilogue("Relu", residual=True)),
    "resnet 1x1 64->256 56+add+relu": (CNN_SPECS["resnet 1x1 64->256 56"], Epilogue("Relu", residual=True)),
    "mobilenetv2 1x1 96->24 56+add": (CNN_SPECS["mobilenetv2 1x1 96->24 56"], Epilogue(residual=True)),
    "mobilenetv2 dw 3x3 32ch 112+relu6": (CNN_SPECS["mobilenetv2 dw 3x3 32ch 112"], Epilogue(Activation("Clip", 0.0, 6.0))),
    # the grouped and depthwise families with the activations their models fuse
    "resnext50 g32 3x3 128ch 56+relu": (CNN_SPECS["resnext50 g32 3x3 128ch 56"], Epilogue("Relu")),
    "efficientnetb0 dw 5x5 672ch 14+silu": (CNN_SPECS["efficientnetb0 dw 5x5 672ch 14"], Epilogue(Activation("Silu"))),
    # a squeeze-and-excitation Conv on a 1x1 map: the dense families (the Gemm kernels, activation only)
    "efficientnetb0 se 480->20 1x1 map+silu": (conv(32, 480, 20, (1, 1), (1, 1)), Epilogue(Activation("Silu"))),
    # the blocked families' pools after a residual or a non-monotone activation (each output finished first)
    "lenet86.conv2+add+relu+maxpool4": (SHAPES["lenet86.conv2"], Epilogue("Relu", (4, 4), residual=True)),
    "lenet86.conv1+hardswish+maxpool2": (SHAPES["lenet86.conv1"], Epilogue("HardSwish", (2, 2))),
    "stride2+add+silu+maxpool2": (SHAPES["stride2"], Epilogue(Activation("Silu"), (2, 2), residual=True)),
}
RESIDUAL_FAMILIES = [name for name, family in families.FAMILIES.items() if family.fuses and family.exact]


def _residual_cases():
    """(step, configured variant, arch): each fusing family's pick, and split K where the GEMM has one."""
    for step, (spec, epilogue) in RESIDUAL_STEPS.items():
        configs = [families.configure(spec, name, epilogue).name() for name in RESIDUAL_FAMILIES
                   if families.unsupported_reason(spec, name, _ones(spec), epilogue) is None]
        if families.unsupported_reason(spec, "tc_3xtf32_b64x64x32_w32x32_s3_k4", None, epilogue) is None:
            configs.append("tc_3xtf32_b64x64x32_w32x32_s3_k4")
        for config in dict.fromkeys(configs):
            for arch in families.family_of(config).archs or ARCHS:
                yield step, config, arch


RESIDUAL_CASES = list(_residual_cases())


def _tuning_candidate_alone(step: str, config: str) -> bool:
    """Whether `config` is a constant family's configuration on a grouped or depthwise step that the
    heuristic does not pick: there it is a tuning candidate alone, and tuning screens out a kernel
    that spills (lab/tune.py). Its sm_90 compile is the fast one: it shows the epilogue compiles.
    (Their map-group chains, one copy of the tile per group of maps, 32 to 128 maps, took 7 to 9
    CPU-seconds each to build in full: 25 of the check's 230.)"""
    spec, epilogue = RESIDUAL_STEPS[step]
    return (spec.group > 1 and families.family_of(config).name in compile_cache.CONSTANT_FAMILIES
            and str(heuristic_config(spec, _ones(spec), epilogue)) != config)
ACTIVATION_SPEC = conv(8, 16, 32, (12, 12), (3, 3), pads=(1, 1, 1, 1))
RESIDUAL_ACTIVATION_CASES = [
    (activation, variant)
    for activation in [*(Activation.plain(op) for op in ACTIVATION_KINDS), Activation("LeakyRelu", 0.3), Activation("Clip", 0.0, 6.0)]
    for variant in ("const_rb", "const_tile", "tc_3xtf32", "tc_3xtf32_b32x64x32_w32x16_s3_k2")
]


def _units_jobs(spec, variant, arch, epilogue=None, fast=False, full=False):
    return compile_cache.variant_keys(spec, variant, arch, epilogue, fast, full=full)


def compile_jobs():
    """compile_cache keys of every compile the tests of this module make, the slowest kinds first."""
    for step, config, arch in RESIDUAL_CASES:
        spec, epilogue = RESIDUAL_STEPS[step]
        yield from _units_jobs(spec, config, arch, epilogue, fast=_tuning_candidate_alone(step, config))
    for activation, variant in RESIDUAL_ACTIVATION_CASES:
        yield from _units_jobs(ACTIVATION_SPEC, variant, "sm_90", Epilogue(activation, residual=True))
    for layer, config, arch in LONG_K_CASES:
        yield from _units_jobs(LONG_K_SPECS[layer][0], config, arch, full=layer == AMPERE_REGISTERS)
    for spec in SHAPES.values():
        for variant in families.FAMILIES:
            if families.unsupported_reason(spec, variant, _ones(spec)) is None:
                for arch in variant_archs(variant):
                    yield from _units_jobs(spec, variant, arch, fast=variant not in compile_cache.CONSTANT_FAMILIES)
    for layer, batch, config, arch in CNN_REPRESENTATIVES:
        yield from _units_jobs(_case_spec(layer, batch), config, arch)
    for layer, config in WIDE_WINDOW_CASES:
        yield from _units_jobs(WIDE_WINDOW_SPECS[layer], config, "sm_90")
    for name, batch, config, arch in CNN_DEPTHWISE_CASES:
        yield from _units_jobs(dataclasses.replace(CNN_SPECS[name], batch=batch), config, arch)
    for name, config, arch, full in CNN_HALF_DEPTHWISE_CASES:
        yield from _units_jobs(CNN_SPECS[name], config, arch, HALF_DEPTHWISE_EPILOGUE, full=full)
    for name, batch, config, arch, full in CNN_HALF_GROUPED_CASES:
        yield from _units_jobs(dataclasses.replace(HALF_GROUPED_SPECS[name], batch=batch), config, arch, HALF_GROUPED_EPILOGUE, full=full)
    for name, config in CNN_NARROW_WGMMA_CASES:
        yield from _units_jobs(NARROW_SPECS[name], config, "sm_90", NARROW_EPILOGUE)
    for step in SHIPPED_STEPS:
        spec, epilogue = SHIPPED_STEPS[step]
        yield from _units_jobs(spec, heuristic_config(spec, _ones(spec), epilogue), "sm_90", epilogue)
    for step, config in TUNING_CASES:
        spec, epilogue = SHIPPED_STEPS[step]
        yield from _units_jobs(spec, config, "sm_90", epilogue, fast=True)
    for variant in EXPLICIT_MAPS:
        yield from _units_jobs(SHAPES["lenet86.conv2"], variant, "sm_90")
    for _, spec, config, epilogue, arch in GEMM_CASES:
        yield compile_cache.key(config.source, gemm_families.defines(spec, config, epilogue), arch)
    for spec in POOL_SPECS.values():
        for arch in ARCHS:
            yield compile_cache.key(pool_kernel.SOURCE, pool_kernel.defines(spec), arch)
    for source, defines, _ in ROW_UNITS.values():
        for arch in ARCHS:
            yield compile_cache.key(source, defines, arch)


STARTED: list[bool] = []  # each start_compiles call's `background`, in order


def start_compiles(config, background: bool = False) -> None:
    """Begin every compile of this module (conftest.py calls this once the suite is collected,
    in the background: on a CPU the other tests leave idle, while they run; it joins the head
    start conftest.py gave them before collection, compile_cache.head_start)."""
    STARTED.append(background)
    compile_cache.use_pytest_cache(config)
    compile_cache.start(compile_jobs(), background=background)


@pytest.fixture(scope="module", autouse=True)
def compiled_up_front(request):
    start_compiles(request.config)  # waits for those begun at collection, then does what is left
    compile_cache.wait()


def test_its_compiles_began_once_the_suite_was_collected():
    # conftest.py's hooks find this module by its path (COMPILE_CHECK): when they did not (the
    # module had moved), its compiles began only here, after the other tests instead of beside them
    assert STARTED[:1] == [True]


@pytest.mark.parametrize(("shape", "variant", "arch"),
                         [(shape, variant, arch) for arch in ARCHS for variant in families.FAMILIES for shape in SHAPES
                          if arch in variant_archs(variant)])
def test_variant_compiles(shape, variant, arch):
    spec = SHAPES[shape]
    reason = families.unsupported_reason(spec, variant, _ones(spec))
    if reason:
        pytest.skip(reason)
    # the resources of a constant-memory family are checked, of the others only that they compile
    for usage in compile_cache.check_variant(spec, variant, arch, fast=variant not in compile_cache.CONSTANT_FAMILIES):
        compile_cache.assert_clean(usage, variant)
        # ptxas for sm_80 reports the __constant__ arrays as bank 3; sm_90's omits them
        if variant in compile_cache.CONSTANT_FAMILIES and 3 in usage.constant_memory:
            assert usage.constant_memory[3] == families.constant_bytes(spec)


def test_fast_checked_sources_have_no_code_for_one_arch_alone():
    # what lets test_variant_compiles compile the families it only compiles for sm_80 alone:
    # sm_80 and sm_90 take the same side of every __CUDA_ARCH__ test in their sources
    sources = {unit.source for spec in SHAPES.values() for variant in families.FAMILIES
               if variant_archs(variant) != ARCHS and families.unsupported_reason(spec, variant, _ones(spec)) is None
               for unit in nvrtc_check.variant_units(spec, variant)}
    assert len(sources) > 5
    for source in sorted(sources):
        code = re.sub(r"//[^\n]*|/\*.*?\*/", "", resources.kernel_source(source), flags=re.DOTALL)
        for line in code.splitlines():
            if "defined(AWAIT_PREVIOUS_GRIDS)" in line:
                continue  # grid_dependency.cuh's waits: sm_90 on alone, where programmatic launch exists
            for test in re.findall(r"(?<!defined\()__CUDA_ARCH\w*(?:\s*[<>=!]+\s*\w+)?", line):
                match = re.fullmatch(r"__CUDA_ARCH__\s*(?:<|>=)\s*(\d+)", test)
                assert match and int(match.group(1)) <= 800, f"{source}: {line.strip()}"


@pytest.mark.parametrize(("step", "config"), TUNING_CASES)
def test_every_configuration_tuning_may_pick_compiles_for_hopper(step, config):
    # Spills are allowed here (tuning skips a kernel that uses local memory); a
    # configuration must compile and stay within the register file. A check that it
    # compiles, not of its resources: NVRTC's fast-compile mode does (see compile_cache).
    spec, epilogue = SHIPPED_STEPS[step]
    for usage in compile_cache.check_variant(spec, config, "sm_90", epilogue, fast=True):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255


@pytest.mark.parametrize("step", list(SHIPPED_STEPS))
def test_the_heuristic_pick_for_each_shipped_step_does_not_spill(step):
    spec, epilogue = SHIPPED_STEPS[step]
    variant = heuristic_config(spec, _ones(spec), epilogue)
    for usage in compile_cache.check_variant(spec, variant, "sm_90", epilogue):
        compile_cache.assert_clean(usage, variant.family)  # a configured name: check by its family


def test_tuning_covers_every_exact_family_that_runs_the_shipped_convs():
    covered = {families.family_of(config).name for _, config in TUNING_CASES}
    exact = {name for name, family in families.FAMILIES.items() if family.exact}
    # the dense families run only Convs whose filter covers the whole map, and wg_3xtf32 groups of 32 input
    # channels (CNN_WGMMA_CASES compile it): the shipped models have neither
    dense = {name for name in exact if name.startswith("dense_")}
    assert covered == exact - dense - {"wg_3xtf32"} and dense


@pytest.mark.parametrize(("layer", "config", "arch"), TC_SIMT_REPRESENTATIVES)
def test_gemm_configurations_for_real_cnn_layers_compile_without_spills(layer, config, arch):
    # this case stands for every case of CNN_REPRESENTATIVES[layer, 32, config, arch]: same code shape
    for usage in compile_cache.check_variant(CNN_SPECS[layer], config, arch):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


@pytest.mark.parametrize(("layer", "batch", "config", "arch"), CNN_DEPTHWISE_CASES)
def test_depthwise_configurations_for_real_cnn_layers_compile_without_spills(layer, batch, config, arch):
    for usage in compile_cache.check_variant(dataclasses.replace(CNN_SPECS[layer], batch=batch), config, arch):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


@pytest.mark.parametrize(("layer", "config", "arch", "full"), CNN_HALF_DEPTHWISE_CASES)
def test_half_depthwise_configurations_for_real_cnn_layers_compile_without_spills(layer, config, arch, full):
    for usage in compile_cache.check_variant(CNN_SPECS[layer], config, arch, HALF_DEPTHWISE_EPILOGUE, full=full):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


def test_half_depthwise_cases_cover_every_depthwise_layer_of_the_suite_linked_and_not():
    depthwise = {layer.name for layer in cnn_layers.LAYERS if layer.group == layer.in_channels}
    assert {name for name, *_ in CNN_HALF_DEPTHWISE_CASES} == depthwise and len(depthwise) == 8
    assert {(config.family, config.links) for _, config, _, _ in CNN_HALF_DEPTHWISE_CASES} == {
        ("dw_fp16", 0), ("dw_fp16", ALL_LINKS), ("dw_bf16", ALL_LINKS)}


@pytest.mark.parametrize(("layer", "batch", "config", "arch", "full"), CNN_HALF_GROUPED_CASES)
def test_half_grouped_configurations_for_real_cnn_layers_compile_without_spills(layer, batch, config, arch, full):
    spec = dataclasses.replace(HALF_GROUPED_SPECS[layer], batch=batch)
    for usage in compile_cache.check_variant(spec, config, arch, HALF_GROUPED_EPILOGUE, full=full):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


def test_half_grouped_cases_cover_every_narrow_grouped_layer_of_the_suite_linked_and_not():
    grouped = {layer.name for layer in cnn_layers.LAYERS if layer.group > 1 and layer.group != layer.in_channels}
    taken = {name for name in grouped if families.FAMILIES["gw_fp16"].configs(CNN_SPECS[name], HALF_GROUPED_EPILOGUE)}
    assert taken == {"resnext50 g32 3x3 128ch 56"}  # groups of 16 maps (RegNet's, ResNeXt's 512) stay on wg_fp16
    assert {name for name, *_ in CNN_HALF_GROUPED_CASES} == set(HALF_GROUPED_SPECS) == taken | {
        "resnext50 stage 2 g32 3x3 256ch 28", "16 channels 8 maps a group 3x3 256->128 14"}
    assert {(config.family, config.links) for _, _, config, _, _ in CNN_HALF_GROUPED_CASES} == {
        ("gw_fp16", 0), ("gw_fp16", ALL_LINKS), ("gw_bf16", ALL_LINKS)}


# K past the 8192-row tap table (TAPS_BY_CHANNEL): selecsls42b's head, 3x3 over 960 channels at 7x7, on both
# archs, and a 7x7 window, the widest the tap mask takes, on sm_80 (where registers ran out for wider ones);
# each family's pick.
LONG_K_SPECS = {
    "3x3x960": (conv(32, 960, 1024, (7, 7), (3, 3), pads=(1, 1, 1, 1)), ARCHS),
    "7x7x168": (conv(8, 168, 64, (20, 20), (7, 7), pads=(3, 3, 3, 3), strides=(2, 2)), ("sm_80",)),
}
AMPERE_REGISTERS = "7x7x168"  # chosen for sm_80's registers: built in full there, its resources read
LONG_K_CASES = [
    (name, families.configure(spec, family), arch)
    for name, (spec, archs) in LONG_K_SPECS.items()
    for family in ("tc_3xtf32", "simt_gemm")  # conv_wgmma.cu has no tap table
    for arch in archs
]


# The wg families on windows wider than 3x3, where each producer copy tests its own tap against the image (TAP_MASK 0):
# the ResNet stem on every tile in FP16 and on the 128-pixel one with Y linked in BF16 (ptxas spilled 4 to 40 bytes of
# the 49-bit tap masks the producers held, 56 registers each at 512 threads a block), wg_3xtf32's 512-thread tiles on
# a 7x7 window over 64 channels, and an 11x11 window (past a bit a tap) over 64 channels: each family's pick and an
# 8-way K split.
WIDE_WINDOW_SPECS = {
    "stem 7x7": CNN_SPECS["resnet stem 3->64 7x7 s2 224"],
    "7x7x64": conv(32, 64, 64, (56, 56), (7, 7), pads=(3, 3, 3, 3)),
    "11x11x64": conv(32, 64, 64, (56, 56), (11, 11), pads=(5, 5, 5, 5)),
}
WIDE_WINDOW_CASES = [
    *(("stem 7x7", f"wg_fp16_b{bm}x{bn}x64_s4") for bm, bn in wgmma.TILES),
    ("stem 7x7", "wg_bf16_b64x128x64_s4_h2"),
    ("7x7x64", "wg_3xtf32_b64x128x32_s3"),
    ("7x7x64", "wg_3xtf32_b128x128x32_s3"),
    *(("11x11x64", families.configure(WIDE_WINDOW_SPECS["11x11x64"], family).name()) for family in ("wg_fp16", "wg_3xtf32")),
    ("11x11x64", "wg_fp16_b128x128x64_s4_k8"),
    ("11x11x64", "wg_3xtf32_b64x128x32_s3_k8"),
]


@pytest.mark.parametrize(("layer", "config"), WIDE_WINDOW_CASES)
def test_wgmma_producers_test_each_copys_tap_on_wide_windows_without_spills(layer, config):
    spec = WIDE_WINDOW_SPECS[layer]
    assert families.unsupported_reason(spec, config, _ones(spec)) is None
    assert {unit.defines["TAP_MASK"] for unit in nvrtc_check.variant_units(spec, config)} == {0}
    for usage in compile_cache.check_variant(spec, config, "sm_90"):
        assert usage.arch == "sm_90a"
        compile_cache.assert_no_local_memory(usage)


@pytest.mark.parametrize(("layer", "batch", "config"), WGMMA_REPRESENTATIVES)
def test_wgmma_configurations_for_real_cnn_layers_compile_for_hopper_without_spills(layer, batch, config):
    # this case stands for every case of CNN_REPRESENTATIVES[layer, batch, config, "sm_90"]: same code shape
    spec = _case_spec(layer, batch)
    for usage in compile_cache.check_variant(spec, config, "sm_90"):
        assert usage.arch == "sm_90a"
        compile_cache.assert_no_local_memory(usage)


@pytest.mark.parametrize(("layer", "config"), CNN_NARROW_WGMMA_CASES, ids=[f"{layer} {config}" for layer, config in CNN_NARROW_WGMMA_CASES])
def test_narrow_wgmma_configurations_compile_for_hopper_without_spills(layer, config):
    assert families.unsupported_reason(NARROW_SPECS[layer], config, _ones(NARROW_SPECS[layer]), NARROW_EPILOGUE) is None
    for usage in compile_cache.check_variant(NARROW_SPECS[layer], config, "sm_90", NARROW_EPILOGUE):
        assert usage.arch == "sm_90a"
        compile_cache.assert_no_local_memory(usage)


def test_the_narrow_cases_cover_every_narrow_tile_in_both_formats_linked_and_not_split_and_not():
    narrow_tiles = {(maps, pixels) for maps in wgmma.NARROW_MAPS for pixels in wgmma.NARROW_PIXELS}
    covered = {(config.family, config.block[:2], config.links, config.splits > 1) for _, config in CNN_NARROW_WGMMA_CASES}
    for family, link_sets in (("wg_fp16", (0, ALL_LINKS)), ("wg_bf16", (ALL_LINKS,))):
        for links in link_sets:
            assert {tile for f, tile, linked, split in covered if (f, linked, split) == (family, links, False)} == narrow_tiles
            assert {tile[0] for f, tile, linked, split in covered if (f, linked, split) == (family, links, True)} == set(wgmma.NARROW_MAPS)
    real = {name for name in NARROW_SPECS if name in CNN_SPECS}
    assert real == {"mobilenetv2 1x1 96->24 56", "resnext50 g32 3x3 512ch 14", "regnety800mf gw16 3x3 144ch 28", "regnety800mf gw16 3x3 320ch 14"}


def test_wgmma_gemm_compiles_for_hopper_alone():
    spec = CNN_SPECS[CNN_WGMMA_CASES[0][0]]
    with pytest.raises(nvrtc_check.CompileError, match="needs sm_90a"):
        nvrtc_check.check_source("conv_wgmma.cu", nvrtc_check.variant_units(spec, "wg_3xtf32")[0].defines, "conv_wgmma", "sm_90")


@pytest.mark.parametrize(("layer", "config", "arch"), LONG_K_CASES)
def test_a_long_k_gemm_reads_its_taps_by_channel_without_spills(layer, config, arch):
    spec, _ = LONG_K_SPECS[layer]
    units = nvrtc_check.variant_units(spec, config)
    assert all(unit.defines.get("TAPS_BY_CHANNEL") == 1 for unit in units)
    for usage in compile_cache.check_variant(spec, config, arch, full=layer == AMPERE_REGISTERS):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


def test_every_real_cnn_case_has_a_representative_of_its_code_shape():
    represented = [case for cases in CNN_REPRESENTATIVES.values() for case in cases]
    assert sorted(represented, key=str) == sorted(CNN_GEMM_CASES, key=str)
    assert {families.family_of(config).name for _, _, config, _ in represented} == set(REPRESENTED_FAMILIES)
    for representative, cases in CNN_REPRESENTATIVES.items():
        assert all(_case_code_shape(case) == _case_code_shape(representative) for case in cases)
    assert len(CNN_REPRESENTATIVES) < len(represented)
    assert len(TC_SIMT_REPRESENTATIVES) + len(WGMMA_REPRESENTATIVES) == len(CNN_REPRESENTATIVES)


def _macros_from(constants, text: str) -> set[str]:
    """`constants` and every macro the source defines from one of them, however indirectly."""
    names = set(constants)
    definitions = re.findall(r"^\s*#\s*define\s+(\w+)(?:\([^)]*\))?[ \t]+(.*)$", text, re.MULTILINE)
    while grown := {name for name, body in definitions if name not in names and names & set(re.findall(r"\w+", body))}:
        names |= grown
    return names


def _code_picked_by(constants, family):
    """(source, line number, kind, line) wherever one of `constants`, or a macro made from them, picks
    code (#if, #elif, if constexpr), bounds a for loop, or is all a run-time `if` reads (a test of
    macros alone may be folded) in the kernels of `family` on the real CNN layers."""
    sources = {unit.source for layer, batch, config, _ in CNN_GEMM_CASES
               if families.family_of(config).name == family for unit in nvrtc_check.variant_units(_case_spec(layer, batch), config)}
    assert sources
    return [found for source in sorted(sources) for found in _code_picked_in(constants, source)]


def _code_picked_in(constants, source: str):
    """(source, line number, kind, line) wherever one of `constants`, or a macro made from them, picks code, bounds a
    for loop, or is all a run-time `if` reads in kernels/`source` (see _code_picked_by)."""
    found = []
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", resources.kernel_source(source), flags=re.DOTALL)
    tainted = _macros_from(constants, code)
    for number, line in enumerate(code.splitlines(), 1):
        words = set(re.findall(r"\w+", line))
        if re.match(r"\s*#\s*(if|elif)\b", line) or "constexpr" in words and re.search(r"\bif\s+constexpr\b", line):
            if words & tainted:
                found.append((source, number, "picks code", line.strip()))
        if loop := re.search(r"\bfor\s*\([^;]*;([^;]*);", line):
            if set(re.findall(r"\w+", loop.group(1))) & tainted:
                found.append((source, number, "bounds a loop", line.strip()))
        if re.search(r"\bif\s*\(", line) and words & tainted:
            condition = re.search(r"\bif\s*\((.*)\)", line).group(1)
            if all(word.isupper() for word in re.findall(r"[A-Za-z_]\w*", condition)):
                found.append((source, number, "is all a run-time test reads", line.strip()))
    return found


@pytest.mark.parametrize("family", REPRESENTED_FAMILIES)
def test_shape_constants_only_do_arithmetic(family):
    # What lets one compile stand for a code shape: no shape constant picks code (#if, if
    # constexpr) or bounds a loop the compiler could unroll. A run-time `if` on them may
    # still be folded where all its operands are constants; none of these kernels has one.
    for source, number, kind, line in _code_picked_by(SHAPE_CONSTANTS, family):
        pytest.fail(f"{source} line {number}: a shape constant {kind}: {line}")


@pytest.mark.parametrize("family", REPRESENTED_FAMILIES)
def test_k_slices_pick_code_only_as_one_or_more(family):
    # What lets one compile stand for every K split count of a code shape: KSLICES picks code only
    # by being 1 or not, and bounds one loop, the reduce kernel's, which the representatives
    # compile for every count (test_every_k_split_count_is_compiled_on_each_arch).
    for source, number, kind, line in _code_picked_by({K_SPLIT}, family):
        if kind == "picks code":
            assert re.fullmatch(r"#\s*if\s+KSLICES\s*==\s*1", line), f"{source} line {number}: {line}"
        else:
            assert kind == "bounds a loop" and line in REDUCE_LOOPS, f"{source} line {number}: KSLICES {kind}: {line}"


def test_every_k_split_count_is_compiled_on_each_arch():
    everything = {_split_coverage(case) for cases in CNN_REPRESENTATIVES.values() for case in cases}
    assert {_split_coverage(case) for case in CNN_REPRESENTATIVES} == everything
    assert {split for _, _, split in everything} > {1, 2}


EXPLICIT_MAPS = ["const_mo_m1", "const_mo_m3", "const_mo_m16"]


@pytest.mark.parametrize("case", GEMM_CASES, ids=[case[0] for case in GEMM_CASES])
def test_every_gemm_configuration_compiles_without_spills(case):
    _, spec, config, epilogue, arch = case
    usage = compile_cache.check_source(config.source, gemm_families.defines(spec, config, epilogue), config.function, arch)
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
    compile_cache.assert_no_local_memory(usage)


def test_every_gemm_family_and_heuristic_pick_is_compiled():
    compiled = {(label.split()[0], config.name()) for label, _, config, _, _ in GEMM_CASES}
    for step, (spec, epilogue) in GEMM_STEPS.items():
        assert (step.split()[0], gemm_families.heuristic_config(spec, epilogue).name()) in compiled or step.startswith("bench")
    assert {case[2].family for case in GEMM_CASES} == set(gemm_families.FAMILIES)


@pytest.mark.parametrize("variant", EXPLICIT_MAPS)
def test_explicit_maps_per_thread_compile_without_spills(variant):
    # 16 is not a multiple of 3: the last map group is shorter
    [usage] = compile_cache.check_variant(SHAPES["lenet86.conv2"], variant, "sm_90")
    compile_cache.assert_no_local_memory(usage)


def test_compile_error_carries_the_nvrtc_log():
    with pytest.raises(nvrtc_check.CompileError, match="undefined"):
        nvrtc_check.check_source("conv_const.cu", {"C": 1}, "conv_const", "sm_90")  # M, H, ... missing


def test_options_are_d_macros_after_the_language_standard():
    options = cuda.nvrtc_options({"C": 4, "HAS_BIAS": True, "PADDED": False})
    assert options[: len(cuda.BASE_OPTIONS)] == cuda.BASE_OPTIONS
    assert options[-3:] == ("-DC=4", "-DHAS_BIAS=1", "-DPADDED=0")
    assert not any("fast_math" in o for o in options)


def test_parse_ptxas_log():
    log = """ptxas info    : 0 bytes gmem, 800 bytes cmem[3]
ptxas info    : Compiling entry function 'conv_const' for 'sm_80'
ptxas info    : Function properties for conv_const
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers, 372 bytes cmem[0], 8 bytes cmem[2]
"""
    usage = nvrtc_check.parse_ptxas_log(log, "sm_80")["conv_const"]
    assert (usage.registers, usage.stack_frame, usage.spill_stores, usage.spill_loads) == (30, 16, 8, 4)
    assert usage.constant_memory == {0: 372, 2: 8, 3: 800}
    assert usage.spills == 12


# --- pooling: the ResNet stem's and head's pools, and the semantics kernels/pool.cu must cover ---

POOL_SPECS = {
    "resnet stem maxpool 3x3 s2 p1": PoolSpec(MAX, False, 64, (112, 112), (3, 3), (2, 2), pads=(1, 1, 1, 1)),
    "resnet head global average 7x7": PoolSpec(AVERAGE, True, 512, (7, 7), (7, 7)),
    "global max over a block-sized plane": PoolSpec(MAX, True, 64, (112, 112), (112, 112)),
    "global average over a warp-sized plane": PoolSpec(AVERAGE, True, 3, (32, 32), (32, 32)),
    "average asymmetric pads counted, ceil": PoolSpec(AVERAGE, False, 5, (17, 13), (3, 2), (2, 3), pads=(0, 1, 2, 1), ceil_mode=True,
                                                      count_include_pad=True),
    "max dilated 3x3 d2": PoolSpec(MAX, False, 3, (19, 21), (3, 3), (1, 2), (2, 2), pads=(2, 1, 2, 1)),
    "average 1x1 window": PoolSpec(AVERAGE, False, 2, (5, 7), (1, 1), (2, 2)),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pool", list(POOL_SPECS))
def test_every_pool_configuration_compiles_without_spills(pool, arch):
    spec = POOL_SPECS[pool]
    usage = compile_cache.check_source(pool_kernel.SOURCE, pool_kernel.defines(spec), pool_kernel.function_name(spec), arch)
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 64  # a thread holds an index and one accumulator
    compile_cache.assert_no_local_memory(usage)


def test_residual_cases_built_fast_are_tuning_candidates_alone():
    # the heuristic's pick is built in full wherever it is (const_rb on mobilenetv2's depthwise layer)
    fast = {(step, config) for step, config, _ in RESIDUAL_CASES if _tuning_candidate_alone(step, config)}
    assert len(fast) == 3
    for step, config in fast:
        spec, epilogue = RESIDUAL_STEPS[step]
        assert config in {str(candidate) for candidate in families.tuning_configs(spec, _ones(spec), epilogue)}
    picks = {(step, str(heuristic_config(spec, _ones(spec), epilogue))) for step, (spec, epilogue) in RESIDUAL_STEPS.items()}
    assert ("mobilenetv2 dw 3x3 32ch 112+relu6", "const_rb_t16x1_m1") in picks and not fast & picks


def test_residual_cases_cover_every_fusing_family_and_split_k():
    covered = {families.family_of(config).name for _, config, _ in RESIDUAL_CASES}
    assert covered == set(RESIDUAL_FAMILIES)
    assert any(config.endswith("_k4") for _, config, _ in RESIDUAL_CASES)
    assert any(RESIDUAL_STEPS[step][1].pool and not RESIDUAL_STEPS[step][1].pool_first for step, _, _ in RESIDUAL_CASES)


@pytest.mark.parametrize(("step", "config", "arch"), RESIDUAL_CASES)
def test_residual_epilogues_compile_without_spills(step, config, arch):
    spec, epilogue = RESIDUAL_STEPS[step]
    for usage in compile_cache.check_variant(spec, config, arch, epilogue, fast=_tuning_candidate_alone(step, config)):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


@pytest.mark.parametrize(("activation", "variant"), RESIDUAL_ACTIVATION_CASES, ids=lambda v: getattr(v, "suffix", v))
def test_every_activation_with_a_residual_compiles_without_spills(activation, variant):
    for usage in compile_cache.check_variant(ACTIVATION_SPEC, variant, "sm_90", Epilogue(activation, residual=True)):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        compile_cache.assert_no_local_memory(usage)


# --- reductions, normalisations and batched MatMul: inner and strided rows, cached and re-read, staged axes ---

# a LayerNormalization over NCHW's channels, linked channel-last (ops/reduction/linked_kernel.py): ConvNeXt's four
# stages in both formats and every link, and in FP16 with both linked: 40 channels (2 lanes a pixel, one of 2 pieces and
# one of 3), 8 (one lane, one piece) and MAX_CHANNELS (32 lanes of 8 pieces: the most registers)
CONVNEXT_CHANNELS = (96, 192, 384, 768)
LINKED_NORM_SHAPES = ((96, 56), (192, 28), (384, 14), (768, 7), (40, 9), (8, 5), (MAX_CHANNELS, 7))


def _reduce_units(spec: ReduceSpec) -> dict:
    return {f"{spec.op} stage {i}": (reduction_kernel.SOURCE, reduction_kernel.reduce_defines(spec, i), "reduce_rows")
            for i in range(len(spec.stages))}


def _row_units() -> dict:
    units = {}
    units |= {f"reduce max over C, H of NCHW ({k})": v for k, v in _reduce_units(
        ReduceSpec("max", (1, 96, 7, 7), (1, 3), True, (Rows(96 * 7, 7, 1), Rows(1, 96, 7 * 7)))).items()}
    units["reduce sum of a 40 K row"] = (reduction_kernel.SOURCE, reduction_kernel.reduce_defines(
        ReduceSpec("sum", (1, 40000), (1,), False, (Rows(1, 40000, 1),)), 0), "reduce_rows")
    # an L2 norm over two stages (its squares in the first, its root in the last), a product and a min
    units |= {f"reduce l2 over C, H of NCHW ({k})": v for k, v in _reduce_units(
        ReduceSpec("l2", (1, 96, 7, 7), (1, 3), True, (Rows(96 * 7, 7, 1), Rows(1, 96, 7 * 7)))).items()}
    units["reduce prod over C of NCHW"] = (reduction_kernel.SOURCE, reduction_kernel.reduce_defines(
        ReduceSpec("prod", (1, 12, 5, 5), (1,), True, (Rows(1, 12, 25),)), 0), "reduce_rows")
    units["reduce min of a row"] = (reduction_kernel.SOURCE, reduction_kernel.reduce_defines(
        ReduceSpec("min", (1, 1000), (1,), True, (Rows(1, 1000, 1),)), 0), "reduce_rows")
    for name, spec in {"softmax over classes": SoftmaxSpec(False, (1, 1000), 1, 2),
                       "softmax over C of NCHW": SoftmaxSpec(False, (1, 19, 9, 11), 1, 2),
                       "logsoftmax over H, inner 3": SoftmaxSpec(True, (1, 3, 70, 3), 2, 3),
                       "logsoftmax of a 100 K row (re-read)": SoftmaxSpec(True, (1, 100000), 1, 2)}.items():
        units[name] = (reduction_kernel.SOURCE, reduction_kernel.softmax_defines(spec), "softmax_rows")
    for name, spec in {"layernorm over NHWC's 96 channels": NormSpec(LAYER, (1, 56, 56, 96), Rows(3136, 96, 1), 1e-6, 1, 1, 96, 3),
                       "layernorm over NCHW's 768 channels (strided)": NormSpec(LAYER, (1, 768, 7, 7), Rows(1, 768, 49), 1e-6, 1, 1, 768, 1),
                       "groupnorm 32 groups of 64 x 56 x 56 (re-read)": NormSpec(GROUP, (1, 2048, 56, 56), Rows(32, 64 * 3136, 1), 1e-5, 32,
                                                                                 3136, 2048),
                       "instancenorm 17 x 19": NormSpec(INSTANCE, (1, 8, 17, 19), Rows(8, 323, 1), 1e-5, 8, 323, 8)}.items():
        units[name] = (reduction_kernel.SOURCE, reduction_kernel.norm_defines(spec), "normalize_rows")
    for channels, size in LINKED_NORM_SHAPES:
        spec = NormSpec(LAYER, (1, channels, size, size), Rows(1, channels, size * size), 1e-6, 1, 1, channels, 1)
        for fmt in ("fp16", "bf16") if channels in CONVNEXT_CHANNELS else ("fp16",):
            for links in (INPUT, OUTPUT, INPUT | OUTPUT) if channels in CONVNEXT_CHANNELS else (INPUT | OUTPUT,):
                config = LinkedNorm(f"cuda_{fmt}", links)
                units[f"layernorm over NCHW's {channels} channels, {config.name()}"] = (
                    linked_norm_kernel.SOURCE, linked_norm_kernel.defines(spec, config), linked_norm_kernel.FUNCTION)
    for name, spec in {"matmul batched both at run time": matmul_kernel.MatMulSpec((2, 3, 17, 33), (2, 3, 33, 9), False, False),
                       "matmul batched, rank-6 A, B broadcast": matmul_kernel.MatMulSpec((2, 2, 3, 4, 8, 5), (1, 1, 1, 1, 5, 6), False, True),
                       "matmul batched, constant A": matmul_kernel.MatMulSpec((3, 12), (2, 3, 12, 7), True, False),
                       "matmul batched, attention scores": matmul_kernel.MatMulSpec((32, 6, 197, 64), (32, 6, 64, 197), False, False),
                       "matmul batched, attention values": matmul_kernel.MatMulSpec((32, 6, 197, 197), (32, 6, 197, 64), False, False)}.items():
        for variant, (source, function) in matmul_kernel.BATCHED_SOURCES.items():
            units[f"{name} {variant}"] = (source, matmul_kernel.batched_defines(spec, None, variant), function)
    return units


ROW_UNITS = _row_units()


def test_a_linked_normalisations_shape_constants_only_do_arithmetic():
    # each node compiles its own, but what code a channel count runs is its geometry's alone (PIXEL_LANES, PER):
    # C and PLANE address the pieces and test which exist
    assert _code_picked_in({"C", "PLANE"}, linked_norm_kernel.SOURCE) == []


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("unit", list(ROW_UNITS))
def test_every_reduction_and_batched_matmul_kernel_compiles_without_spills(unit, arch):
    source, defines, function = ROW_UNITS[unit]
    usage = compile_cache.check_source(source, defines, function, arch)
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 128
    compile_cache.assert_no_local_memory(usage)
