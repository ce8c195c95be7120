"""A Concat's kernel on channel-last 16-bit tensors (ops/layout/linked_concat.py, channel_last.py) on the CPU: its
variant's grammar, how many channels a thread copies at once, and its generated source compiled with NVRTC for
each width of copy. The GPU tests (test_linked_concat_gpu.py) run it."""
from __future__ import annotations

import pytest

from opplugin.errors import PluginError
from opplugin.gpu.device import Device
from opplugin.lab import nvrtc_check
from opplugin.ops.layout.channel_last import LinkedConcat, linked_config, links_reason, offered
from opplugin.ops.layout.linked_concat import UNITS, lanes, linked_concat_source
from opplugin.ops.layout.spec import ConcatSpec

GPU = Device("cuda", "test GPU")
INCEPTION = ConcatSpec(1, (64, 64, 96, 32))  # Inception-v3's Mixed_5b


def test_a_linked_concats_variant_names_its_format_and_links_in_the_names_grammar():
    assert LinkedConcat("cuda_bf16", 3).name() == "cuda_bf16_h3"
    assert linked_config(INCEPTION, 4, GPU, "cuda_fp16_h3") == LinkedConcat("cuda_fp16", 3)
    assert linked_config(INCEPTION, 4, GPU, "cuda") is None and linked_config(INCEPTION, 4, GPU, None) is None
    with pytest.raises(PluginError, match="names no links"):
        linked_config(INCEPTION, 4, GPU, "cuda_fp16")
    with pytest.raises(PluginError, match=r"\(h3\) or none"):
        linked_config(INCEPTION, 4, GPU, "cuda_fp16_h2")


def test_a_concat_is_offered_along_the_channels_of_nchw_tensors_alone():
    assert offered(INCEPTION, 4, GPU).all_or_none and offered(INCEPTION, 4, Device("cpu")) is None
    for spec, rank in ((ConcatSpec(2, (3, 4)), 4), (ConcatSpec(1, (3, 4)), 3)):
        assert offered(spec, rank, GPU) is None
        assert links_reason(spec, rank).startswith("a Concat is linked channel-last along the channels alone")


@pytest.mark.parametrize(("widths", "addresses", "expected"), [
    ((64, 64, 96, 32), (0, 4096, 8192), 8),  # Inception's: 16-byte runs
    ((12, 4, 8), (0, 256), 4),  # a width of 12: 8-byte runs
    ((16, 16), (0, 8), 4),  # an address 8 bytes past 16-byte alignment
    ((6, 10), (0,), 2),
    ((3, 8), (0,), 1),
])
def test_a_thread_copies_as_many_channels_as_every_width_and_address_allows(widths, addresses, expected):
    assert lanes(widths, addresses) == expected


@pytest.mark.skipif(not nvrtc_check.nvrtc_available(), reason="NVRTC (cuda-bindings) is not installed")
@pytest.mark.parametrize("n", list(UNITS))
@pytest.mark.parametrize("wide", [False, True])
def test_each_width_of_copy_compiles_with_nvrtc_without_spills(n, wide):
    from opplugin.gpu import cuda
    from opplugin.gpu.nvrtc import compile_cubin, parse_ptxas_log

    source = linked_concat_source((64, 64, 96, 32), n, wide)
    assert f"const {UNITS[n]}* __restrict__ in3" in source
    _cubin, log = compile_cubin(source, cuda.BASE_OPTIONS, "sm_90")
    usage = parse_ptxas_log(log, "sm_90")["layout_concat"]
    assert usage.spill_stores == 0 and usage.stack_frame == 0, usage
