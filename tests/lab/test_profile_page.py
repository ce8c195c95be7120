"""`opplugin profile --report`: the profiled steps on one self-contained page (no GPU needed)."""
from html.parser import HTMLParser

from opplugin.lab.ncu import HotLine, KernelCounters
from opplugin.lab.profile_page import profile_page
from opplugin.lab.profiled import StepProfile
from opplugin.lab.roofline import Roofline
from opplugin.runtime.records import StepRecord


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.seen.append((tag, dict(attrs)))


def test_the_page_draws_each_profiled_step_and_tables_every_kernel_and_hot_line():
    roof = Roofline(copy_bytes=2 << 30, copy_ms=0.5, matmul_n=8192, matmul_ms=20.0, matmul_rel_error=1e-6)
    counters = [KernelCounters(i, name, 0.2, 60.0, 30.0, 40.0, 50.0, "registers", 64, 0, 256, 100, 90.0, 50.0, 0, 0,
                               [("long_scoreboard", 2.0)]) for i, name in ((0, "conv"), (0, "cupy_relu"), (1, "gemm"))]
    steps = [StepRecord("conv1", "plugin", ("Conv",), "my_conv.cu", ("x",), ("y",), flops=10**9, bytes_moved=10**7, nodes=("conv1",)),
             StepRecord("fc1", "plugin", ("Gemm",), "gemm.rowwarp", ("y",), ("z",), flops=10**8, bytes_moved=10**7, nodes=("fc1",))]
    hot = HotLine("/k/my_conv.cu", 7, 0.75, "acc += x * w;")
    profiles = [StepProfile.join(steps[0], 0, counters, [[hot], [], []], 0.3),
                StepProfile.join(steps[1], 1, counters, [[], [], []], None)]
    page = profile_page("m", "H200", 8, "0.1.0", "2026-11-29", profiles, roof)
    tags = Tags()
    tags.feed(page)
    assert sum(1 for tag, attrs in tags.seen if tag == "circle") == 2  # a point per step
    assert sum(1 for tag, _ in tags.seen if tag == "tr") == 1 + 3 + 1 + 1  # counters: header and 3 kernels; lines: header and 1
    assert "my_conv.cu:7" in page and "acc += x * w;" in page and "cupy_relu" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
