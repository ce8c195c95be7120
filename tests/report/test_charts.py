"""The report's hand-drawn SVG charts: a bar per span and a point per step, each with its
hover title; a log-log roofline whose roof bends at the ridge."""
import re

import pytest
from html_pages import ReadPage

from opplugin.report.charts import Bar, LogAxis, Point, Roof, Track, decade_label, nice_step, roofline_svg, timeline_svg


def test_tick_spacing_is_one_two_or_five_times_a_power_of_ten():
    assert nice_step(12474.0) == 2000.0
    assert nice_step(1.6) == 0.2
    assert nice_step(0.0) == 1.0


def test_a_log_axis_spans_whole_decades():
    axis = LogAxis.spanning(0.3, 40.0, 0.0, 300.0)
    assert axis.decades() == [0.1, 1.0, 10.0, 100.0]
    assert axis(1.0) == pytest.approx(100.0) and axis(100.0) == pytest.approx(300.0)
    assert LogAxis.spanning(2.0, 3.0, 0, 1).decades() == [1.0, 10.0]  # never less than one decade
    assert [decade_label(v) for v in (0.01, 1.0, 1e3, 1e4, 1e-4)] == ["0.01", "1", "1000", "1e4", "1e-4"]


def test_the_timeline_has_a_bar_per_span_with_its_start_and_duration():
    tracks = [Track("lane 0", [Bar("conv1", "plugin", 0.0, 1.0, "chunk 0"), Bar("tiny", "onnxruntime", 1.0, 1.0001)]),
              Track("lane 1", [Bar("copy H2D input", "copy", 0.5, 0.7)])]
    page = ReadPage(timeline_svg(tracks, 2.0))
    assert page.count("rect", "bar") == 3 and page.count("rect", "plugin") == 1 and page.count("rect", "copy") == 1
    assert "conv1 (plugin): starts at 0.000 ms, takes 1.000 ms; chunk 0" in page.titles
    svg = timeline_svg(tracks, 2.0)
    widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="\d+" class="bar', svg)]
    assert len(widths) == 3 and min(widths) == 1.0  # a step of 0.1 us still shows
    assert page.count("text", "track") == 2


def test_the_roofline_has_a_point_per_step_and_names_them():
    points = [Point("conv1", 20.0, 4.3, "5.9 ms"), Point("fc<1>", 15.0, 38.0)]
    page = ReadPage(roofline_svg(points, None))
    assert page.count("circle", "point") == 2
    assert page.titles == ["conv1: 20 FLOPs/byte, 4.3 GFLOP/s; 5.9 ms", "fc<1>: 15 FLOPs/byte, 38 GFLOP/s"]
    assert page.count("polyline", "roof") == 0  # no roof without a device's ceilings


def test_the_roof_is_the_bandwidth_slope_up_to_the_ridge_then_the_compute_ceiling():
    roof = Roof(bytes_per_s=4e12, flops_per_s=60e12)  # ridge at 15 FLOPs per byte
    assert roof.gflops_at(1.0) == pytest.approx(4000.0) and roof.gflops_at(100.0) == pytest.approx(60000.0)
    svg = roofline_svg([Point("conv", 2.0, 3000.0)], roof)
    corners = [tuple(map(float, c.split(","))) for c in re.search(r'<polyline points="([^"]+)"', svg).group(1).split()]
    assert len(corners) == 3
    (x0, y0), (x1, y1), (x2, y2) = corners
    assert x0 < x1 < x2 and y0 > y1 and y1 == pytest.approx(y2)  # up the slope (y grows downward), then flat
    assert "FP32 60.0 TFLOP/s" in svg and "copy 4,000 GB/s" in svg


def test_the_bar_chart_has_a_bar_per_figure_its_note_without_one_and_the_floor_marked():
    from opplugin.report.charts import HBar, bars_svg, figure

    bars = [HBar("const_rb", 0.5, "opplugin", "12 GFLOP/s"), HBar("[cudnn_fp32]", 2.0, "peer"),
            HBar("broken<1>", None, "opplugin", note="INCORRECT: relative error 0.5")]
    svg = bars_svg(bars, "ms", ("floor", 0.25))
    page = ReadPage(svg)
    assert page.count("rect", "bar") == 2 and page.count("rect", "peer") == 1
    assert page.titles == ["const_rb: 0.5 ms; 12 GFLOP/s", "[cudnn_fp32]: 2 ms"]
    assert "INCORRECT: relative error 0.5" in svg and "broken&lt;1&gt;" in svg and page.count("line", "marker") == 1
    widths = [float(w) for w in re.findall(r'width="([\d.]+)" height="\d+" class="bar', svg)]
    assert widths[1] == pytest.approx(4 * widths[0])  # one linear scale from 0
    assert figure(3636363.6) == "3,636,364" and figure(0.012345) == "0.01235"
