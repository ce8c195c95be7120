"""Host time per plugin step: what the runtime costs the CPU for each step it runs.

    PYTHONPATH=$PWD python3 tools/host_step_bench.py [--device cuda] [--profile] [--json FILE]

The model is a chain of tiny 3x3 Convs (2 maps of 4x4, one image), so the device work
per step is about a microsecond and a run's wall time is the host's. (With 8 maps of 8x8
a step's kernel took about 9 µs on an H200, one thread's chain of multiply-adds, which
hid any host time below that.) Two chains
of different length run through one kind of Runner each; the difference of their
median host-to-host times over the difference of their step counts is the host time
per step, free of the fixed cost of a run (copies in and out, the final wait). Under a
CUDA graph that is the device's time per step.

Rows: eager (every step launched from Python, `cuda_graphs=False`; on a GPU, steps on the
same buffers as last run are replayed from their recorded launches, runtime/eager_replay.py) and, on a GPU,
graphed (the default: each run of steps replayed as one CUDA graph, without the
events that time each step, as `profile` times host to host) and graphed with those
step events (as `profile` takes its step table): the difference is what the events
cost. Each row also gives the fixed host cost of a run, from the same two chains, and
the host time per step spent enqueueing (in the executor's runs of plugin steps, up to
the last launch, not waiting for the device). Eager steps record an event between
steps, and the device takes a few µs for each, so an eager run host to host can be
bound by the device rather than by the host; the enqueue figure is the host's alone.

`--profile` prints where eager runs of the long chain spend their host time
(cProfile), and on a GPU graphed ones too. On the CPU the kernels are replaced by
ones that hand back their first result, so that the profile shows the runtime's own
path per step (the same there as on a GPU, less the CUDA calls) rather than numpy's
convolutions.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opplugin.gpu.device import select_device
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

CHANNELS, SIZE = 2, 4
TARGET_US = 10.0  # issue 25: at most 10 µs of host time per eager plugin step, median


def conv_chain(steps: int) -> onnx.ModelProto:
    """`steps` 3x3 Convs in a row, CHANNELS -> CHANNELS maps at SIZE x SIZE, each with its own weights."""
    rng = np.random.default_rng(steps)
    nodes, weights = [], []
    for index in range(steps):
        w = numpy_helper.from_array(rng.standard_normal((CHANNELS, CHANNELS, 3, 3)).astype(np.float32) * 0.1, f"w{index}")
        weights.append(w)
        nodes.append(helper.make_node("Conv", ["x" if index == 0 else f"t{index}", w.name],
                                      [f"t{index + 1}" if index + 1 < steps else "y"], name=f"conv{index}", pads=[1, 1, 1, 1]))
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "conv_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def load_chain(steps: int, folder: Path):
    path = folder / f"chain{steps}.onnx"
    onnx.save(conv_chain(steps), path)
    return load_model(path)


def run_ms(runner: Runner, feeds: dict, step_times: bool) -> float:
    """The host-to-host time of one run, as the caller sees it (the result's records included)."""
    started = time.perf_counter()
    runner.run(feeds, step_times=step_times)
    return (time.perf_counter() - started) * 1e3


def per_step_us(short, long, device, cuda_graphs: bool, repeat: int, step_events: bool = True) -> dict:
    """µs of host time per plugin step and the fixed cost of a run (the short chain's time less
    its steps'); without `step_events`, graphs replay without the events that time each step.

    The two chains run in turns, and the per-step figure is the median over the turns of the
    difference of their times over the difference of their step counts: a host whose speed
    drifts (other work on a shared machine) moves both runs of a turn alike."""
    feeds = {"x": np.random.default_rng(0).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32)}
    runners = [Runner(model, 1, device, chunk=1, streams=1, cuda_graphs=cuda_graphs) for model in (short, long)]
    runners.sort(key=lambda r: len(r.plan.plugin_steps))
    few, many = (len(r.plan.plugin_steps) for r in runners)
    enqueue = [_EnqueueClock(runner.executor) for runner in runners]
    for _ in range(3):  # compile, capture, record, settle
        for runner in runners:
            runner.run(feeds, step_times=step_events)
    turns = []
    for _ in range(repeat):
        turn = []
        for runner, clock in zip(runners, enqueue):
            clock.seconds = 0.0
            turn += [run_ms(runner, feeds, step_events), clock.seconds * 1e3]
        turns.append(turn)
    def per_step(short_ms: float, long_ms: float) -> float:
        return (long_ms - short_ms) * 1e3 / (many - few)

    us_per_step = statistics.median(per_step(t[0], t[2]) for t in turns)
    few_ms, many_ms = (statistics.median(t[k] for t in turns) for k in (0, 2))
    replays = runners[1].scheduler.lanes[0].replays  # how many of the long chain's steps an eager run replays
    return {"steps": [few, many], "run_ms": [few_ms, many_ms], "us_per_step": us_per_step,
            "enqueue_us_per_step": statistics.median(per_step(t[1], t[3]) for t in turns),
            "us_per_run": few_ms * 1e3 - few * us_per_step, "replayed_steps": len(replays) if replays is not None else 0}


