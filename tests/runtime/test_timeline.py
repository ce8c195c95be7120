"""The time line of a run: copy time, and how much of it hid behind compute."""
import pytest

from opplugin.runtime.timeline import Span, Timeline, copy_figures


def _span(name, kind, start, end, chunk=0, order=0):
    return Span(name, kind, chunk, order, start, end)


def test_copies_with_nothing_computing_are_exposed():
    spans = [_span("copy H2D x", "copy", 0, 2), _span("conv", "plugin", 2, 5), _span("copy D2H y", "copy", 5, 6)]
    assert copy_figures(spans) == (3.0, 0.0, 3.0)


def test_copies_under_compute_are_hidden():
    # chunk 1's upload runs while chunk 0 computes; chunk 0's download while chunk 1 computes
    spans = [
        _span("copy H2D x", "copy", 0, 2), _span("conv", "plugin", 2, 6),
        _span("copy H2D x", "copy", 3, 5, chunk=1), _span("conv", "plugin", 6, 10, chunk=1),
        _span("copy D2H y", "copy", 6, 7), _span("copy D2H y", "copy", 10, 11, chunk=1),
    ]
    copied, hidden, exposed = copy_figures(spans)
    assert copied == pytest.approx(6.0)
    assert hidden == pytest.approx(3.0) and exposed == pytest.approx(3.0)


def test_copies_overlapping_each_other_count_once_on_the_time_line():
    spans = [_span("copy H2D x", "copy", 0, 4), _span("copy D2H y", "copy", 2, 6), _span("conv", "plugin", 5, 8)]
    copied, hidden, exposed = copy_figures(spans)
    assert copied == 8.0 and hidden == 1.0 and exposed == 5.0


def test_no_copies():
    assert copy_figures([_span("conv", "plugin", 0, 1)]) == (0.0, 0.0, 0.0)


def test_host_spans_come_back_in_chunk_and_execution_order():
    timeline = Timeline(on_gpu=False)
    t = timeline.now()
    timeline.host("b", "plugin", 1, 1, t, t + 0.001)
    timeline.host("a", "plugin", 0, 2, t, t + 0.002)
    timeline.host("c", "copy", 0, 1, t + 0.001, t + 0.0015)
    spans = timeline.spans()
    assert [(s.chunk, s.order, s.name) for s in spans] == [(0, 1, "c"), (0, 2, "a"), (1, 1, "b")]
    assert spans[1].ms == pytest.approx(2.0)


def test_spans_carry_their_lane_and_clock():
    timeline = Timeline(on_gpu=False)
    t = timeline.now()
    timeline.host("conv", "plugin", 0, 1, t, t + 0.001, lane=2)
    timeline.host("relu", "plugin", 0, 2, t + 0.001, t + 0.002)
    first, second = timeline.spans()
    assert (first.lane, first.clock) == (2, "host") and (second.lane, second.clock) == (0, "host")
