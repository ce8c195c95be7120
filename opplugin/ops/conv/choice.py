"""Which CUDA variant a Conv node gets when the user names none.

1. The tuning cache. `opplugin tune MODEL` times every FP32-exact configuration
   of each Conv on this GPU and records the fastest that passed its check (see
   `opplugin.ops.conv.tuning_cache`: one JSON file keyed by GPU name, node shape and fused
   epilogue, batch bucket and opplugin version). When the cache has an entry for
   this node (its own batch bucket, else the nearest tuned one within a factor
   of 16) and that variant can still run the node, it is the choice. (A run in fp16 or
   bf16 reads its own precision's entries, which `tune --precision` writes, through
   `cached_config` from ConvPlugin.precision_variant.)

2. Otherwise a heuristic, which times nothing. A Conv that is a dense layer (its filter
   covers its whole input map: the squeeze and excite Convs of SE blocks) runs on the
   Gemm kernel the Gemm heuristic gives that layer (`dense_gemv` at batch 1-16, see
   ops/conv/families/dense.py), unless its epilogue has no place there. Otherwise it prefers the families in the
   order the seeds' optimisations build on each other, most refined first, and
   takes the first one that can run the node with its fused epilogue, if any:
   register tiles of rows x columns x maps (`const_tile`), then of rows x
   maps (`const_rb`), then several maps per thread (`const_mo`),
   then one output per thread from constant memory (`const`), then the
   tensor-core implicit GEMM (`tc_3xtf32`, FP32-exact by measurement, weights
   in global memory), the FP32 SIMT implicit GEMM (`simt_gemm`), then
   `baseline`, which runs every 2-D Conv (also with weights computed at run
   time). A layer with 16 maps or more and a long K, or too few outputs at the
   planned batch to give the constant-memory families a block per SM (see
   `prefers_tensor_cores`), tries the GEMMs first: there their reuse and
   grids beat the constant-memory families, whose strength is few maps; the SIMT
   GEMM goes first where K is short (`SIMT_MAX_K`), the wgmma GEMM (`wg_3xtf32`, Hopper
   alone) before `tc_3xtf32` on the widest layers (`prefers_wgmma`). Depthwise layers try
   `const_rb` first, then the `depthwise` family (weights in global memory,
   any filter size), the other way round where the constant-memory grid is short
   of a block an SM; other grouped layers try `grouped` (narrow groups), the
   SIMT GEMM, then the constant-memory families (`GROUPED_PREFERENCE`), the
   SIMT GEMM first for groups of 32 maps or more. A
   family gives the configuration its `configs()` lists first: the one its author expects to be fastest without spilling. When no
   family fuses the epilogue, the same order picks a plain kernel and the
   epilogue follows as CuPy array operations. Where the pick splits K, the cost
   model (cost.py) weighs the split's second launch against what it saves, with
   the host's launch cost only when no CUDA graph replays the kernels (`graphed`, which the
   runner says); where the
   GEMM's pick is short of one wave of blocks, the model ranks its other tiles too.

Both give a `Config`; the cache's names are parsed here, where they come in.
"""
from __future__ import annotations

import math

from ...core.number_formats import FP32
from ...gpu.device import Device
from ...errors import PluginError
from .tuning_cache import CacheKey, key_for, lookup
from . import cost, families
from .epilogue import NONE, Epilogue
from .families.dense import dense_family, is_dense
from .families.gemm import k_dim
from .families.pipelined import PipelinedConfig, columns, multiprocessors
from .families.wgmma import LONG_K
from .spec import ConvSpec

