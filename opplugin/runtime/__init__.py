"""The runtime: runs a plan on a device in chunks, on several streams, and hands
out what it ran and measured as plain records.

runner    set-up, run, out-of-memory and NaN policy
executor  one chunk through the plan; the lane threads chunks are scheduled on
lanes     where a chunk runs: the host, or one CUDA stream with pinned staging
chunking  which tensors scale with the batch, and how many images fit a budget
timeline  when each step and copy ran, on one clock
exact     the exact path for chunks with NaN or Inf after a fused step
records   the plain records report/timing.py and verify/check.py read
devices   a runner per device, one batch split in order over them (--devices)
"""
from .records import PlanRecord, Profile, RunResult, StepRecord, StepTime
from .runner import Runner

__all__ = ["PlanRecord", "Profile", "RunResult", "Runner", "StepRecord", "StepTime"]
