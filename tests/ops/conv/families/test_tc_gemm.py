"""The pipelined tensor-core implicit GEMM (tc_3xtf32, tc_tf32) and the layer set of
`opplugin bench --suite cnn`, on the CPU: names and limits, the tap table the kernel
indexes, the default choice, and the suite summary. The GPU tests that hold the
kernels to float64 are in ops/conv/test_families_gpu.py and ops/conv/families/test_mixed.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnx_builders import conv_spec as conv
from opplugin.gpu import cuda
from opplugin.cli import bench as bench_command
from opplugin.cli.commands import build_parser
from opplugin.lab import bench, cnn_layers
from opplugin.lab.bench_text import summary_lines
from opplugin.ops.conv import families
from opplugin.ops.conv.choice import heuristic_config, prefers_tensor_cores
from opplugin.ops.conv.epilogue import NONE, Epilogue
from opplugin.ops.conv.families import pipelined
from opplugin.ops.conv.families.pipelined import tiles_header_defines
from repository import ROOT

VGG_512 = conv(1, 512, 512, (14, 14), (3, 3), pads=(1, 1, 1, 1))
RESNET_64 = conv(32, 64, 64, (56, 56), (3, 3), pads=(1, 1, 1, 1))


def ones(spec):
    return np.ones(spec.weight_shape, np.float32), np.ones(spec.out_channels, np.float32)


def test_3xtf32_is_exact_by_measurement_and_tf32_opt_in():
    exact, tf32 = families.FAMILIES["tc_3xtf32"], families.FAMILIES["tc_tf32"]
    assert exact.exact and exact.exact_by == "measurement" and exact.max_relative_error <= 1e-5
    assert not tf32.exact and tf32.expected_relative_error < tf32.max_relative_error
    assert families.FAMILIES["const_tile"].exact_by == "construction"
    for name in ("tc_fp16", "tc_bf16"):  # 16-bit operands, FP32 accumulation: opt-in, their error stated
        family = families.FAMILIES[name]
        assert not family.exact and family.expected_relative_error < family.max_relative_error <= 1e-2
        assert families.family_of(f"{name}_b64x64x32_w32x32_s3_k2").name == name
    assert families.FAMILIES["tc_fp16"].max_relative_error < families.FAMILIES["tc_bf16"].max_relative_error


def test_configuration_names_parse_and_belong_to_their_family():
    assert families.family_of("tc_3xtf32_b64x64x32_w32x32_s3_k4").name == "tc_3xtf32"
    assert families.family_of("tc_tf32_b128x128x32_w64x32_s3").name == "tc_tf32"
    assert families.unsupported_reason(VGG_512, "tc_3xtf32_b64x64x32_w32x32_s3_k4", None) is None
    assert "tiles are" in families.unsupported_reason(VGG_512, "tc_3xtf32_b48x64x32_w32x32_s3", None)
    assert "tiles are" in families.unsupported_reason(VGG_512, "tc_3xtf32_b64x64x32_w64x32_s3", None)  # not its warp layout
    assert "tiles are" in families.unsupported_reason(VGG_512, "tc_3xtf32_b64x64x16_w32x32_s3", None)  # nor another depth
    assert "split it 1 to 16 ways" in families.unsupported_reason(VGG_512, "tc_3xtf32_b64x64x32_w32x32_s3_k32", None)


def test_limits_are_stated():
    grouped = conv(1, 8, 8, (9, 9), (3, 3), group=2)
    assert families.unsupported_reason(grouped, "tc_3xtf32", None) is None  # any group count
    assert "not a max pool" in families.unsupported_reason(RESNET_64, "tc_3xtf32", None, Epilogue("Relu", (2, 2)))
    assert families.unsupported_reason(RESNET_64, "tc_3xtf32", None, Epilogue("Relu")) is None
    huge_k = conv(1, 1024, 16, (5, 5), (3, 3))  # K = 9216 > the 8192-row tap table: it holds one channel's taps
    assert families.unsupported_reason(huge_k, "tc_3xtf32", None) is None
    wide_window = conv(1, 102, 8, (20, 20), (9, 9))  # K = 8262 and 81 taps: no tap mask to read them by channel
    assert "too wide to read them by channel" in families.unsupported_reason(wide_window, "tc_3xtf32", None)
    huge_image = conv(1, 4096, 16, (1024, 1024), (1, 1))  # 4096 channels of 1024 x 1024: past int32 offsets
    assert "int32 offsets" in families.unsupported_reason(huge_image, "tc_3xtf32", None)


def test_small_outputs_split_k_to_fill_the_gpu_and_large_ones_do_not():
    # 196 pixels x 512 maps: 16 tiles of 128x64, split 8 to cover the SMs, 15 to fill 90% of two blocks' slots per SM
    family = families.FAMILIES["tc_3xtf32"]
    assert [c.name() for c in family.configs(VGG_512)[:2]] == ["tc_3xtf32_b128x64x32_w64x32_s3_k15", "tc_3xtf32_b128x64x32_w64x32_s3_k8"]
    assert pipelined.wave_efficiency(16 * 15, 2 * pipelined.DEFAULT_SMS) >= pipelined.WAVE_BALANCE
    deep = conv(32, 256, 256, (14, 14), (3, 3), pads=(1, 1, 1, 1))  # 196 blocks of 128x64: under one per slot
    assert families.configure(deep, "tc_3xtf32").name() == "tc_3xtf32_b128x64x32_w64x32_s3_k4"
    wide = conv(32, 128, 128, (28, 28), (3, 3), pads=(1, 1, 1, 1))  # 392 blocks: 1.5 waves, left unsplit
    assert families.configure(wide, "tc_3xtf32").name() == "tc_3xtf32_b128x64x32_w64x32_s3" and "tc_3xtf32_b128x64x32_w64x32_s3_k2" in [c.name() for c in family.configs(wide)]
    assert families.configure(RESNET_64, "tc_3xtf32").name() == "tc_3xtf32_b64x128x32_w32x64_s3"
    short_k = conv(32, 32, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))  # K = 288: a smaller tile, unsplit
    assert families.configure(short_k, "tc_3xtf32").name() == "tc_3xtf32_b32x64x32_w32x16_s3"
    few_maps = conv(32, 96, 24, (56, 56), (1, 1))
    assert families.configure(few_maps, "tc_3xtf32").name() == "tc_3xtf32_b32x128x32_w32x32_s3"


def test_tap_table_gives_each_k_its_offset_and_place_in_the_window():
    spec = conv(1, 3, 4, (10, 12), (2, 3), pads=(1, 1, 1, 1), dilations=(2, 1))
    table = pipelined.tap_table(spec)
    assert table.shape == (32, 2)  # K = 3 * 2 * 3 = 18, rounded up to two slices of 16
    k = 1 * 6 + 1 * 3 + 2  # c=1, kh=1, kw=2
    assert table[k, 0] == 1 * 120 + 1 * 2 * 12 + 2 and table[k, 1] == 1 * 3 + 2
    assert (table[18:, 1] == 6).all()  # past K: the bit after the window's 6 taps, never set
    # a window of 64 taps or more has no spare bit: the table holds the steps for a bounds test
    wide = conv(1, 2, 4, (20, 20), (9, 9), pads=(4, 4, 4, 4))
    wide_table = pipelined.tap_table(wide)
    assert wide_table[9 + 2, 1] == (1 << 16) | 2 and (wide_table[162:, 1] >> 16 == pipelined.NO_TAP).all()


def _emulated_taps(spec, table, by_channel):
    """Each k's row as the kernel's tap_at reads it (conv_implicit_tiles.cuh), for k up to KPAD."""
    kpad = pipelined.k_slices(spec) * pipelined.TAP_SLICE
    if not by_channel:
        return table[:kpad]
    window = spec.kernel[0] * spec.kernel[1]
    k_dim = spec.in_channels // spec.group * window
    rows = [table[window] if k >= k_dim else table[k % window] + (k // window * spec.in_size[0] * spec.in_size[1], 0)
            for k in range(kpad)]
    return np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("spec", [
    conv(1, 1024, 16, (7, 7), (3, 3), pads=(1, 1, 1, 1)),  # K = 9216, the window's bits (TAP_MASK)
    conv(1, 102, 8, (20, 20), (9, 9), pads=(4, 4, 4, 4), dilations=(1, 2)),  # 81 taps: the packed bounds test
    conv(1, 2048, 64, (5, 6), (3, 3), group=2),  # a group's K = 9216
])
def test_a_long_k_reads_one_channels_taps_as_the_whole_table_would_have_them(spec, monkeypatch):
    assert pipelined.taps_by_channel(spec)
    window = spec.kernel[0] * spec.kernel[1]
    short = pipelined.tap_table(spec)
    assert short.shape == (window + 1, 2)  # 8 bytes a row: far under 64 KiB
    assert tiles_header_defines(spec, 1)["TAPS_BY_CHANNEL"] == 1
    monkeypatch.setattr(pipelined, "TAP_TABLE_ROWS", 1 << 20)  # as if __constant__ memory held every row
    assert not pipelined.taps_by_channel(spec)
    whole = pipelined.tap_table(spec)
    np.testing.assert_array_equal(_emulated_taps(spec, short, by_channel=True), whole)
    assert "TAPS_BY_CHANNEL" not in tiles_header_defines(spec, 1)  # the other layers' sources stay as they were


def test_runner_prefers_tensor_cores_for_many_maps_and_constant_memory_for_few(monkeypatch):
    # planned for an sm_80 GPU: where Hopper's wg_3xtf32 goes first is ops/conv/families/test_wgmma.py's
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_arch", lambda: "sm_80")
    assert prefers_tensor_cores(RESNET_64) and not prefers_tensor_cores(conv(1, 4, 8, (40, 40), (7, 7)))
    assert heuristic_config(RESNET_64, ones(RESNET_64), NONE).name() == "tc_3xtf32_b64x128x32_w32x64_s3"
    # past 64 KiB of filters the default is no longer the baseline
    mnist = conv(32, 32, 64, (14, 14), (3, 3), pads=(1, 1, 1, 1))
    assert heuristic_config(mnist, ones(mnist), NONE).family == "tc_3xtf32"
    # the shipped convs keep their fused constant-memory kernels
    lenet_conv2 = conv(10000, 4, 16, (40, 40), (7, 7))
    assert heuristic_config(lenet_conv2, ones(lenet_conv2), Epilogue("Relu", (4, 4))).name().startswith("const_tile")
    # a long K: the GEMMs at any batch (graphed at batch 1 this 1x1 ran 4.3 µs on tc_3xtf32, 29 on const_tile)
    assert prefers_tensor_cores(conv(1, 96, 24, (56, 56), (1, 1))) and prefers_tensor_cores(conv(32, 96, 24, (56, 56), (1, 1)))
    # a short K: the constant-memory families where their grid fills the GPU, the GEMMs where it would not
    short_k = conv(32, 32, 64, (112, 112), (1, 1), strides=(2, 2))
    assert not prefers_tensor_cores(short_k) and prefers_tensor_cores(dataclasses.replace(short_k, batch=1))
    # depthwise: const_rb's row tiles first
    depthwise = conv(32, 32, 32, (112, 112), (3, 3), pads=(1, 1, 1, 1), group=32)
    assert heuristic_config(depthwise, ones(depthwise), NONE).name().startswith("const_rb")
    # a pool the GEMM cannot fuse: it runs plain and the epilogue follows
    assert heuristic_config(RESNET_64, ones(RESNET_64), Epilogue("Relu", (2, 2))).name() == "tc_3xtf32_b64x128x32_w32x64_s3"


def test_the_layer_set_is_the_issues():
    names = [layer.name for layer in cnn_layers.LAYERS]
    # issue 24 added the grouped and wide depthwise layers, then EfficientNet-B0's stride-2 depthwise ones
    assert len(names) == len(set(names)) == 24
    shapes = {layer.name: layer.spec(32) for layer in cnn_layers.LAYERS}
    assert shapes["resnet stem 3->64 7x7 s2 224"].out_size == (112, 112)
    assert shapes["resnet 1x1 s2 256->512 56"].out_size == (28, 28)
    assert shapes["mobilenetv2 dw 3x3 s2 144ch 56"].group == 144
    assert shapes["resnext50 g32 3x3 128ch 56"].weight_shape == (128, 4, 3, 3)
    assert shapes["regnety800mf gw16 3x3 144ch 28"].weight_shape == (144, 16, 3, 3)
    assert shapes["convnext-t dw 7x7 768ch 7"].out_size == (7, 7)
    assert shapes["efficientnetb0 dw 5x5 s2 672ch 14"].out_size == (7, 7)
    assert families.constant_bytes(shapes["mnist 32->64 3x3 14"]) > families.CONSTANT_MEMORY_BYTES
    w, b = cnn_layers.layer_weights(cnn_layers.LAYERS[0])
    w2, _ = cnn_layers.layer_weights(cnn_layers.LAYERS[0])
    assert np.array_equal(w, w2) and w.shape == (64, 64, 3, 3) and 0 < np.std(w) < 1


def test_suite_option_defaults_to_batch_1_and_32():
    options = bench_command.conv_options(bench_command.read(build_parser().parse_args(["bench", "--suite", "cnn", "--families", "tc_3xtf32"])))
    assert options.suite == "cnn" and list(options.batches) == [1, 32] and list(options.families) == ["tc_3xtf32"]
    cases = bench.suite_cases()
    assert len(cases) == 24 and all(case.epilogue is None and case.model == "cnn" for case in cases)


def test_suite_summary_compares_best_default_and_tf32_with_cudnn():
    step = dict.fromkeys(bench.STEP_KEYS)
    step.update(step="cnn resnet 64->64 3x3 56", batch=32, floor_ms=0.1, bytes=10, flops=10, default="tc_3xtf32_b64x64x32_w32x32_s3")
    rows = [
        bench.make_row(step, "tc_3xtf32_b64x64x32_w32x32_s3", "variant", family="tc_3xtf32", exact=True, ms=0.2),
        bench.make_row(step, "tc_3xtf32_b32x128x32_w32x32_s3", "variant", family="tc_3xtf32", exact=True, ms=0.16),
        bench.make_row(step, "tc_tf32_b64x64x32_w32x32_s3", "variant", family="tc_tf32", exact=False, ms=0.1),
        bench.make_row(step, "cudnn_fp32", "peer", ms=0.24),
        bench.make_row(step, "cudnn_tf32", "peer", exact=False, ms=0.12),
    ]
    summary = bench.suite_summary([step], rows)
    [line] = summary["layers"]
    assert line["best"] == "tc_3xtf32_b32x128x32_w32x32_s3" and line["best_vs_cudnn_fp32"] == pytest.approx(1.5)
    assert line["default_vs_best"] == pytest.approx(1.25) and line["tf32_vs_cudnn_tf32"] == pytest.approx(1.2)
    assert summary["geomean_best_vs_cudnn_fp32"] == pytest.approx(1.5)
    text = "\n".join(summary_lines(summary))
    assert "geometric mean 1.50x" in text and "default pick at most 1.25x" in text


def test_report_tool_adds_the_layer_table(tmp_path):
    import importlib.util
    import json

    root = ROOT
    spec = importlib.util.spec_from_file_location("bench_report", root / "tools" / "bench_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    step = dict.fromkeys(bench.STEP_KEYS)
    step.update(step="cnn vgg 64->64 3x3 224", batch=32, floor_ms=2.3, bytes=10, flops=10, default="tc_3xtf32_b64x128x32_w32x64_s3")
    rows = [bench.make_row(step, "tc_3xtf32_b64x128x32_w32x64_s3", "variant", family="tc_3xtf32", ms=2.9), bench.make_row(step, "cudnn_fp32", "peer", ms=3.2)]
    cnn = tmp_path / "cnn.json"
    cnn.write_text(json.dumps({"device": {"name": "NVIDIA H100"}, "suite_summary": bench.suite_summary([step], rows)}))
    report.main([str(root / "tools" / "benchmark" / "bench.json"), "--out", str(tmp_path), "--cnn", str(cnn)])
    page = (tmp_path / "BENCHMARK.md").read_text()
    assert "## Real-CNN layers" in page and "| vgg 64->64 3x3 224 | 32 | 3.2 |" in page and "1.10x" in page