PREFERENCE = ("const_tile", "const_rb", "const_mo", "const", "tc_3xtf32", "simt_gemm", "baseline")
# The GEMMs come first from this many output maps (per group) where K is this long or the
# constant-memory families' grid would leave SMs idle. With a long K their operand reuse wins at
# any size; at batch 1 the constant families give too few threads, each with a long chain of
# multiply-adds. Graphed on an H200 at batch 1: DenseNet's 1x1 96->128 at 56x56 ran 50 µs on
# const_tile and 8.9 on tc_3xtf32, MobileNetV2's 1x1 96->24 at 56x56 29 and 4.3, RegNetY's 1x1
# s2 32->64 (K = 32) 17 and 4.0 on simt_gemm (tools/pick_study.py).
TENSOR_CORE_MIN_MAPS = 16
TENSOR_CORE_MIN_K = 64
# A constant-memory block's outputs (256 threads of 2x2 pixels x 16 maps, const_tile's usual
# tile): a layer with fewer outputs than this per SM gives those families less than a block an SM.
CONSTANT_BLOCK_OUTPUTS = 256 * 64
# Up to this GEMM K (a 1x1 layer's input channels) the FP32 SIMT GEMM goes before the tensor cores:
# ResNet's 1x1 64->256 at 56x56, batch 32, ran 0.115 ms on simt_gemm and 0.156 on tc_3xtf32 (H100),
# whose three MMAs per tile and 32-deep slices have too short a K loop to hide their cost.
SIMT_MAX_K = 64
# On Hopper (where wg_3xtf32 runs; it declines elsewhere and tc_3xtf32 follows) the wgmma GEMM goes
# first from this many maps a group, where each input value meets enough multiply-adds to repay its
# channel-last copy (three passes over the input), and where the batch has enough output pixels or
# K is long enough to split (wgmma_gemm.LONG_K). On an H200 (bench --suite cnn, graphed, ms,
# wg_3xtf32 then tc_3xtf32): at batch 32 VGG's 512->512 at 14x14 0.294 and 0.607, ResNet's 128->128
# at 28x28 0.094 and 0.158, 64->64 at 56x56 (576 multiply-adds an input value) 0.123 and 0.170, but
# its 1x1 s2 256->512 (128 an input value) 0.184 and 0.156; at batch 1 VGG's 512->512 (196 pixels,
# K 4608) 0.020 and 0.036, ResNet's 256->256 0.015 and 0.016, but the MNIST 32->64 at 14x14 (K 288)
# 0.010 and 0.008.
WGMMA_MIN_MAPS = 64
WGMMA_MIN_COLUMNS = 32 * 7 * 7
WGMMA_MIN_REUSE = 256
# ... and, launched from a CUDA graph, on a short grid of enough multiply-adds with a K long enough to
# split, where its 64-map tiles split K to fill the SMs: at batch 1 on an H200 (graphed, µs, the new
# default then tc_3xtf32's) ResNet's 128->128 at 28x28 10.4 and 14.8, ConvNeXt-T's MLP 384->1536 and
# 1536->384 at 14x14 12.7 and 16.6, 11.6 and 15.6, 768->3072 at 7x7 12.0 and 15.7; every new default
# within 1.03x of the best exact variant. Launched eagerly, its extra launch (the channel-last copy)
# and scratch cost the host more than that: ConvNeXt-T at batch 1 ran 5.8 ms eager against 3.5.
WGMMA_MIN_MACS = 2**25
WGMMA_MIN_SPLIT_K = 384
# Depthwise layers (one map per group) ran fastest on const_rb's row tiles on an H100:
# MobileNetV2's 3x3 32-channel layer at 112x112, 0.046 against const_tile's 0.075 ms at batch 32.
# Wider ones, whose filters outgrow constant memory or whose map groups make too much code, take
# `depthwise`, which stages each block's filters in shared memory.
DEPTHWISE_PREFERENCE = ("const_rb", "depthwise", "const_tile", "const_mo", "const", "baseline")
# ... but where that grid is short of a block an SM (constant_grid_short), `depthwise` goes first: that
# layer at batch 1 on an H200 (graphed) ran 2.77 µs there against 3.86 on const_rb (bench --suite cnn).
SHORT_GRID_DEPTHWISE_PREFERENCE = ("depthwise", *(name for name in DEPTHWISE_PREFERENCE if name != "depthwise"))
# Grouped layers (more than one input channel per group): `grouped` (up to 32 channels a group:
# the depthwise kernel, a block's maps sharing their group's input patches), then the SIMT
# GEMM's FP32 FMAs, whose small tiles waste less of a narrow group than the tensor cores' 32-row ones.
GROUPED_PREFERENCE = ("grouped", "simt_gemm", "const_tile", "const_rb", "const_mo", "const", "tc_3xtf32", "baseline")
# ... but groups of this many maps or more fill the SIMT GEMM's tiles: on an H100 at batch 32, ResNeXt-50's
# 1024-channel 3x3 (groups of 32) ran 45 µs there and 64 on `grouped` at its best. Groups of 16 stay
# on `grouped`, whose threads compute 4 maps each (ops/conv/families/depthwise.py): there RegNetY-800MF's 144-channel
# 3x3 ran 55 µs against the SIMT GEMM's 59, ResNeXt-50's 512-channel one 53 against 53 at batch 32,
# and at batch 1, 6.9 and 5.0 µs against 7.2 and 7.3.
GROUPED_GEMM_MIN_MAPS = 32


