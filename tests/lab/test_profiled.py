"""A profiled step as `opplugin profile` reports it: its kernels' counters joined to the plan's
record, its rates against the roofline, and the text and JSON it makes (no GPU needed)."""
import json

import pytest

from opplugin.lab.ncu import HotLine, KernelCounters
from opplugin.lab.profiled import StepProfile, profile_json, profile_lines
from opplugin.lab.roofline import Roofline
from opplugin.runtime.records import StepRecord


def kernel(step, ms):
    return KernelCounters(step, "my_conv", ms, 30.0, 85.0, 40.0, 50.0, "registers", 96, 1024, 256, 400, 10.0, 70.0, 0, 0,
                          [("long_scoreboard", 3.0)])


ROOF = Roofline(copy_bytes=2 << 30, copy_ms=0.5, matmul_n=8192, matmul_ms=20.0, matmul_rel_error=1e-6)  # ~4.3 TB/s, ~55 TFLOP/s


def test_a_step_takes_the_counters_of_its_own_range_and_is_set_against_the_roofline():
    step = StepRecord("conv2", "plugin", ("Conv", "Relu"), "my_conv.cu", ("x",), ("y",), flops=2_000_000_000, bytes_moved=400_000_000,
                      nodes=("conv2", "relu2"))
    line = HotLine("/home/me/my_conv.cu", 42, 0.6, "acc += x[i] * w[j];")
    profile = StepProfile.join(step, 3, [kernel(1, 9.0), kernel(3, 0.25), kernel(3, 0.05)], [[], [line], []], run_ms=0.28)
    assert [k.ms for k in profile.kernels] == [0.25, 0.05] and profile.hot_lines == [[line], []]
    assert profile.ms == pytest.approx(0.3)
    gflops, gbytes = profile.rates()
    assert gflops == pytest.approx(2e9 / 0.3e-3 / 1e9) and gbytes == pytest.approx(4e8 / 0.3e-3 / 1e9)
    floor, bound = profile.floor(ROOF)
    assert bound == "memory" and floor == pytest.approx(1e3 * 4e8 / ROOF.bytes_per_s)
    text = "\n".join(profile_lines([profile], ROOF))
    assert "conv2 (Conv > Relu; nodes conv2, relu2) runs my_conv.cu: 0.3000 ms under the profiler (0.2800 ms in the timed run)" in text
    assert f"{0.3 / floor:.1f}x its memory-bound floor" in text
    assert "occupancy 40% achieved of 50% theoretical (limited by registers)" in text
    assert "my_conv.cu:42  60% of samples  acc += x[i] * w[j];" in text
    report = json.loads(json.dumps(profile_json("m", "H200", 8, [profile], ROOF)))
    [only] = report["steps"]
    assert report["schema"] == "opplugin-profile/1" and only["bound"] == "memory" and len(only["kernels"]) == 2
    assert only["kernels"][0]["hot_lines"][0]["line"] == 42 and only["kernels"][0]["nearer"] == "memory"


def test_launches_of_one_kernel_are_one_entry_with_their_count_and_total():
    step = StepRecord("conv2", "plugin", ("Conv", "MaxPool"), "my_conv.cu, then cupy+maxpool4", ("x",), ("y",), nodes=("conv2",))
    relu = [KernelCounters(0, "cupy_maximum", ms, 18.0, 28.0, *[None] * 11) for ms in (0.005, 0.006, 0.005)]
    text = "\n".join(profile_lines([StepProfile.join(step, 0, [kernel(0, 0.45), *relu], [], run_ms=None)], None))
    assert text.count("cupy_maximum") == 1 and "cupy_maximum  x3 launches, 0.0160 ms in all; the longest:" in text
    assert "0.0060 ms  speed of light" in text


def test_a_step_without_kernels_says_so():
    step = StepRecord("flatten", "plugin", ("Flatten",), "view.flatten", ("x",), ("y",))
    profile = StepProfile.join(step, 0, [], [], run_ms=None)
    assert profile.ms is None and profile.rates() == (None, None)
    assert "no kernel was profiled in this step" in "\n".join(profile_lines([profile], None))
