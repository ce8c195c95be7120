"""Every CUDA Conv variant compiles with NVRTC for sm_80 and sm_90, without a GPU.

Runs in CI: cuda-bindings' NVRTC turns each specialised source into a cubin and
ptxas -v reports its resources. The constant-memory variants must not spill.
Every distinct compile the tests below ask for is done once, up front, in a
pool of processes (`compiled_up_front`); each test then reads its reports.
"""
from __future__ import annotations

import numpy as np
import pytest

from opplugin import cuda
from opplugin.lab import cnn_layers, nvrtc_check
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config
from onnx_builders import conv_spec as conv
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.activation import KINDS as ACTIVATION_KINDS, Activation
from opplugin.ops.gemm import families as gemm_families
from opplugin.ops.gemm.epilogue import NONE as GEMM_NONE, GemmEpilogue
from opplugin.ops.gemm.spec import GemmSpec
from opplugin.ops.pool import kernel as pool_kernel
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

CONSTANT_FAMILIES = [name for name, family in families.FAMILIES.items() if family.constant_weights]

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
                *(t.name() for t in gemm_families.TILES), "rowwarp_r1", "rowwarp_r2", "rowwarp_r4"]
GEMM_ACTIVATIONS = [Activation.plain(op) for op in ACTIVATION_KINDS] + [Activation("LeakyRelu", 0.3), Activation("Clip", -1.0)]


def _gemm_cases():
    """(label, spec, config, epilogue, arch) of every Gemm compile the tests ask for."""
    for step, (spec, epilogue) in GEMM_STEPS.items():
        for variant in [*gemm_families.FAMILIES, *GEMM_CONFIGS]:
            config = gemm_families.configure(spec, variant)
            if gemm_families.unsupported_reason(spec, config, epilogue) is None:
                for arch in ARCHS if variant in gemm_families.FAMILIES else ("sm_90",):
                    yield f"{step} {config} {arch}", spec, config, epilogue, arch
    spec = GemmSpec(9, 10, 50, bias="column")
    for activation in GEMM_ACTIVATIONS:
        for variant in gemm_families.FAMILIES:
            epilogue = GemmEpilogue(activation, softmax=variant == "rowwarp")
            yield f"{activation.suffix} {variant}", spec, gemm_families.configure(spec, variant), epilogue, "sm_90"


GEMM_CASES = list(_gemm_cases())


# --- the residual epilogue: Add, every activation of the shared table, and the pool after them ---