def constant_grid_short(spec: ConvSpec, sms: int) -> bool:
    """Whether the constant-memory families' grid has fewer blocks than the GPU has SMs."""
    outputs = spec.batch * spec.out_channels * math.prod(spec.out_size)
    return outputs < sms * CONSTANT_BLOCK_OUTPUTS


def prefers_tensor_cores(spec: ConvSpec) -> bool:
    """Whether the GEMMs go before the constant-memory families (see TENSOR_CORE_MIN_MAPS)."""
    enough_k = k_dim(spec) >= TENSOR_CORE_MIN_K or constant_grid_short(spec, multiprocessors())
    return spec.group == 1 and spec.out_channels >= TENSOR_CORE_MIN_MAPS and enough_k


def preference(spec: ConvSpec, epilogue: Epilogue = NONE, graphed: bool = True) -> tuple[str, ...]:
    """The families in the order the heuristic tries them; `graphed`: the kernels will be launched
    from CUDA graphs (see prefers_wgmma)."""
    if is_dense(spec) and spec.group == 1:
        return (dense_family(spec, epilogue), *general_preference(spec, graphed))
    return general_preference(spec, graphed)


def prefers_wgmma(spec: ConvSpec, graphed: bool = True) -> bool:
    """Whether the wgmma GEMM goes before tc_3xtf32 (see WGMMA_MIN_MAPS); a short grid counts for
    it only where `graphed` (launched from CUDA graphs, see WGMMA_MIN_MACS)."""
    maps = spec.out_channels // spec.group
    reuse = maps * k_dim(spec) * math.prod(spec.out_size) / (spec.in_channels * math.prod(spec.in_size))
    macs = spec.out_channels * k_dim(spec) * columns(spec)
    short_grid_gain = graphed and macs >= WGMMA_MIN_MACS and k_dim(spec) >= WGMMA_MIN_SPLIT_K
    enough_work = columns(spec) >= WGMMA_MIN_COLUMNS or k_dim(spec) >= LONG_K or short_grid_gain
    return maps >= WGMMA_MIN_MAPS and reuse >= WGMMA_MIN_REUSE and enough_work


def general_preference(spec: ConvSpec, graphed: bool = True) -> tuple[str, ...]:
    if prefers_tensor_cores(spec):
        if k_dim(spec) <= SIMT_MAX_K:
            first = ("simt_gemm", "tc_3xtf32")
        else:
            first = ("wg_3xtf32", "tc_3xtf32", "simt_gemm") if prefers_wgmma(spec, graphed) else ("tc_3xtf32", "simt_gemm")
        return (*first, *(name for name in PREFERENCE if name not in first))
    if spec.group > 1 and spec.in_channels == spec.group:
        return SHORT_GRID_DEPTHWISE_PREFERENCE if constant_grid_short(spec, multiprocessors()) else DEPTHWISE_PREFERENCE
    if spec.group > 1:
        if spec.out_channels // spec.group >= GROUPED_GEMM_MIN_MAPS:
            return ("simt_gemm", *(name for name in GROUPED_PREFERENCE if name != "simt_gemm"))
        return GROUPED_PREFERENCE
    return PREFERENCE


def first_fitting(spec: ConvSpec, order, weights, epilogue: Epilogue = NONE) -> families.Config | None:
    """The pick of the first family of `order` (names) that can run this node with this epilogue."""
    for name in order:
        config, reason = families.checked(spec, families.FAMILIES[name], weights, epilogue)
        if reason is None:
            return config
    return None


