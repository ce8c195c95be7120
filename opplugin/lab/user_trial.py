"""A user's Conv kernel through the trial (trial.py): built for a bench or tune problem,
run once into a poisoned output and checked against float64, then timed with CUDA
events like every built-in variant, so that it sits in the same table."""
from __future__ import annotations

import dataclasses

from ..ops.conv.epilogue import NONE
from ..ops.conv.plugin import UnfusedEpilogueKernel
from ..user_kernels.compiler import Rejected, compile_node
from ..user_kernels.contract import conv_user_defines, user_fusable
from ..user_kernels.plugin import UserKernel, upload_weights, weights_digest
from ..user_kernels.source import KernelSource
from .trial import Capture, Trial, failed_trial, judge, time_call


def build_for_problem(source: KernelSource, spec, weights, epilogue, *, poison: bool):
    """The user kernel for a Conv spec and epilogue (its epilogue as a CuPy step when the source does not
    fuse it); `poison` fills its output with NaN before each launch, so that an unwritten element shows."""
    fuses = source.launch.fuses_epilogue and user_fusable(epilogue)
    defines = conv_user_defines(spec, epilogue if fuses else NONE)
    constant = source.launch.constant_weights
    present = [a for a in weights if a is not None]
    compiled = compile_node(source, defines, True, weights_digest(present) if constant else None)
    if constant:
        upload_weights(compiled, present)
    kernel = UserKernel(source, "bench", spec.input_shape()[1:], compiled, defines, poison=poison, spec=spec)
    return kernel if fuses or epilogue == NONE else UnfusedEpilogueKernel(kernel, epilogue)


def user_trial(problem, source: KernelSource, tolerance: float, warmup: int, repeat: int, capture: Capture | None = None):
    """A lab Trial of `source` on `problem`; never raises for a failure of the kernel itself.
    With `capture`, timed replayed from a CUDA graph, as `run` launches it by default."""
    label = source.label
    try:
        kernel = build_for_problem(source, problem.spec, problem.weights, problem.epilogue, poison=True)
    except Rejected as reason:
        return Trial(label, "unsupported", f"rejected: {reason}")
    except Exception as err:
        return failed_trial(Trial(label, "failed"), "build failed", err)
    trial = Trial(label, "ok", kernel_name=kernel.name, bytes=kernel.bytes_moved(problem.spec.batch))
    try:
        [out] = kernel(problem.inputs, None)
        verdict = judge(problem, out, tolerance)
        trial.rel_error = verdict.rel_error
        if verdict.wrong:
            return dataclasses.replace(trial, status="incorrect", reason=verdict.wrong)
        timed = build_for_problem(source, problem.spec, problem.weights, problem.epilogue, poison=False)  # as `run` runs it
        timing = time_call(lambda: timed(problem.inputs, None), warmup, repeat, capture)
        trial.ms, trial.calls, trial.timer, trial.reason = timing.ms, timing.calls, timing.timer, timing.note
    except Exception as err:
        return failed_trial(trial, "run failed", err)
    return trial
