"""Runs take turns between two event sets, and a run's timings are read while the next run
waits for the device, or when asked: never after their events are recorded again."""
from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner
from opplugin.runtime.deferred_timings import DeferredTimings


class _Lane:
    def __init__(self):
        self.generations = []

    def start_run(self, generation=0):
        self.generations.append(generation)


def _timed(timeline, name):
    timeline.host(name, "plugin", 0, 1, timeline.now(), timeline.now())


def test_runs_take_turns_between_the_two_event_sets_and_each_reads_the_run_before():
    timings, lane = DeferredTimings(on_gpu=False), _Lane()
    first, read_before_first = timings.start([lane])
    assert read_before_first is None  # nothing ran before
    _timed(first, "a")
    second, read_first = timings.start([lane])
    _timed(second, "b")
    assert lane.generations == [1, 0]
    assert first._pending and read_first is not None
    read_first()  # what the second run's lanes do while they wait for the device
    assert not first._pending and [s.name for s in first.spans()] == ["a"]
    assert second._pending  # the run in flight is read by the one after it, or when asked


def test_a_run_whose_successor_read_nothing_is_read_before_its_events_are_recorded_again():
    timings, lane = DeferredTimings(on_gpu=False), _Lane()
    first, _ = timings.start([lane])
    _timed(first, "a")
    timings.start([lane])  # this run failed before its lanes waited (say, out of memory): nothing read
    assert first._pending
    third, _ = timings.start([lane])  # records the first run's set again
    assert lane.generations == [1, 0, 1]
    assert not first._pending and [s.name for s in first.spans()] == ["a"]


def test_each_result_keeps_its_own_step_times_however_late_they_are_read():
    model = load_model("lenet86")
    runner = Runner(model, 8, "cpu")
    results = [runner.run(make_inputs(model, 8, "random", seed=seed).feeds, step_times=True) for seed in range(4)]
    for result in results:  # read only now, after the runs that came later
        assert [t.name for t in result.times] == [s.name for s in runner.plan.steps]
        assert all(0.0 <= span.start_ms <= span.end_ms <= result.total_ms for span in result.spans)


def test_a_run_resets_its_nan_flags_before_its_timeline_records_the_origin_the_lanes_wait_for():
    """On a GPU the flags are zeroed on the caller's stream and the lanes wait only for the origin
    event: a reset after the origin could land after a lane raised a flag."""
    model = load_model("lenet86")
    runner = Runner(model, 8, "cpu")
    calls = []
    flags, start = runner.exact.flags, runner._timings.start
    runner.exact.flags = lambda chunks: calls.append("flags") or flags(chunks)
    runner._timings.start = lambda lanes: calls.append("timeline") or start(lanes)
    runner.run(make_inputs(model, 8, "random").feeds)
    assert calls == ["flags", "timeline"]


def test_a_lane_that_finds_the_reading_under_way_leaves_it_to_the_reader():
    from opplugin.runtime.timeline import Timeline

    timeline = Timeline(on_gpu=False)
    _timed(timeline, "a")
    with timeline._reading:  # another lane is reading
        timeline.settle(wait=False)  # returns at once, to go on with its chunks
        assert timeline._pending
    timeline.settle()
    assert not timeline._pending and [s.name for s in timeline.spans()] == ["a"]
