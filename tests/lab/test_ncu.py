"""Nsight Compute's report as opplugin reads it (no GPU needed): the raw page's rows become each
kernel's counters, filed under the step whose NVTX range launched it; the source page's warp-stall
samples become each kernel's hottest lines; ncu's refusals become one line."""
import csv
import io

import pytest

from opplugin.lab import ncu

NVTX = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
METRICS = {
    "gpu__time_duration.sum": ("ns", "51,200"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "23.50"),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "81.25"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "37.10"),
    "sm__maximum_warps_per_active_cycle_pct": ("%", "50"),
    "launch__occupancy_limit_registers": ("block", "4"),
    "launch__occupancy_limit_shared_mem": ("block", "7"),
    "launch__occupancy_limit_warps": ("block", "8"),
    "launch__occupancy_limit_blocks": ("block", "32"),
    "launch__registers_per_thread": ("register/thread", "96"),
    "launch__shared_mem_per_block": ("byte/block", "33,792"),
    "launch__block_size": ("", "256"),
    "launch__grid_size": ("", "1,568"),
    "l1tex__t_sector_hit_rate.pct": ("%", "12.00"),
    "lts__t_sector_hit_rate.pct": ("%", "80.40"),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": ("", "1,024"),
    "sass__inst_executed_register_spilling": ("inst", "0"),
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("ratio", "4.10"),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("ratio", "1.20"),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("ratio", "2.30"),
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": ("ratio", "0.40"),
}


def raw_page(kernels: list[tuple[str, str]]) -> str:
    """ncu --page raw --csv --print-units base: a header, a units row, a row per kernel (name, NVTX stack)."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["ID", "Process ID", NVTX, "Kernel Name", *METRICS])
    writer.writerow(["", "", "", "", *(unit for unit, _ in METRICS.values())])
    for number, (kernel, ranges) in enumerate(kernels):
        writer.writerow([str(number), "486", ranges, kernel, *(value for _, value in METRICS.values())])
    return out.getvalue()


def test_each_kernel_is_filed_under_its_steps_range_with_its_counters():
    text = raw_page([("conv_wg_3xtf32", '486  "<default domain>:opplugin-step-2:none:none"'),
                     ("cupy_relu", '486  "<default domain>:opplugin-step-11:none:none"'), ("stray", "")])
    first, second, stray = [ncu.kernel_counters(r) for r in ncu.raw_records(text)]
    assert (first.step, first.kernel, second.step, stray.step) == (2, "conv_wg_3xtf32", 11, None)
    assert first.ms == pytest.approx(0.0512) and first.compute_pct == 23.5 and first.memory_pct == 81.25
    assert first.bound() == "memory" and first.occupancy_limit == "registers"
    assert (first.achieved_occupancy_pct, first.theoretical_occupancy_pct) == (37.1, 50.0)
    assert (first.registers_per_thread, first.shared_bytes_per_block, first.grid) == (96, 33792, 1568)
    assert (first.l1_hit_pct, first.l2_hit_pct, first.shared_bank_conflicts, first.spilled_instructions) == (12.0, 80.4, 1024, 0)
    assert first.stalls == [("long_scoreboard", 4.1), ("barrier", 2.3), ("wait", 1.2)]


def test_a_kernel_far_from_both_speeds_of_light_is_latency_bound():
    counters = ncu.KernelCounters(None, "k", 0.01, 12.0, 30.0, None, None, None, None, None, None, None, None, None, None, None)
    assert counters.bound() == "latency"


HEADER = '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples"'


def source_page(path) -> str:
    """ncu --page source --csv --print-source cuda,sass as it comes: a block per kernel with line
    information, each CUDA line followed by its instructions; a quote in the source is not escaped."""
    return "\n".join([
        f'"File Path","{path}"', '"Function Name","conv"', HEADER,
        '"1","extern "C" __global__ void conv(const float* x, float* y, int batch) {","-","-","112","14","112"',
        '"","","0x7f0","      LDC R1, c[0x0][0x28]","112","14","112"',
        '"2","    float acc = 0.0f;","-","-","20","1","20"',
        '"3","    acc += x[i] * w[j];","-","-","600","400","600"',
        '"","","0x7f1","      FFMA R2, R3, R4, R2","600","400","600"',
        '"4","    y[i] = acc;","-","-","268","20","268"',
        f'"File Path","{path}"', '"Function Name","conv"', HEADER,
        '"3","    acc += x[i] * w[j];","-","-","9","1","9"', '"4","    y[i] = acc;","-","-","1","0","1"'])


def test_the_source_page_gives_each_kernel_its_hottest_lines_read_from_the_file(tmp_path):
    path = tmp_path / "my_conv.cu"
    path.write_text('extern "C" __global__ void conv(const float* x, float* y, int batch) {\n    float acc = 0.0f;\n'
                    '    acc += x[i] * w[j];\n    y[i] = acc;\n}\n')
    first, again = ncu.hot_lines(source_page(path), top=2)
    assert first.function == "conv" and [(h.line, round(h.share, 2), h.text) for h in first.lines] == [
        (3, 0.6, "acc += x[i] * w[j];"), (4, 0.27, "y[i] = acc;")]
    assert [(h.line, h.share) for h in again.lines] == [(3, 0.9), (4, 0.1)]
    conv = ncu.KernelCounters(2, "conv", *[None] * 14)
    relu = ncu.KernelCounters(2, "cupy_relu", *[None] * 14)
    by_kernel = ncu.lines_by_kernel([conv, relu, conv], [first, again])
    assert by_kernel == [first.lines, [], again.lines]  # a kernel without line information has none


@pytest.mark.parametrize("output, expected", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "the GPU refuses its performance counters"),
    ("==PROF== Connected\n==ERROR== Failed to find any kernel to profile", "Failed to find any kernel to profile"),
    ("==PROF== Report: /tmp/x.ncu-rep", None),
])
def test_ncus_refusals_are_one_line(output, expected):
    said = ncu.refusal(output)
    assert said == expected if expected is None else said.startswith(expected)


def test_the_command_profiles_only_the_step_ranges_with_source():
    command = ncu.profile_command("/usr/local/cuda/bin/ncu", "/tmp/r.ncu-rep", ["python", "-m", "child"])
    assert command[:3] == ["/usr/local/cuda/bin/ncu", "--nvtx", "--nvtx-include"]
    assert command[3] == "regex:opplugin-step-\\d+/" and "--import-source" in command and command[-3:] == ["python", "-m", "child"]


def test_a_built_in_kernels_lines_are_read_from_its_source_in_kernels():
    from opplugin.core.paths import kernel_source

    first, _ = ncu.hot_lines(source_page("conv_baseline.cu"), top=1)  # NVRTC named it by the file's name alone
    line = kernel_source("conv_baseline.cu").splitlines()[2].strip()
    assert first.lines[0].line == 3 and first.lines[0].text == line and line
