"""The direct variants: one thread per output pixel, walking the whole filter
window. `baseline` reads the weights from global memory (so it also serves
weights computed at run time); `const` puts them in __constant__ memory;
`const_mo_m<N>` makes each thread compute N output maps from one set of input
loads."""
from __future__ import annotations

import math

from dataclasses import dataclass

from ...config_grammar import Config, tagged
from ..epilogue import NONE
from ..spec import ConvSpec
from .base import CompileUnit, Family, GridKernel, filter_constants, filters_maps_last
from .base import map_groups_reason, shape_defines, unroll_channels

MAX_MAPS_PER_THREAD = 64  # beyond this the accumulators no longer fit in registers


def default_maps_per_thread(maps: int) -> int:
    """All maps when there are few (one group: every filter index a literal),
    else the largest divisor of `maps` between 16 and 8 (no short group), else 8."""
    if maps <= 16:
        return maps
    for count in range(16, 7, -1):
        if maps % count == 0:
            return count
    return 8


@dataclass(frozen=True)
class MapsConfig(Config):
    """Each thread computes `maps` output maps of its pixel(s)."""

    maps: int = tagged("m")


def pixels(spec: ConvSpec) -> int:
    return spec.out_size[0] * spec.out_size[1]


class Baseline(Family):
    name = "baseline"
    summary = "one thread per output element; weights read from global memory (also run-time weights)"

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec) | {"UNROLL_C": unroll_channels(spec, 1)}
        return [CompileUnit("conv_baseline.cu", "conv_baseline", defines)]

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return GridKernel(spec, config, function, threads_per_image=pixels(spec), grid_y=spec.out_channels, reads_weights=True)


class Const(Family):
    name = "const"
    summary = "one thread per output element; filters and bias in __constant__ memory, shape compiled in"
    constant_weights = True

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec) | {"UNROLL_C": unroll_channels(spec, 1)}
        return [CompileUnit("conv_const.cu", "conv_const", defines)]

    def module_constants(self, spec, config, weights):
        return filter_constants(weights)

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        return GridKernel(spec, config, function, threads_per_image=pixels(spec), grid_y=spec.out_channels, reads_weights=False)


class ConstMultiOutput(Family):
    name = "const_mo"
    summary = "filters in __constant__ memory; each thread computes several output maps of one pixel"
    constant_weights = True
    config_type = MapsConfig

    def configs(self, spec, epilogue=NONE):
        maps_per_group = spec.out_channels // spec.group
        counts = dict.fromkeys([default_maps_per_thread(maps_per_group), 1, 2, 4, 8, 16, 32])
        return [MapsConfig(self.name, n) for n in counts if n <= min(maps_per_group, MAX_MAPS_PER_THREAD)]

    def reason(self, spec, config, epilogue):
        maps = config.maps
        maps_per_group = spec.out_channels // spec.group
        if not 1 <= maps <= min(spec.out_channels, MAX_MAPS_PER_THREAD):
            return (
                f"{config} computes {maps} maps per thread; this Conv has {spec.out_channels} output maps "
                f"and at most {MAX_MAPS_PER_THREAD} fit in registers"
            )
        if spec.group > 1 and maps_per_group % maps:
            return f"{config}: with group={spec.group} the {maps} maps of a thread must lie in one group of {maps_per_group}"
        return map_groups_reason(spec, config, maps, math.prod(spec.kernel) * unroll_channels(spec, spec.out_channels))

    def compile_units(self, spec, config, epilogue=NONE):
        # one copy of the loop per map group: M multiply-adds per tap in the whole kernel
        defines = shape_defines(spec) | {"MO": config.maps, "UNROLL_C": unroll_channels(spec, spec.out_channels)}
        return [CompileUnit("conv_const_mo.cu", "conv_const_mo", defines)]

    def module_constants(self, spec, config, weights):
        return filter_constants(weights, filters_maps_last)

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        grid_y = -(-spec.out_channels // config.maps)
        return GridKernel(spec, config, function, threads_per_image=pixels(spec), grid_y=grid_y, reads_weights=False)


FAMILIES: list[Family] = [Baseline(), Const(), ConstMultiOutput()]
