"""Built reduction kernels: the numpy reference (CPU device) and kernels/reduce.cu.

The launch geometry (threads per row and per inner element, whether a row stays in
registers) follows from a row's shape alone, so it is chosen here, once per node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...gpu import cuda
from ...gpu.kernel_cache import CompileJob
from ...registry import Kernel
from ..operands import batched_input, contiguous_out
from ..activation import cuda_float
from . import reference
from .rows import Rows
from .spec import L1, L2, LOG_SUM, MAX, MEAN, MIN, PROD, SUM, SUM_SQUARE, NormSpec, ReduceSpec, SoftmaxSpec

SOURCE = "reduce.cu"
BLOCK = 256  # threads a block aims for: groups of fewer share one
MAX_GROUP_THREADS = 1024
PER_THREAD = 16  # TY grows until a thread takes at most this many of its row's values: loads in flight
CACHED_PER_THREAD = 32  # a thread keeps up to this many of its row's values in registers between passes
SECTOR_FLOATS = 8  # a 32-byte memory sector: a strided row's loads stay whole-sector with 8 neighbouring i a warp
MIN_GROUPS_PER_IMAGE = 8
# op -> (REDUCE_OP: how values combine, REDUCE_MAP: what the first stage applies to each input value,
# REDUCE_FINISH: what the last stage applies to its result); stages in between combine as REDUCE_OP
# says, the sums of an L1, L2, sum of squares or log-sum adding on (kernels/reduce.cu)
REDUCE_CODES = {SUM: (0, 0, 0), MEAN: (1, 0, 0), MAX: (2, 0, 0), MIN: (3, 0, 0), PROD: (4, 0, 0),
                L1: (0, 1, 0), L2: (0, 2, 1), SUM_SQUARE: (0, 2, 0), LOG_SUM: (0, 0, 2)}


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, (int(value) - 1).bit_length())


@dataclass(frozen=True)
class Geometry:
    """TX threads on neighbouring inner elements x TY threads along the row, GPB such groups a block."""

    tx: int
    ty: int

    @classmethod
    def of(cls, rows: Rows) -> "Geometry":
        """TX covers the inner elements up to a warp (a warp's loads then cover 32 neighbouring floats),
        or only a 32-byte sector's 8 where wider tiles would leave an image fewer than
        MIN_GROUPS_PER_IMAGE groups (NCHW's 7 x 7 maps: 8 wide, 7 tiles, not 2). TY is the fewest
        threads (a sector's worth together with TX) that leave each at most PER_THREAD values: each
        thread then has that many independent loads in flight, and rows up to 32 K elements stay in
        registers between passes (a LayerNorm over 96 channels: 8 threads a row, 4 rows a warp)."""
        tx = min(32, _power_of_two_at_least(rows.inner))
        while tx > SECTOR_FLOATS and rows.outer_per_image * -(-rows.inner // tx) < MIN_GROUPS_PER_IMAGE:
            tx //= 2
        # at least a sector's worth of threads on neighbouring floats: along the row when INNER is small
        ty = min(max(1, SECTOR_FLOATS // tx), _power_of_two_at_least(rows.extent))
        while tx * ty < MAX_GROUP_THREADS and -(-rows.extent // ty) > PER_THREAD and ty < _power_of_two_at_least(rows.extent):
            ty *= 2
        return cls(tx, ty)

    @property
    def group_threads(self) -> int:
        return self.tx * self.ty

    @property
    def groups_per_block(self) -> int:
        return max(1, BLOCK // self.group_threads)

    def per_thread(self, rows: Rows) -> int:
        return -(-rows.extent // self.ty)

    def defines(self, rows: Rows) -> dict[str, int]:
        per = self.per_thread(rows)
        return {"EXTENT": rows.extent, "INNER": rows.inner, "TX": self.tx, "TY": self.ty, "GPB": self.groups_per_block,
                "TILES": -(-rows.inner // self.tx), "PER": per, "CACHE": int(per <= CACHED_PER_THREAD)}

    def launch(self, rows: Rows, batch: int) -> tuple[tuple[int], tuple[int], np.int64]:
        """(grid, block, groups) for a call at this batch."""
        groups = rows.outer(batch) * -(-rows.inner // self.tx)
        return (-(-groups // self.groups_per_block),), (self.group_threads * self.groups_per_block,), np.int64(groups)

    @property
    def suffix(self) -> str:
        return f"t{self.tx}x{self.ty}"


# --- what each op compiles -------------------------------------------------------------------

def reduce_defines(spec: ReduceSpec, stage: int) -> dict[str, int]:
    """The macros of `spec`'s stage `stage`: the first maps the input's values, the last finishes the result."""
    rows = spec.stages[stage]
    op, value_map, finish = REDUCE_CODES[spec.op]
    macros = {"REDUCE_OP": op}
    if value_map and stage == 0:
        macros["REDUCE_MAP"] = value_map
    if finish and stage == len(spec.stages) - 1:
        macros["REDUCE_FINISH"] = finish
    return Geometry.of(rows).defines(rows) | macros


def softmax_defines(spec: SoftmaxSpec) -> dict[str, int]:
    return Geometry.of(spec.rows).defines(spec.rows) | {"SOFTMAX_LOG": int(spec.log)}


def norm_defines(spec: NormSpec) -> dict[str, int | str]:
    return Geometry.of(spec.rows).defines(spec.rows) | {
        "EPSILON": cuda_float(spec.epsilon), "NGROUPS": spec.groups, "CHANNEL_SIZE": spec.channel_size}


FUNCTIONS = {ReduceSpec: "reduce_rows", SoftmaxSpec: "softmax_rows", NormSpec: "normalize_rows"}


def op_name(spec: Any) -> str:
    if isinstance(spec, ReduceSpec):
        return f"reduce{spec.op}"
    if isinstance(spec, SoftmaxSpec):
        return "logsoftmax" if spec.log else "softmax"
    return f"{spec.kind}norm"


def kernel_name(spec: Any, on_device: bool) -> str:
    """e.g. "softmax.cuda.t32x8" (the geometry of its rows; a staged reduction's stages joined by "_")."""
    if not on_device:
        return f"{op_name(spec)}.reference"
    stages = spec.stages if isinstance(spec, ReduceSpec) else (spec.rows,)
    return f"{op_name(spec)}.cuda." + "_".join(Geometry.of(rows).suffix for rows in stages)


# --- kernels ---------------------------------------------------------------------------------

class ReferenceRowKernel(Kernel):
    """The numpy reference of any spec of this package, run as the CPU device's kernel: float64 arithmetic, float32 out."""

    def __init__(self, spec: Any, scale: np.ndarray | None = None, bias: np.ndarray | None = None):
        self.spec, self.scale, self.bias = spec, scale, bias
        self.name = kernel_name(spec, on_device=False)

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        return [expected(self.spec, inputs[0], self.scale, self.bias).astype(np.float32)]


def expected(spec: Any, x: Any, scale: np.ndarray | None = None, bias: np.ndarray | None = None) -> np.ndarray:
    """The oracle: the op computed in float64 from float32 inputs."""
    x = np.asarray(x, np.float64)
    if isinstance(spec, ReduceSpec):
        return reference.reduce(spec, x)
    if isinstance(spec, SoftmaxSpec):
        return reference.softmax(spec, x)
    return reference.normalize(spec, x, np.asarray(scale, np.float64), np.asarray(bias, np.float64))


def stage_macros(spec: Any) -> list[tuple[Rows, dict[str, Any]]]:
    """(rows, -D macros) of each launch of RowKernel: a staged reduction's stages, else one."""
    if isinstance(spec, ReduceSpec):
        return [(rows, reduce_defines(spec, stage)) for stage, rows in enumerate(spec.stages)]
    return [(spec.rows, softmax_defines(spec) if isinstance(spec, SoftmaxSpec) else norm_defines(spec))]


def stage_job(macros: dict[str, Any], arch: str) -> CompileJob:
    """The compile of one stage's module for a GPU of `arch`."""
    return cuda.module_job(SOURCE, macros, arch)


def compile_jobs(spec: Any, arch: str) -> list[CompileJob]:
    """What RowKernel compiles for this node on a GPU of `arch`: one module per stage."""
    return [stage_job(macros, arch) for _rows, macros in stage_macros(spec)]


class RowKernel(Kernel):
    """kernels/reduce.cu specialised for one node; call it with [X] (a CuPy array)."""

    def __init__(self, spec: Any, scale: np.ndarray | None = None, bias: np.ndarray | None = None):
        import cupy

        self.spec = spec
        self.name = kernel_name(spec, on_device=True)
        # FP32 two-pass sums: a NaN or Inf in a normalised row makes the row NaN, as onnxruntime's (a linked
        # normalisation's step reruns on this kernel, channel_last.py)
        self.nonfinite_exact = isinstance(spec, NormSpec)
        function, arch = FUNCTIONS[type(spec)], cuda.device_arch()
        self.stages = [(rows, Geometry.of(rows), cuda.load(stage_job(macros, arch)).get_function(function))
                       for rows, macros in stage_macros(spec)]
        self.functions = [f for _, _, f in self.stages]
        self._affine = () if scale is None else (cupy.asarray(scale, dtype=cupy.float32), cupy.asarray(bias, dtype=cupy.float32))
        self._sample = tuple(spec.input_shape[1:])
        self._launches: dict[int, list] = {}  # batch -> per stage (function, grid, block, groups, elements out)

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def workspace_bytes(self, batch: int) -> int:
        """A staged reduction's intermediate results."""
        return sum(4 * rows.outer(batch) * rows.inner for rows, _, _ in self.stages[:-1])

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        """[Y] for [X]; Y is `out` when given (a C-contiguous float32 CuPy array, written in full)."""
        import cupy

        x = batched_input(cupy, inputs[0] if inputs else None, self._sample, "X", self.name)
        batch = int(x.shape[0])
        shape = self.spec.output_shape(batch)
        contiguous_out(cupy, out, shape, self.name)
        launches = self._launches.get(batch) or self._launches.setdefault(batch, self._plan_launches(batch))
        with cuda.on_stream(stream):
            source = x if x.flags.c_contiguous else cupy.ascontiguousarray(x)
            y = cupy.empty(shape, dtype=cupy.float32) if out is None else out
            for index, (function, grid, block, groups, elements) in enumerate(launches):
                target = y if index == len(launches) - 1 else cupy.empty(elements, dtype=cupy.float32)
                function(grid, block, (source, *self._affine, target, groups))
                source = target
        return [y]

    def _plan_launches(self, batch: int) -> list:
        """Each stage's (function, grid, block, groups, output elements) at this batch; none for an empty batch."""
        if not batch:
            return []
        return [(function, *geometry.launch(rows, batch), rows.outer(batch) * rows.inner) for rows, geometry, function in self.stages]
