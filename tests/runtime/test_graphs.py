"""SegmentGraphs' book-keeping, which needs no device: a run of plugin steps gets its graph
the second time it is met, and a run whose capture failed stays eager with its reason."""
from opplugin.runtime.graphs import SegmentGraph, SegmentGraphs, graph_name
from opplugin.runtime.nonfinite import slot_runs


def _segment(name: str, steps: tuple[str, ...]) -> SegmentGraph:
    return SegmentGraph(name, steps, graph=None, inputs={}, outputs={}, pool=None)


# runs of steps as a lane meets them: (first step, chunk rows, kept outputs)
EIGHT, FOUR = (0, 8, frozenset()), (0, 4, frozenset())


def test_a_run_is_due_for_capture_the_second_time_it_is_met_and_never_after_a_failure():
    graphs = SegmentGraphs()
    assert not graphs.due(EIGHT) and graphs.due(EIGHT)  # the first pass runs eagerly
    assert not graphs.due(FOUR)
    graphs.add(EIGHT, _segment("graph conv1..fc (3 steps)", ("conv1", "conv2", "fc")))
    assert not graphs.due(EIGHT) and graphs.get(EIGHT).steps == ("conv1", "conv2", "fc")
    assert graphs.due(FOUR)
    graphs.fail(FOUR, "RuntimeError: the kernel synchronises")
    assert not graphs.due(FOUR) and graphs.get(FOUR) is None
    assert graphs.captured() == [EIGHT]
    assert graphs.failures() == {FOUR: "RuntimeError: the kernel synchronises"}
    assert graphs.named_steps() == {"graph conv1..fc (3 steps)": ("conv1", "conv2", "fc")}
    graphs.clear()
    assert graphs.captured() == [] and graphs.failures() == {} and not graphs.due(EIGHT)


def test_a_run_that_keeps_an_intermediate_is_a_run_of_its_own():
    graphs = SegmentGraphs()
    graphs.add(EIGHT, _segment("graph conv1..fc (3 steps)", ("conv1", "conv2", "fc")))
    keeping = (0, 8, frozenset({"conv1_out"}))  # the graph of EIGHT does not return conv1's output
    assert graphs.get(keeping) is None and not graphs.due(keeping) and graphs.due(keeping)


def test_a_graphs_flag_slots_go_home_in_one_copy_per_run_of_consecutive_slots():
    # (first slot, place among the graph's flags, count)
    assert slot_runs([4, 5, 6, 9, 10, 2]) == ((4, 0, 3), (9, 3, 2), (2, 5, 1))
    assert slot_runs([7]) == ((7, 0, 1),) and slot_runs([]) == ()


def test_graph_names_say_their_first_and_last_step():
    assert graph_name(["conv1"]) == "graph conv1"
    assert graph_name(["conv1", "conv2", "fc"]) == "graph conv1..fc (3 steps)"


def test_step_clock_shares_an_event_between_consecutive_steps_and_pauses_for_untimed_work(monkeypatch):
    from opplugin.gpu import cuda
    from opplugin.runtime.graphs import StepClock

    recorded = []
    monkeypatch.setattr(cuda, "event", lambda: object())
    monkeypatch.setattr(cuda, "record_in_capture", lambda event, stream: recorded.append((event, stream)))
    clock = StepClock(stream="s")
    for step in ("conv1", "conv2"):
        clock.start()
        clock.stop(step)
    clock.pause()  # a NaN/Inf flag written here belongs to no step
    clock.start()
    clock.stop("fc")
    (a, start1, end1), (b, start2, end2), (c, start3, end3) = clock.marks
    assert (a, b, c) == ("conv1", "conv2", "fc")
    assert end1 is start2 and start3 is not end2  # shared, then a fresh start after the pause
    assert len(recorded) == 5 and {stream for _e, stream in recorded} == {"s"}
    untimed = StepClock()  # no stream: a capture without events records nothing
    untimed.start()
    untimed.stop("conv1")
    assert untimed.marks == []


def test_a_graphs_replay_is_no_step_row_but_its_total_is_kept():
    from opplugin.runtime.records import graph_totals, sum_by_step
    from opplugin.runtime.timeline import GRAPH, Span

    spans = [Span("graph conv1..fc (2 steps)", GRAPH, 0, 1, 0.0, 1.0), Span("conv1", "plugin", 0, 2, 0.1, 0.5),
             Span("fc", "plugin", 0, 3, 0.5, 0.9), Span("graph conv1..fc (2 steps)", GRAPH, 1, 1, 2.0, 3.5),
             Span("conv1", "plugin", 1, 2, 2.1, 2.6), Span("fc", "plugin", 1, 3, 2.6, 3.4)]
    times = sum_by_step(spans)
    assert [t.name for t in times] == ["conv1", "fc"]
    assert [round(t.ms, 6) for t in times] == [0.9, 1.2]
    assert graph_totals(spans) == {"graph conv1..fc (2 steps)": 2.5}


def _report(**graphs):
    rows = [{"step": "conv1", "time_ms": 0.4}, {"step": "fc", "time_ms": 0.3}]
    return {"steps": rows, **graphs}