def heuristic_config(spec: ConvSpec, weights, epilogue: Epilogue, graphed: bool = True) -> families.Config:
    """The heuristic's pick (see the module); `graphed`: launched from CUDA graphs, where the host's
    cost of a launch does not count."""
    order = preference(spec, epilogue, graphed)
    # when none fuses the epilogue, the plain kernel runs and the epilogue follows in CuPy
    config, fused = first_fitting(spec, order, weights, epilogue), epilogue
    if config is None:
        config, fused = first_fitting(spec, order, weights), NONE
    if config is None:
        raise PluginError(f"no CUDA variant can run this Conv ({spec})")
    return least_cost_split(spec, config, weights, fused, graphed)


def least_cost_split(spec: ConvSpec, config: families.Config, weights, epilogue: Epilogue, graphed: bool) -> families.Config:
    """The family's pick or another of its configurations, whichever the cost model (cost.py)
    predicts fastest: the same tile with less K split (a split is a second launch, which costs
    the host more than it saves at small batches unless a CUDA graph launches it), and where the
    pick's grid is short of one wave, the family's other tiles too (their order was measured on
    grids of several waves; on a short one, a smaller tile gives more blocks)."""
    if not isinstance(config, PipelinedConfig):
        return config  # no second launch to weigh (a dense Gemm's `k` splits K over the warps of one block)
    sms = multiprocessors()
    candidates = cost.split_alternatives(config)
    if cost.under_one_wave(spec, config, sms):
        for other in families.FAMILIES[config.family].configs(spec, epilogue):
            candidates += cost.split_alternatives(other)
    candidates = [c for c in dict.fromkeys(candidates) if families.unsupported_reason(spec, c, weights, epilogue) is None]
    return cost.cheapest(spec, candidates, sms, graphed) if len(candidates) > 1 else config


def nonfinite_exact_config(spec: ConvSpec, weights) -> families.Config:
    """The heuristic's order without the 3xTF32 GEMMs (an infinite input comes out NaN there),
    the SIMT implicit GEMM before `baseline`: the exact path's variant for such chunks."""
    order = [name for name in preference(spec) if not getattr(families.FAMILIES[name], "split", False)]
    order.insert(order.index("baseline"), "implicit_gemm")
    config = first_fitting(spec, order, weights)
    if config is None:
        raise PluginError(f"no NaN/Inf-exact CUDA variant can run this Conv ({spec})")
    return config


def cached_config(spec: ConvSpec, weights, epilogue: Epilogue, device: Device, precision: str = FP32) -> families.Config | None:
    """The tuned choice for this node on this GPU in `precision` (`tune --precision`), if the cache
    has one that still runs it."""
    choice = lookup(tuning_key(spec, epilogue, device.name, precision=precision))
    if choice is None:
        return None
    config, reason = families.checked(spec, choice.variant, weights, epilogue)  # a name that no longer parses: no choice
    return None if reason else config


def choose_config(spec: ConvSpec, weights, epilogue: Epilogue, device: Device, graphed: bool = True) -> families.Config:
    """The configuration for this node on this device: tuned, else the heuristic's (for kernels
    launched from CUDA graphs, or eagerly: `graphed`)."""
    return cached_config(spec, weights, epilogue, device) or heuristic_config(spec, weights, epilogue, graphed)


def _dims(values) -> str:
    return "x".join(str(int(v)) for v in values)


def shape_signature(spec: ConvSpec, epilogue: Epilogue) -> str:
    """Every ConvSpec field except the batch, and the epilogue, as one stable string:
    "c1 m4 in86x86 k7x7 s1x1 d1x1 p0x0x0x0 g1 bias +relu+maxpool2"."""
    parts = [
        f"c{spec.in_channels}",
        f"m{spec.out_channels}",
        f"in{_dims(spec.in_size)}",
        f"k{_dims(spec.kernel)}",
        f"s{_dims(spec.strides)}",
        f"d{_dims(spec.dilations)}",
        f"p{_dims(spec.pads)}",
        f"g{spec.group}",
        "bias" if spec.has_bias else "nobias",
    ]
    return " ".join(parts) + (f" {epilogue.signature}" if epilogue.signature else "")


def tuning_key(spec: ConvSpec, epilogue: Epilogue, gpu: str, version: str | None = None, precision: str = FP32) -> CacheKey:
    """The tuning cache's key of this Conv step (its batch bucket from spec.batch) on `gpu`, run in `precision`."""
    return key_for(shape_signature(spec, epilogue), spec.batch, gpu, version, precision)
