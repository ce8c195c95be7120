"""`fp16_m<MO>` (kernels/conv_fp16.cu): FP16 arithmetic, two pixels per thread as a half2, MO
maps per thread, filters in __constant__ memory as half2 {w, w}; FP32 in and out. Not FP32-exact
(exact=False): it runs only when named, never by the heuristic or tuning.

It states its accuracy as `expected_relative_error` (the relative L2 error against a float64
reference one should see on standard-normal data) and `max_relative_error` (the bound the GPU
tests hold it to).
"""
from __future__ import annotations


import numpy as np

from ..epilogue import NONE
from .base import CompileUnit, Family, GridKernel, filter_constants, shape_defines
from .base import unroll_channels
from .direct import MapsConfig, default_maps_per_thread


FP16_MAX_MAPS = 32  # three registers per map (two FP32 sums, one half2 partial)
FLUSH_TAPS = 16  # half2 partial sums cover about this many taps before going to FP32


def half2_pairs(w: np.ndarray) -> np.ndarray:
    """Filters [M][C/G][KH][KW] -> uint32 [C/G][KH][KW][M], each the half2 {w, w}."""
    half = np.moveaxis(np.asarray(w, dtype=np.float32), 0, -1).astype(np.float16).view(np.uint16).astype(np.uint32)
    return (half << 16) | half


class Fp16(Family):
    name = "fp16"
    summary = (
        "FP16 arithmetic (opt-in, not exact): half2 pairs of pixels, inputs converted on load, filters as half2 "
        "in __constant__ memory, FP32 sums every ~16 taps and FP32 output; relative L2 error ~6e-4"
    )
    exact = False
    precision = "fp16"
    constant_weights = True
    # measured on an H200, standard-normal data, batch 10000: 6.0e-4 to 6.3e-4 on the shipped convs
    # (flushing to FP32 once per channel instead of every ~16 taps: 1.1e-3, 3-8% faster)
    expected_relative_error = 7e-4
    max_relative_error = 4e-3
    config_type = MapsConfig

    def configs(self, spec, epilogue=NONE):
        maps_per_group = spec.out_channels // spec.group
        counts = dict.fromkeys([min(default_maps_per_thread(maps_per_group), FP16_MAX_MAPS), 8, 4])
        configs = [MapsConfig(self.name, n) for n in counts if n <= maps_per_group]
        return [c for c in configs if self.reason(spec, c, epilogue) is None] or [MapsConfig(self.name, min(maps_per_group, FP16_MAX_MAPS))]

    def reason(self, spec, config, epilogue):
        maps = config.maps
        maps_per_group = spec.out_channels // spec.group
        if not 1 <= maps <= min(spec.out_channels, FP16_MAX_MAPS):
            return f"{config} computes {maps} maps per thread; this Conv has {spec.out_channels} and at most {FP16_MAX_MAPS} fit in registers"
        if spec.group > 1 and maps_per_group % maps:
            return f"{config}: with group={spec.group} the {maps} maps of a thread must lie in one group of {maps_per_group}"
        return None

    def compile_units(self, spec, config, epilogue=NONE):
        defines = shape_defines(spec) | {
            "MO": config.maps,
            "UNROLL_C": unroll_channels(spec, spec.out_channels),
            "FLUSH_ROWS": max(1, FLUSH_TAPS // spec.kernel[1]),
        }
        return [CompileUnit("conv_fp16.cu", "conv_fp16", defines)]

    def module_constants(self, spec, config, weights):
        # the half2 bits travel unchanged through the upload's float32 view
        return filter_constants(weights, lambda w: half2_pairs(w).view(np.float32))

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        oh, ow = spec.out_size
        return GridKernel(
            spec,
            config,
            function,
            threads_per_image=oh * -(-ow // 2),
            grid_y=-(-spec.out_channels // config.maps),
            reads_weights=False,
        )


FAMILIES: list[Family] = [Fp16()]
