"""Register blocking, filters in __constant__ memory, fused epilogue (residual, activation, max pool):

- `const_rb_t<RT>x1_m<MO>`: each thread computes RT output rows x MO output maps
  of one column, every loop unrolled;
- `const_tile_t<RT>x<XT>_m<MO>`: RT rows x XT columns x MO maps, filter-row
  and channel loops rolled when unrolling would bloat the body."""
from __future__ import annotations

import math

from dataclasses import dataclass

from ...config_grammar import Config, tagged
from ..epilogue import NONE, Epilogue
from ..spec import ConvSpec
from .base import UNROLL_BUDGET, CompileUnit, Family, GridKernel, filter_constants, filters_maps_last
from .base import map_groups_reason, shape_defines, unroll_channels
from .direct import default_maps_per_thread

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


@dataclass(frozen=True)
class ThreadTileConfig(Config):
    """Each thread computes rows x columns output pixels of `maps` output maps."""

    tile: tuple[int, int] = tagged("t", 2)  # rows x columns
    maps: int = tagged("m")

    @property
    def rows(self) -> int:
        return self.tile[0]

    @property
    def cols(self) -> int:
        return self.tile[1]


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
        "__constant__ memory, loops unrolled; one input load feeds up to rows x maps multiply-adds; fuses a residual Add, an activation and a max pool"
    )
    constant_weights = True
    fuses = True
    config_type = ThreadTileConfig

    def config(self, rows: int, maps: int) -> ThreadTileConfig:
        return ThreadTileConfig(self.name, (rows, 1), maps)

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
        configs = [self.config(r, m) for r, m in dict.fromkeys(tiles)]
        return [config for config in configs if self.reason(spec, config, epilogue) is None]

    def unconfigured_reason(self, spec, epilogue):
        return f"no tile fits this Conv (the smallest: {self.reason(spec, self.config(1, 1), epilogue)})"

    def reason(self, spec, config, epilogue):
        rows, maps = config.rows, config.maps
        maps_per_group = spec.out_channels // spec.group
        pkh, pkw = _pool(epilogue)
        if config.cols != 1:
            return f"{config}: a thread computes one column ({self.name}_t<rows>x1_m<maps>); const_tile takes more"
        if rows < 1 or maps < 1 or rows * maps > 2 * ACCUMULATOR_BUDGET:
            return f"{config}: a tile of {rows} rows x {maps} maps does not fit in registers (at most {2 * ACCUMULATOR_BUDGET})"
        if maps > spec.out_channels or (spec.group > 1 and maps_per_group % maps):
            return f"{config}: {maps} maps per thread must lie in one group of {maps_per_group} output maps"
        if rows % pkh:
            return f"{config}: {rows} rows per thread must cover whole {pkh}-row pool windows"
        if pkw & (pkw - 1) or pkw > 32:
            return f"a {pkw}-column pool window is combined across lanes: it must be a power of 2 up to 32"
        if 0 in _computed_size(spec, epilogue):
            return "the pool window is larger than the conv output"
        unrolled_per_map = rows * math.prod(spec.kernel) * unroll_channels(spec, spec.out_channels * rows)
        return map_groups_reason(spec, config, maps, unrolled_per_map)

    def compile_units(self, spec, config, epilogue=NONE):
        rows, maps = config.rows, config.maps
        defines = shape_defines(spec, epilogue) | {
            "RT": rows,
            "MO": maps,
            "UNROLL_C": unroll_channels(spec, spec.out_channels * rows),
        }
        return [CompileUnit("conv_const_rb.cu", "conv_const_rb", defines)]

    def module_constants(self, spec, config, weights):
        return filter_constants(weights, filters_maps_last)

    def build(self, spec, config, weights, epilogue=NONE):
        [function] = self.load(spec, config, weights, epilogue)
        computed_rows, computed_cols = _computed_size(spec, epilogue)
        row_tiles = -(-computed_rows // config.rows)
        return GridKernel(
            spec,
            config,
            function,
            threads_per_image=row_tiles * computed_cols,
            grid_y=-(-spec.out_channels // config.maps),
            reads_weights=False,
            epilogue=epilogue,
            residual_parameter=True,
        )


TILE_ROWS = (1, 2, 4, 8)
TILE_COLS = (1, 2, 4, 8)
TILE_UNROLL_BUDGET = 2 * UNROLL_BUDGET  # multiply-adds per unrolled body: lenet86 conv1's 2 x 4 x 4 tile fits


def _lanes_per_window(rows: int, cols: int, epilogue: Epilogue) -> int:
    """Lanes that share one pool window: 1 when a tile covers whole windows."""
    pkh, pkw = _pool(epilogue)
    return max(pkh // rows, 1) * max(pkw // cols, 1)


class ConstTile(Family):
    name = "const_tile"
    summary = (
        "register tile of rows x columns x maps per thread, filters in __constant__ memory; each constant load "
        "feeds rows x columns multiply-adds, so a rolled channel loop stays FFMA-bound; fuses a residual Add, an activation and a max pool"
    )
    constant_weights = True
    fuses = True
    config_type = ThreadTileConfig

    def config(self, rows: int, cols: int, maps: int) -> ThreadTileConfig:
        return ThreadTileConfig(self.name, (rows, cols), maps)

    def configs(self, spec, epilogue=NONE):
        maps_per_group = spec.out_channels // spec.group
        rows_needed, cols_needed = _computed_size(spec, epilogue)
        # maps that split a group evenly (short last groups waste lanes), at least 4 where the group allows
        largest_divisor = max(m for m in range(1, min(maps_per_group, 16) + 1) if maps_per_group % m == 0)
        map_choices = dict.fromkeys([m for m in MAPS if maps_per_group % m == 0] + [min(maps_per_group, 16), largest_divisor])
        tiles = [
            (r, x, m)
            for m in sorted(map_choices, reverse=True)
            for r in TILE_ROWS
            for x in TILE_COLS
            if r * x * m <= ACCUMULATOR_BUDGET and r <= rows_needed and x <= cols_needed
        ]
        tiles.sort(key=lambda t: (t[0] * t[1] * t[2], t[2], t[1]), reverse=True)
        tiles = [t for t in tiles if self.reason(spec, self.config(*t), epilogue) is None]
        # fewer than 16 accumulators leave the loads in charge: not worth tuning
        most = max((r * x * m for r, x, m in tiles), default=0)
        configs = [self.config(r, x, m) for r, x, m in tiles if r * x * m >= min(16, most)]
        # The heuristic's pick, from H200 sweeps of the shipped convs: the most maps
        # that split a group evenly (up to 16), over 2 x 4 pixels when the whole
        # filter then unrolls (weights become immediate operands), else 2 x 2.
        # Larger tiles load more input per FFMA than they save in weight loads.
        def preference(config):
            unrolled = self._unrolled_taps(spec, config.rows * config.cols * config.maps) == spec.in_channels // spec.group * spec.kernel[0]
            return (maps_per_group % config.maps != 0, -config.maps, not (config.tile == (2, 4) and unrolled))

        picks = [config for config in configs if config.tile in ((2, 4), (2, 2))]
        first = min(picks, key=preference, default=None)
        return [*([first] if first else []), *(config for config in configs if config != first)]

    def unconfigured_reason(self, spec, epilogue):
        return f"no tile fits this Conv (the smallest: {self.reason(spec, self.config(1, 1, 1), epilogue)})"

    def reason(self, spec, config, epilogue):
        (rows, cols), maps = config.tile, config.maps
        maps_per_group = spec.out_channels // spec.group
        pkh, pkw = _pool(epilogue)
        if min(rows, cols, maps) < 1 or rows * cols * maps > 2 * ACCUMULATOR_BUDGET:
            return f"{config}: a tile of {rows} x {cols} x {maps} does not fit in registers (at most {2 * ACCUMULATOR_BUDGET})"
        if maps > spec.out_channels or (spec.group > 1 and maps_per_group % maps):
            return f"{config}: {maps} maps per thread must lie in one group of {maps_per_group} output maps"
        if (rows % pkh and pkh % rows) or (cols % pkw and pkw % cols):
            return f"{config}: a {rows} x {cols} tile must cover whole {pkh} x {pkw} pool windows or divide them"
        lanes = _lanes_per_window(rows, cols, epilogue)
        if lanes & (lanes - 1) or lanes > 32:
            return f"{config}: a pool window over {lanes} lanes is combined with shuffles: it must be a power of 2 up to 32"
        if 0 in _computed_size(spec, epilogue):
            return "the pool window is larger than the conv output"
        unrolled_per_map = rows * cols * spec.kernel[1] * self._unrolled_taps(spec, rows * cols * maps)
        return map_groups_reason(spec, config, maps, unrolled_per_map)

    @staticmethod
    def _unrolled_taps(spec: ConvSpec, outputs: int) -> int:
        """Filter rows x channels unrolled into one loop body: all of them while the body
        stays within TILE_UNROLL_BUDGET multiply-adds, else the rows only, else none. A
        rolled loop keeps the body within the instruction cache; an unrolled one turns
        each weight into an immediate operand of its FFMA."""
        (kh, kw), channels = spec.kernel, spec.in_channels // spec.group
        if outputs * kh * kw * channels <= TILE_UNROLL_BUDGET:
            return kh * channels
        return kh if outputs * kh * kw <= TILE_UNROLL_BUDGET else 1

    def compile_units(self, spec, config, epilogue=NONE):
        (rows, cols), maps = config.tile, config.maps
        kh = spec.kernel[0]
        unrolled = self._unrolled_taps(spec, rows * cols * maps)
        defines = shape_defines(spec, epilogue) | {
            "RT": rows,
            "XT": cols,
            "MO": maps,
            "UNROLL_KH": kh if unrolled >= kh else 1,
            "UNROLL_C": unrolled // kh if unrolled >= kh else 1,
        }
        return [CompileUnit("conv_const_tile.cu", "conv_const_tile", defines)]

    def module_constants(self, spec, config, weights):
        return filter_constants(weights, filters_maps_last)

    def build(self, spec, config, weights, epilogue=NONE):
        (rows, cols), maps = config.tile, config.maps
        [function] = self.load(spec, config, weights, epilogue)
        computed_rows, computed_cols = _computed_size(spec, epilogue)
        pkh, pkw = _pool(epilogue)
        tile_rows, tile_cols = rows * max(pkh // rows, 1), cols * max(pkw // cols, 1)  # one window's lanes together
        return GridKernel(
            spec,
            config,
            function,
            threads_per_image=-(-computed_rows // tile_rows) * -(-computed_cols // tile_cols) * _lanes_per_window(rows, cols, epilogue),
            grid_y=-(-spec.out_channels // maps),
            reads_weights=False,
            epilogue=epilogue,
            residual_parameter=True,
            alignment=16,  # rows may be read and written as float2 / float4
        )


FAMILIES: list[Family] = [ConstRegisterBlocked(), ConstTile()]