RESIDUAL_STEPS = {
    # real-CNN layers at batch 32 with what their plans fuse: the tensor-core GEMM's unsplit and split-K stores
    "resnet 64->64 3x3 56+add+relu": (CNN_SPECS["resnet 64->64 3x3 56"], Epilogue("Relu", residual=True)),
    "resnet 512->512 3x3 7+add+relu": (CNN_SPECS["resnet 512->512 3x3 7"], Epilogue("Relu", residual=True)),
    "resnet 1x1 64->256 56+add+relu": (CNN_SPECS["resnet 1x1 64->256 56"], Epilogue("Relu", residual=True)),
    "mobilenetv2 1x1 96->24 56+add": (CNN_SPECS["mobilenetv2 1x1 96->24 56"], Epilogue(residual=True)),
    "mobilenetv2 dw 3x3 32ch 112+relu6": (CNN_SPECS["mobilenetv2 dw 3x3 32ch 112"], Epilogue(Activation("Clip", 0.0, 6.0))),
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
            for arch in ARCHS:
                yield step, config, arch


RESIDUAL_CASES = list(_residual_cases())
ACTIVATION_SPEC = conv(8, 16, 32, (12, 12), (3, 3), pads=(1, 1, 1, 1))
RESIDUAL_ACTIVATION_CASES = [
    (activation, variant)
    for activation in [*(Activation.plain(op) for op in ACTIVATION_KINDS), Activation("LeakyRelu", 0.3), Activation("Clip", 0.0, 6.0)]
    for variant in ("const_rb", "const_tile", "tc_3xtf32", "tc_3xtf32_b32x64x32_w32x16_s3_k2")
]


def _residual_jobs():
    for step, config, arch in RESIDUAL_CASES:
        spec, epilogue = RESIDUAL_STEPS[step]
        yield from ((unit.source, unit.defines, arch) for unit in nvrtc_check.variant_units(spec, config, epilogue))
    for activation, variant in RESIDUAL_ACTIVATION_CASES:
        units = nvrtc_check.variant_units(ACTIVATION_SPEC, variant, Epilogue(activation, residual=True))
        yield from ((unit.source, unit.defines, "sm_90") for unit in units)


def compile_jobs():
    """(source, defines, arch) of every compile the tests of this module make."""
    yield from _residual_jobs()
    for name, config in CNN_TENSOR_CORE_CASES + CNN_SIMT_CASES:
        spec = CNN_SPECS[name]
        for arch in ARCHS:
            yield from ((unit.source, unit.defines, arch) for unit in nvrtc_check.variant_units(spec, config))
    for spec in SHAPES.values():
        for variant in families.FAMILIES:
            if families.unsupported_reason(spec, variant, _ones(spec)) is None:
                for arch in ARCHS:
                    yield from ((unit.source, unit.defines, arch) for unit in nvrtc_check.variant_units(spec, variant))
    for step, config in TUNING_CASES:
        spec, epilogue = SHIPPED_STEPS[step]
        yield from ((unit.source, unit.defines, "sm_90") for unit in nvrtc_check.variant_units(spec, config, epilogue))
    for variant in EXPLICIT_MAPS:
        yield from ((unit.source, unit.defines, "sm_90") for unit in nvrtc_check.variant_units(SHAPES["lenet86.conv2"], variant))
    yield from ((config.source, gemm_families.defines(spec, config, epilogue), arch) for _, spec, config, epilogue, arch in GEMM_CASES)
    yield from ((pool_kernel.SOURCE, pool_kernel.defines(spec), arch) for spec in POOL_SPECS.values() for arch in ARCHS)


@pytest.fixture(scope="module", autouse=True)
def compiled_up_front():
    nvrtc_check.precompile(compile_jobs())


def assert_clean(usage, family: str) -> None:
    assert usage.cubin_bytes > 0
    assert 0 < usage.registers <= 255
    if family in CONSTANT_FAMILIES:
        assert (usage.spill_stores, usage.spill_loads) == (0, 0), usage.log
        assert usage.stack_frame == 0, usage.log


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", list(families.FAMILIES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_variant_compiles(shape, variant, arch):
    spec = SHAPES[shape]
    reason = families.unsupported_reason(spec, variant, _ones(spec))
    if reason:
        pytest.skip(reason)
    for usage in nvrtc_check.check_variant(spec, variant, arch):
        assert_clean(usage, variant)
        # ptxas for sm_80 reports the __constant__ arrays as bank 3; sm_90's omits them
        if variant in CONSTANT_FAMILIES and 3 in usage.constant_memory:
            assert usage.constant_memory[3] == families.constant_bytes(spec)


@pytest.mark.parametrize(("step", "config"), TUNING_CASES)
def test_every_configuration_tuning_may_pick_compiles_for_hopper(step, config):
    # Spills are allowed here (tuning skips a kernel that uses local memory); a
    # configuration must compile and stay within the register file.
    spec, epilogue = SHIPPED_STEPS[step]
    for usage in nvrtc_check.check_variant(spec, config, "sm_90", epilogue):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255


@pytest.mark.parametrize("step", list(SHIPPED_STEPS))
def test_the_heuristic_pick_for_each_shipped_step_does_not_spill(step):
    spec, epilogue = SHIPPED_STEPS[step]
    variant = heuristic_config(spec, _ones(spec), epilogue)
    for usage in nvrtc_check.check_variant(spec, variant, "sm_90", epilogue):
        assert_clean(usage, variant)


def test_tuning_covers_every_exact_family_that_runs_the_shipped_convs():
    covered = {families.family_of(config).name for _, config in TUNING_CASES}
    exact = {name for name, family in families.FAMILIES.items() if family.exact}
    assert covered == exact


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("layer", "config"), CNN_TENSOR_CORE_CASES + CNN_SIMT_CASES)
def test_gemm_configurations_for_real_cnn_layers_compile_without_spills(layer, config, arch):
    for usage in nvrtc_check.check_variant(CNN_SPECS[layer], config, arch):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        assert usage.spills == 0 and usage.stack_frame == 0, usage.log


