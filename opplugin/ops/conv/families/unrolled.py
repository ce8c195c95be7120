"""`unrolled`: the seeds' "__restrict__ and loop unrolling" step on its own.

Same work as `baseline` (one thread per output element, weights read from
global memory at call time), with `const float* __restrict__` pointers and
every filter loop unrolled at compile time; `baseline` is the plain version
without either, so the two differ by exactly this step.
"""
from __future__ import annotations

from ..epilogue import NONE
from .base import CompileUnit, Family, GridKernel, shape_defines, unroll_channels
from .direct import pixels


class Unrolled(Family):
    name = "unrolled"
    summary = (
        "baseline with __restrict__ pointers and every filter loop unrolled (compile-time bounds); "
        "weights from global memory (also run-time weights)"
    )

    def compile_units(self, spec, config, epilogue=NONE):
        # the channel loop unrolls fully too, unless the unrolled body would be huge
        defines = shape_defines(spec) | {"UNROLL_C": unroll_channels(spec, 1)}
        return [CompileUnit("conv_unrolled.cu", "conv_unrolled", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return GridKernel(spec, config, function, threads_per_image=pixels(spec), grid_y=spec.out_channels, reads_weights=True)


FAMILIES: list[Family] = [Unrolled()]
