"""Register blocking: `const_rb_r<RT>m<MO>`, each thread computes RT output
rows x MO output maps of one column, filters in __constant__ memory, every
loop unrolled; the one family that also runs a fused activation + max pool."""
from __future__ import annotations

import re

from ... import cuda
from ..conv import ConvSpec
from ..epilogue import NONE, Epilogue
from .common import CompileUnit, Family, GridKernel, filters_maps_last, shape_defines, unroll_channels, upload_constant, weights_digest
from .direct import default_maps_per_thread

_CONFIG = re.compile(r"const_rb_r(\d+)m(\d+)")
ACCUMULATOR_BUDGET = 64  # RT x MO accumulators tuning tries at most; past this ptxas spills


def default_accumulators(spec: ConvSpec, epilogue: Epilogue) -> int:
    """The heuristic's tile size, from an H200 sweep of the shipped convs: ptxas
    hoists the unrolled loads, so big tiles cost registers and occupancy. 32
    won only where a rolled channel loop keeps the body short and nothing is
    pooled (lenet86 conv2); 16 everywhere else."""
    rolled = spec.in_channels // spec.group > 1
    return 32 if rolled and epilogue.pool is None else 16
ROWS = (2, 4, 8, 16)
MAPS = (4, 5, 8, 10, 16)  # plus the maps of one group, and fewer when a group has fewer


def _pool(epilogue: Epilogue) -> tuple[int, int]:
    return epilogue.pool or (1, 1)


def _computed_size(spec: ConvSpec, epilogue: Epilogue) -> tuple[int, int]:
    """Conv rows and columns the kernel computes: those the pool reads, or all."""
    pkh, pkw = _pool(epilogue)
    poh, pow_ = epilogue.output_size(spec.out_size)
    return poh * pkh, pow_ * pkw


class ConstRegisterBlocked(Family):
    name = "const_rb"
    summary = (
        "register blocking: each thread computes a tile of output rows x maps of one column, filters in "
        "__constant__ memory, loops unrolled; one input load feeds up to rows x maps multiply-adds; fuses act+maxpool"
    )
    constant_weights = True
    fuses = True

    def owns(self, variant):
        return variant == self.name or _CONFIG.fullmatch(variant) is not None

    @staticmethod
    def tile(variant: str) -> tuple[int, int]:
        rows, maps = _CONFIG.fullmatch(variant).groups()
        return int(rows), int(maps)

    def configs(self, spec, epilogue=NONE):
        maps_per_group = spec.out_channels // spec.group
        pkh, _ = _pool(epilogue)
        rows_needed, _ = _computed_size(spec, epilogue)
        # the most maps, then the most rows, that keep the accumulators within the
        # default budget, cover whole pool windows and leave no rows idle
        best_rows, best_maps = pkh, 1
        for maps in dict.fromkeys([default_maps_per_thread(maps_per_group), *sorted(MAPS, reverse=True), 2, 1]):
            budget = default_accumulators(spec, epilogue)
            fitting = [r for r in ROWS if r % pkh == 0 and r * maps <= budget and r <= max(pkh, rows_needed)]
            if maps <= maps_per_group and fitting and (spec.group == 1 or maps_per_group % maps == 0):
                best_rows, best_maps = max(fitting), maps
                break
        tiles = [(best_rows, best_maps)] + [
            (r, m)
            for r in ROWS
            for m in (*MAPS, min(maps_per_group, 16))
            if r * m <= ACCUMULATOR_BUDGET and m <= maps_per_group and r <= max(pkh, rows_needed)
        ]
        names = [f"const_rb_r{r}m{m}" for r, m in dict.fromkeys(tiles)]
        return [name for name in names if self.reason(spec, name, epilogue) is None]

    def reason(self, spec, variant, epilogue):
        if variant == self.name:
            return None if self.configs(spec, epilogue) else "no tile fits this Conv"
        rows, maps = self.tile(variant)
        maps_per_group = spec.out_channels // spec.group
        pkh, pkw = _pool(epilogue)
        if rows < 1 or maps < 1 or rows * maps > 2 * ACCUMULATOR_BUDGET:
            return f"{variant}: a tile of {rows} rows x {maps} maps does not fit in registers (at most {2 * ACCUMULATOR_BUDGET})"
        if maps > spec.out_channels or (spec.group > 1 and maps_per_group % maps):
            return f"{variant}: {maps} maps per thread must lie in one group of {maps_per_group} output maps"
        if rows % pkh:
            return f"{variant}: {rows} rows per thread must cover whole {pkh}-row pool windows"
        if pkw & (pkw - 1) or pkw > 32:
            return f"a {pkw}-column pool window is combined across lanes: it must be a power of 2 up to 32"
        if 0 in _computed_size(spec, epilogue):
            return "the pool window is larger than the conv output"
        return None

    def compile_units(self, spec, variant, epilogue=NONE):
        rows, maps = self.tile(variant)
        defines = shape_defines(spec, epilogue) | {
            "RT": rows,
            "MO": maps,
            "UNROLL_C": unroll_channels(spec, spec.out_channels * rows),
        }
        return [CompileUnit("conv_const_rb.cu", "conv_const_rb", defines)]

    def build(self, spec, variant, weights, epilogue=NONE):
        w, b = weights
        rows, maps = self.tile(variant)
        [unit] = self.compile_units(spec, variant, epilogue)
        module = cuda.compile_module(unit.source, unit.defines | {"OPPLUGIN_WEIGHTS_DIGEST": weights_digest(w, b)})
        function = module.get_function(unit.function)
        upload_constant(module, "filters", filters_maps_last(w))
        if b is not None:
            upload_constant(module, "bias", b)
        computed_rows, computed_cols = _computed_size(spec, epilogue)
        row_tiles = -(-computed_rows // rows)
        return GridKernel(
            spec,
            f"conv.{variant}{epilogue.suffix}",
            function,
            threads_per_image=row_tiles * computed_cols,
            grid_y=-(-spec.out_channels // maps),
            reads_weights=False,
            epilogue=epilogue,
        )


FAMILIES: list[Family] = [ConstRegisterBlocked()]
