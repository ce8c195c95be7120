"""Without a GPU, the custom nodes' CUDA C kernels compiled by NVRTC alone: an error in a file
stops `plan`, `run` and `check` on any machine, at the file's line, as it would on a GPU."""
from __future__ import annotations

from ..user_kernels.compiler import Rejected
from .cuda_source import CudaSource
from .declaration import CustomOp


def compile_cuda_sources(plan) -> list[str]:
    """Compile each CudaSource of each custom step for its node (NVRTC's fast mode, sm_90); a line
    per compile saying what came of it, or one saying NVRTC is not installed. A compile error raises."""
    from ..gpu.nvrtc import NvrtcUnavailable

    lines = []
    for step in plan.plugin_steps:
        op = step.plugin
        if not isinstance(op, CustomOp):
            continue
        for implementation in op.implementations:
            if not isinstance(implementation, CudaSource):
                continue
            try:
                implementation.compile_offline(op, step.node)
            except Rejected as reason:
                lines.append(f"{step.name}: {implementation.name} rejects it ({reason}); on a GPU the next kernel runs it")
            except NvrtcUnavailable as err:
                return [f"custom CUDA kernels not compiled here: {err}"]
            else:
                lines.append(f"{step.name}: {implementation.name} compiles (NVRTC alone, sm_90; it runs on a GPU)")
    return lines
