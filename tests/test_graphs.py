"""SegmentGraphs' book-keeping, which needs no device: a run of plugin steps gets its graph
the second time it is met, and a run whose capture failed stays eager with its reason."""
from opplugin.runtime.graphs import SegmentGraph, SegmentGraphs, graph_name


def _segment(name: str, steps: tuple[str, ...]) -> SegmentGraph:
    return SegmentGraph(name, steps, graph=None, inputs={}, outputs={}, pool=None)


def test_a_run_is_due_for_capture_the_second_time_it_is_met_and_never_after_a_failure():
    graphs = SegmentGraphs()
    assert not graphs.due((0, 8)) and graphs.due((0, 8))  # the first pass runs eagerly
    assert not graphs.due((0, 4))
    graphs.add((0, 8), _segment("graph conv1..fc (3 steps)", ("conv1", "conv2", "fc")))
    assert not graphs.due((0, 8)) and graphs.get((0, 8)).steps == ("conv1", "conv2", "fc")
    assert graphs.due((0, 4))
    graphs.fail((0, 4), "RuntimeError: the kernel synchronises")
    assert not graphs.due((0, 4)) and graphs.get((0, 4)) is None
    assert graphs.captured() == [(0, 8)]
    assert graphs.failures() == {(0, 4): "RuntimeError: the kernel synchronises"}
    assert graphs.named_steps() == {"graph conv1..fc (3 steps)": ("conv1", "conv2", "fc")}
    graphs.clear()
    assert graphs.captured() == [] and graphs.failures() == {} and not graphs.due((0, 8))


def test_graph_names_say_their_first_and_last_step():
    assert graph_name(["conv1"]) == "graph conv1"
    assert graph_name(["conv1", "conv2", "fc"]) == "graph conv1..fc (3 steps)"
