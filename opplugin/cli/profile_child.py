"""The process `opplugin profile` runs under Nsight Compute. Argument: a pickle of (Workload, step
indices) its parent wrote. It builds the runner as the command would (eager), runs the batch once,
keeping each chosen step's inputs, then calls each chosen step's kernel on them: once to warm up,
once inside the NVTX range ncu.RANGE_PREFIX + index, which is all the profiler looks at."""
from __future__ import annotations

import pickle
import sys


def main(argv: list[str]) -> int:
    import cupy
    from cupy.cuda import nvtx

    from ..errors import OpPluginError
    from ..lab.ncu import RANGE_PREFIX
    from .workload import prepare

    with open(argv[0], "rb") as spec:
        workload, indices = pickle.load(spec)
    try:
        prepared = prepare(workload, poison=False)
        runner = prepared.runner
        steps = [runner.plan.steps[i] for i in indices]
        wanted = tuple(dict.fromkeys(n for s in steps for n in s.inputs if n and n not in runner.constants))
        kept = runner.run(prepared.inputs.feeds, keep=wanted, as_stored=True).kept  # as each kernel takes them
        for index, step in zip(indices, steps):
            kernel = runner.kernels[step.name]
            args = [None if not n else runner.constants[n] if n in runner.constants else cupy.asarray(_rows(kept[n], runner))
                    for n in step.inputs]
            kernel(args, None)
            cupy.cuda.Device().synchronize()
            nvtx.RangePush(f"{RANGE_PREFIX}{index}")
            kernel(args, None)
            cupy.cuda.Device().synchronize()
            nvtx.RangePop()
    except OpPluginError as err:
        print(f"opplugin: {err}", file=sys.stderr)
        return 2
    return 0


def _rows(value, runner):
    """A batched tensor cut to the chunk the step's kernel was built for."""
    return value[:runner.chunk] if value.ndim and value.shape[0] == runner.plan.batch else value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