def test_the_text_says_how_graphed_steps_were_timed_and_which_runs_ran_eagerly():
    from opplugin.report.timing import _graph_lines

    name = "graph conv1..fc (2 steps)"
    [line] = _graph_lines(_report(cuda_graphs={name: ["conv1", "fc"]}, cuda_graph_ms={name: 0.75}))
    assert line == ("CUDA graphs: 1 graph(s) replayed 2 plugin steps; step times from events inside the graphs: "
                    "0.700 ms of the replays' 0.750 ms (the rest: input copies and launch)")
    [line] = _graph_lines(_report(cuda_graphs={name: ["conv1", "fc"]}, cuda_graph_ms={name: 0.75}, cuda_graph_untimed_ms={name: 0.5}))
    assert line.endswith("(the rest: input copies and launch); without those events the replays take 0.500 ms, "
                         "and host to host is timed on such runs")
    [line] = _graph_lines(_report(cuda_graphs={name: ["conv1", "fc"]}, cuda_graph_ms={}))
    assert line.endswith("graphs without events inside are timed as one row each")
    lines = _graph_lines(_report(cuda_graph_failures={"conv1": "CUDARuntimeError: operation not permitted when stream is capturing"}))
    assert lines == ["CUDA graph: the plugin steps from conv1 ran eagerly: CUDARuntimeError: operation not permitted when stream is capturing"]
    assert _graph_lines(_report()) == []


def test_graphs_are_on_unless_no_cuda_graphs_is_typed():
    from opplugin.cli.commands import build_parser

    parser = build_parser()
    for command in ("run", "check"):
        assert parser.parse_args([command]).cuda_graphs is None  # the default: on where there is a GPU
        assert parser.parse_args([command, "--no-cuda-graphs"]).cuda_graphs is False
        assert parser.parse_args([command, "--cuda-graphs"]).cuda_graphs is True  # still accepted


def test_a_runner_asks_for_graphs_by_default_and_runs_eagerly_on_the_cpu_without_a_word(tiny_model_path, capsys):
    import inspect

    import numpy as np

    from opplugin.graph.model import load_model
    from opplugin.runtime import Runner

    assert inspect.signature(Runner).parameters["cuda_graphs"].default is True
    runner = Runner(load_model(tiny_model_path), 4, "cpu")
    assert not runner.cuda_graphs
    feeds = {"x": np.random.default_rng(1).standard_normal((4, 3, 12, 12)).astype(np.float32)}
    for _ in range(2):
        result = runner.run(feeds, step_times=True)
        assert not result.graphs and not result.graph_failures and not result.graph_ms
        assert [t.name for t in result.times] == [s.name for s in runner.plan.steps]
    assert capsys.readouterr().err == ""


def test_a_run_gets_a_timed_and_an_untimed_graph_the_second_sharing_the_firsts_buffers():
    graphs = SegmentGraphs()
    assert not graphs.due((0, 8, frozenset()), timed=False)  # first met (in either kind): eager
    timed = SegmentGraph("graph conv1..fc (2 steps)", ("conv1", "fc"), graph=None, inputs={"x": "buffer"}, outputs={},
                         pool="pool", timed=True)
    assert graphs.due((0, 8, frozenset()), timed=True)
    graphs.add((0, 8, frozenset()), timed)
    assert graphs.get((0, 8, frozenset()), timed=True) is timed and graphs.get((0, 8, frozenset()), timed=False) is None
    assert graphs.due((0, 8, frozenset()), timed=False) and not graphs.due((0, 8, frozenset()), timed=True)
    assert graphs.sibling((0, 8, frozenset()), timed=False) is timed and graphs.sibling((0, 8, frozenset()), timed=True) is None
    graphs.add((0, 8, frozenset()), SegmentGraph(timed.name, timed.steps, graph=None, inputs=timed.inputs, outputs={}, pool=timed.pool,
                                    timed=False))
    assert not graphs.due((0, 8, frozenset()), timed=False) and graphs.get((0, 8, frozenset()), timed=False).pool == "pool"
    assert graphs.captured() == [(0, 8, frozenset())] and graphs.named_steps() == {timed.name: ("conv1", "fc")}


def test_an_untimed_replay_leaves_its_steps_without_rows_and_a_profile_takes_its_wall_clock_from_it():
    from opplugin.runtime.records import Profile, RunResult, RunTiming
    from opplugin.runtime.timeline import GRAPH, Span

    graph = "graph conv1..fc (2 steps)"
    timed = RunResult({}, {}, total_ms=2.0, timing=RunTiming.of(
        [Span(graph, GRAPH, 0, 1, 0.0, 0.75), Span("conv1", "plugin", 0, 2, 0.0, 0.5), Span("fc", "plugin", 0, 3, 0.5, 0.75)],
        {graph: ("conv1", "fc")}))
    untimed = RunResult({}, {}, total_ms=1.2, timing=RunTiming.of([Span(graph, GRAPH, 0, 1, 0.0, 0.6)], {graph: ("conv1", "fc")}))
    profile = Profile(plan=None, result=timed)
    profile.add(timed, untimed)
    profile.add(timed)  # eager: one run gives both
    assert profile.total_ms == [1.2, 2.0]
    assert profile.step_ms == {"conv1": [0.5, 0.5], "fc": [0.25, 0.25]}
    assert profile.graph_ms == {"graph conv1..fc (2 steps)": [0.75, 0.75]}
    assert profile.untimed_graph_ms == {"graph conv1..fc (2 steps)": [0.6]}