EXPLICIT_MAPS = ["const_mo_m1", "const_mo_m3", "const_mo_m16"]


@pytest.mark.parametrize("case", GEMM_CASES, ids=[case[0] for case in GEMM_CASES])
def test_every_gemm_configuration_compiles_without_spills(case):
    _, spec, config, epilogue, arch = case
    usage = nvrtc_check.check_source(config.source, gemm_families.defines(spec, config, epilogue), f"gemm_{config.family}", arch)
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
    assert (usage.spill_stores, usage.spill_loads, usage.stack_frame) == (0, 0, 0), usage.log


def test_every_gemm_family_and_heuristic_pick_is_compiled():
    compiled = {(label.split()[0], config.name()) for label, _, config, _, _ in GEMM_CASES}
    for step, (spec, epilogue) in GEMM_STEPS.items():
        assert (step.split()[0], gemm_families.heuristic_config(spec, epilogue).name()) in compiled or step.startswith("bench")
    assert {case[2].family for case in GEMM_CASES} == set(gemm_families.FAMILIES)


@pytest.mark.parametrize("variant", EXPLICIT_MAPS)
def test_explicit_maps_per_thread_compile_without_spills(variant):
    # 16 is not a multiple of 3: the last map group is shorter
    [usage] = nvrtc_check.check_variant(SHAPES["lenet86.conv2"], variant, "sm_90")
    assert usage.spills == 0, usage.log


def test_compile_error_carries_the_nvrtc_log():
    with pytest.raises(nvrtc_check.CompileError, match="undefined"):
        nvrtc_check.check_source("conv_const.cu", {"C": 1}, "conv_const", "sm_90")  # M, H, ... missing


def test_options_are_d_macros_after_the_language_standard():
    options = cuda.nvrtc_options({"C": 4, "HAS_BIAS": True, "PADDED": False})
    assert options[: len(cuda.BASE_OPTIONS)] == cuda.BASE_OPTIONS
    assert options[len(cuda.BASE_OPTIONS) :] == ("-DC=4", "-DHAS_BIAS=1", "-DPADDED=0")
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
    usage = nvrtc_check.check_pool(POOL_SPECS[pool], arch)
    assert usage.cubin_bytes > 0 and 0 < usage.registers <= 64  # a thread holds an index and one accumulator
    assert (usage.spill_stores, usage.spill_loads, usage.stack_frame) == (0, 0, 0), usage.log


def test_residual_cases_cover_every_fusing_family_and_split_k():
    covered = {families.family_of(config).name for _, config, _ in RESIDUAL_CASES}
    assert covered == set(RESIDUAL_FAMILIES)
    assert any(config.endswith("_k4") for _, config, _ in RESIDUAL_CASES)
    assert any(RESIDUAL_STEPS[step][1].pool and not RESIDUAL_STEPS[step][1].pool_first for step, _, _ in RESIDUAL_CASES)


@pytest.mark.parametrize(("step", "config", "arch"), RESIDUAL_CASES)
def test_residual_epilogues_compile_without_spills(step, config, arch):
    spec, epilogue = RESIDUAL_STEPS[step]
    for usage in nvrtc_check.check_variant(spec, config, arch, epilogue):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        assert usage.spills == 0 and usage.stack_frame == 0, usage.log


@pytest.mark.parametrize(("activation", "variant"), RESIDUAL_ACTIVATION_CASES, ids=lambda v: getattr(v, "suffix", v))
def test_every_activation_with_a_residual_compiles_without_spills(activation, variant):
    for usage in nvrtc_check.check_variant(ACTIVATION_SPEC, variant, "sm_90", Epilogue(activation, residual=True)):
        assert usage.cubin_bytes > 0 and 0 < usage.registers <= 255
        assert usage.spills == 0 and usage.stack_frame == 0, usage.log