class _EnqueueClock:
    """Host seconds an executor spends in its runs of plugin steps: looking up, launching and
    timing each step, up to the last launch, without waiting for the device."""

    def __init__(self, executor):
        self.seconds = 0.0
        run_of_steps = executor._plugin_run

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return run_of_steps(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        executor._plugin_run = timed


class _FirstResult:
    """A kernel that hands back what the kernel it stands for returned the first time: the
    runtime's path per step without the step's work (for profiling on the CPU)."""

    def __init__(self, kernel, outputs):
        self.kernel, self.outputs = kernel, outputs

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __call__(self, inputs, stream=None, **out):
        return list(self.outputs)


def without_kernel_work(runner: Runner, feeds: dict) -> None:
    """Every kernel of the runner's executor replaced by its first result (see _FirstResult)."""
    kept = runner.run(feeds, keep=tuple(step.outputs[0] for step in runner.plan.plugin_steps)).kept
    for step in runner.plan.plugin_steps:
        runner.executor.kernels[step.name] = _FirstResult(runner.executor.kernels[step.name],
                                                          [kept[name] for name in step.outputs])


def profile_runs(model, device, cuda_graphs: bool = False, runs: int = 20, top: int = 25) -> None:
    """cProfile of `runs` runs, eager or (on a GPU) replayed as CUDA graphs without step events."""
    feeds = {"x": np.random.default_rng(0).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32)}
    runner = Runner(model, 1, device, chunk=1, streams=1, cuda_graphs=cuda_graphs)
    if not device.is_cuda:
        without_kernel_work(runner, feeds)
    for _ in range(3):  # compile, capture, settle
        runner.run(feeds, step_times=False)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(runs):
        runner.run(feeds, step_times=False)
    profiler.disable()
    steps = runs * len(runner.plan.plugin_steps)
    what = "" if device.is_cuda else ", each kernel handing back its first result"
    how = "graphed runs (no step events)" if cuda_graphs else "eager runs"
    print(f"\ncProfile of {runs} {how} ({steps} plugin steps{what}), by own time:")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--steps", type=int, nargs=2, default=(8, 40), metavar=("SHORT", "LONG"), help="the two chains' lengths")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per chain (median)")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of eager runs of the long chain")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    device = select_device(args.device)
    with tempfile.TemporaryDirectory() as folder:
        short, long = (load_chain(n, Path(folder)) for n in args.steps)
        rows = {"eager": per_step_us(short, long, device, False, args.repeat)}
        if device.is_cuda:
            rows["graphed"] = per_step_us(short, long, device, True, args.repeat, step_events=False)
            rows["graphed, step events"] = per_step_us(short, long, device, True, args.repeat)
        where = device.name if device.is_cuda else "CPU (numpy reference kernels: their compute counts too)"
        print(f"Host time per plugin step, chains of {args.steps[0]} and {args.steps[1]} 3x3 Convs "
              f"({CHANNELS} maps of {SIZE}x{SIZE}, batch 1), on {where}:")
        for label, row in rows.items():
            replayed = f", {row['replayed_steps']} of {row['steps'][1]} steps replayed" if row["replayed_steps"] else ""
            print(f"  {label:24s} {row['us_per_step']:7.2f} µs/step  {row['enqueue_us_per_step']:7.2f} µs/step enqueued  "
                  f"{row['us_per_run']:7.1f} µs/run   (runs: {row['run_ms'][0]:.3f} ms, {row['run_ms'][1]:.3f} ms{replayed})")
        if device.is_cuda:
            for figure, what in (("us_per_step", "host to host"), ("enqueue_us_per_step", "enqueued")):
                verdict = "meets" if rows["eager"][figure] <= TARGET_US else "misses"
                print(f"  eager, {what}: {rows['eager'][figure]:.2f} µs/step {verdict} the target of {TARGET_US:.0f} µs/step")
        if args.json:
            Path(args.json).write_text(json.dumps({"device": device.name, "rows": rows}, indent=2))
        if args.profile:
            profile_runs(long, device)
            if device.is_cuda:
                profile_runs(long, device, cuda_graphs=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
