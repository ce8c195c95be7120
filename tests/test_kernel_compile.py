"""Every CUDA Conv variant compiles with NVRTC for sm_80 and sm_90, without a GPU.

Runs in CI: cuda-bindings' NVRTC turns each specialised source into a cubin and
ptxas -v reports its resources. The constant-memory variants must not spill.
"""
from __future__ import annotations

import pytest

from opplugin import cuda, nvrtc_check
from opplugin.ops import conv_cuda
from onnx_builders import conv_spec as conv

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
}

CONSTANT_VARIANTS = [v for v in conv_cuda.VARIANTS if v != "baseline"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", list(conv_cuda.VARIANTS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_variant_compiles(shape, variant, arch):
    spec = SHAPES[shape]
    usage = nvrtc_check.check_variant(spec, variant, arch)

    assert usage.cubin_bytes > 0
    assert 0 < usage.registers <= 255
    if variant in CONSTANT_VARIANTS:
        assert (usage.spill_stores, usage.spill_loads) == (0, 0), usage.log
        assert usage.stack_frame == 0, usage.log
        # ptxas for sm_80 reports the __constant__ arrays as bank 3; sm_90's omits them
        if 3 in usage.constant_memory:
            assert usage.constant_memory[3] == conv_cuda.constant_bytes(spec)


@pytest.mark.parametrize("variant", ["const_mo1", "const_mo3", "const_mo16"])
def test_explicit_maps_per_thread_compile_without_spills(variant):
    # 16 is not a multiple of 3: the last map group is shorter
    usage = nvrtc_check.check_variant(SHAPES["lenet86.conv2"], variant, "sm_90")
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
