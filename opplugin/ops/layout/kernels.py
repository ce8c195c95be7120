"""The CUDA kernels of the layout ops, each specialised by NVRTC -D macros to its node's
shapes (kernels/layout_*.cu; Concat's source is generated, one pointer per input), with the
batch as a run-time argument. Every kernel writes its output through the output array's
own strides, so it may be handed a view into a larger buffer (`out=`, a Concat's slice:
see runtime/buffers.py); the first call with new strides compiles a module for them."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...gpu import cuda
from ...errors import PluginError
from ...registry import Kernel
from .strides import contiguous_strides, element_strides, outer_stride

BLOCK = 256
INT32_LIMIT = 2**31 - 1


def _macro_list(values: Sequence[int]) -> str:
    return ",".join(str(int(v)) for v in values) or "0"


@functools.lru_cache(maxsize=None)
def compiled_concat(source: str, options: tuple[str, ...], function: str):
    """A function of a generated CUDA source (Concat's), compiled once per text."""
    return cuda.compile_source(source, cuda.BASE_OPTIONS + options, "generated concat source").get_function(function)


@functools.lru_cache(maxsize=None)
def _function_of(source_file: str, defines: tuple[tuple[str, Any], ...], function: str):
    return cuda.compile_module(source_file, dict(defines)).get_function(function)


def function(source_file: str, defines: dict[str, Any], name: str):
    """kernels/<source_file>'s function `name` specialised by `defines`, looked up once per specialisation."""
    return _function_of(source_file, tuple(defines.items()), name)


def checked_input(x: Any, what: str, name: str) -> Any:
    import cupy

    if not isinstance(x, cupy.ndarray) or x.dtype != np.float32:
        raise PluginError(f"{name}: {what} must be a float32 CuPy array, got {type(x).__name__} {getattr(x, 'dtype', '')}")
    return x


def output_array(out: Any, shape: tuple[int, ...], name: str) -> Any:
    """`out` checked (any strides), or a new C-contiguous array."""
    import cupy

    if out is None:
        return cupy.empty(shape, dtype=cupy.float32)
    if not isinstance(out, cupy.ndarray) or out.dtype != np.float32 or tuple(out.shape) != tuple(shape):
        raise PluginError(f"{name}: out must be a float32 CuPy array of shape {shape}, got {getattr(out, 'shape', None)}")
    return out


class LayoutKernel(Kernel):
    """What every layout kernel shares: NaN and Inf are copied as they are, the cost is the bytes moved."""

    nonfinite_exact = True
    out_view = "strided"  # see registry.Kernel
    replayable = True

    def __init__(self, name: str, bytes_per_image: int, fixed_bytes: int = 0):
        self.name = name
        self._bytes_per_image, self._fixed_bytes = bytes_per_image, fixed_bytes
        self._memo: dict[tuple, Any] = {}  # what a call works out from its arrays' shapes and strides, kept: less host time per call

    def _remembered(self, key: tuple, make: Callable[[], Any]) -> Any:
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = make()
        return value

    def flops(self, batch: int) -> int:
        return 0

    def bytes_moved(self, batch: int) -> int:
        return self._fixed_bytes + batch * self._bytes_per_image


class GatherKernel(LayoutKernel):
    """One strided copy per output (kernels/layout_gather.cu): `plan(shape)` gives, for the input's
    shape, each output's (shape, source offset, source strides), all in elements of a C-contiguous
    input. An output that is a contiguous view of the input is returned as that view, no copy
    (Split or Slice along the outermost axis that is not 1), unless `out` is given."""

    def __init__(self, name: str, bytes_per_image: int, plan: Callable[[tuple[int, ...]], list[tuple[tuple[int, ...], int, tuple[int, ...]]]],
                 views: bool = True):
        super().__init__(name, bytes_per_image)
        self._plan, self._views = plan, views

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        x = checked_input(inputs[0] if inputs else None, "X", self.name)
        results = []
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            pieces = self._remembered(("pieces", x.shape), lambda: [(*piece, self._views and _is_contiguous_piece(*piece[::2]))
                                                                     for piece in self._plan(tuple(x.shape))])
            if out is not None and len(pieces) != 1:
                raise PluginError(f"{self.name}: out= is for a kernel of one output")
            for shape, base, strides, contiguous in pieces:
                if out is None and contiguous:
                    results.append(_view(cupy, x, shape, base))
                    continue
                y = output_array(out, shape, self.name)
                if y.size:
                    self._launch(x, y, base, strides)
                results.append(y)
        return results

    def _launch(self, x: Any, y: Any, base: int, strides: tuple[int, ...]) -> None:
        launch = self._remembered((x.shape, y.shape, y.strides, base, strides), lambda: function(
            "layout_gather.cu", gather_defines(tuple(y.shape), base, strides, element_strides(y), max(x.size, _span(y)) > INT32_LIMIT),
            "layout_gather"))
        launch((-(-y.size // BLOCK),), (BLOCK,), (x, y, np.int64(y.size)))


class TableGatherKernel(LayoutKernel):
    """A Gather by a table of indices (GatherSpec.table): whole blocks copied (kernels/layout_rows.cu), the
    table on the device from the first call on. Its output is C-contiguous (its own, or `out`)."""

    out_view = "contiguous"

    def __init__(self, name: str, bytes_per_image: int, axis: int, table: Sequence[int], index_shape: tuple[int, ...]):
        super().__init__(name, bytes_per_image)
        self._axis, self._table, self._index_shape = axis, np.asarray(table, dtype=np.int32), index_shape
        self._device_table = None

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        x = checked_input(inputs[0] if inputs else None, "X", self.name)
        shape = tuple(x.shape)
        inner = int(np.prod(shape[self._axis + 1:], dtype=np.int64))
        y = output_array(out, (*shape[: self._axis], *self._index_shape, *shape[self._axis + 1:]), self.name)
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            if self._device_table is None:
                self._device_table = cupy.asarray(self._table)
            if not y.flags.c_contiguous:
                raise PluginError(f"{self.name}: out must be C-contiguous")
            if y.size:
                vec = 4 if inner % 4 == 0 and x.data.ptr % 16 == 0 and y.data.ptr % 16 == 0 else 1
                launch = self._remembered((shape, vec), lambda: function(
                    "layout_rows.cu", {"INNER": inner, "COUNT": self._table.size, "AXIS": shape[self._axis], "VEC": vec}, "layout_rows"))
                vectors = y.size // vec
                launch((-(-vectors // BLOCK),), (BLOCK,), (x, self._device_table, y, np.int64(vectors)))
        return [y]


def gather_defines(shape: tuple[int, ...], base: int, src: tuple[int, ...], dst: tuple[int, ...], wide: bool) -> dict[str, Any]:
    """kernels/layout_gather.cu's macros: output `shape`, source offset and strides, output strides (elements).
    Axis 0's extent is left out (the kernel never reads it), so one module serves every batch."""
    return {"RANK": max(1, len(shape)), "OUT_DIMS": _macro_list((1, *shape[1:])), "SRC_STRIDES": _macro_list(src or (0,)),
            "DST_STRIDES": _macro_list(dst or (0,)), "SRC_BASE": base, "INDEX": "long long" if wide else "int"}


def _is_contiguous_piece(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expected = contiguous_strides(shape)
    return all(d == 1 or s == e for d, s, e in zip(shape, strides, expected))


def _view(cupy: Any, x: Any, shape: tuple[int, ...], base: int) -> Any:
    size = int(np.prod(shape, dtype=np.int64))
    return x.reshape(-1)[base: base + size].reshape(shape)


def _span(y: Any) -> int:
    """One past the farthest element `y` reaches from its start, in elements."""
    return 1 + sum((d - 1) * abs(s) for d, s in zip(y.shape, element_strides(y)) if d)


class TransposeTileKernel(LayoutKernel):
    """A transpose that moves the input's innermost axis (kernels/layout_transpose.cu): 32 x 32 tiles
    through shared memory, reads and writes coalesced."""

    def __init__(self, name: str, bytes_per_image: int, perm: tuple[int, ...]):
        super().__init__(name, bytes_per_image)
        self.perm = perm

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        x = inputs[0] if inputs else None
        if type(x) is not cupy.ndarray or x.dtype != np.float32:
            checked_input(x, "X", self.name)
        if x.ndim != len(self.perm):
            raise PluginError(f"{self.name}: X has rank {x.ndim}, the transpose takes rank {len(self.perm)}")
        key = (x.shape, None if out is None else (out.shape, out.strides))
        shape, launch, grid, extents = self._remembered(key, lambda: self._prepare(tuple(x.shape), out))
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            y = output_array(out, shape, self.name)
            if launch is not None:
                launch(grid, (32, 8), (x, y, *extents))
        return [y]

    def _prepare(self, shape: tuple[int, ...], out: Any) -> tuple:
        """(output shape, function, grid, run-time extents) of every call on arrays of this shape (and this `out`)."""
        out_shape = tuple(shape[p] for p in self.perm)
        if out is not None:
            output_array(out, out_shape, self.name)  # checked once
        if int(np.prod(out_shape, dtype=np.int64)) == 0:
            return out_shape, None, None, ()
        if out is None or out.flags.c_contiguous:  # fewer, longer axes: fuller tiles (7 x 7 maps become one axis of 49)
            shape, perm = merged_axes(shape, self.perm)
            out_strides = contiguous_strides(tuple(shape[p] for p in perm))
        else:
            perm, out_strides = self.perm, element_strides(out)
        p, last = perm[-1], len(shape) - 1
        others = int(np.prod([shape[d] for d in range(len(shape)) if d not in (p, last)], dtype=np.int64))
        launch = function("layout_transpose.cu", transpose_defines(shape, perm, out_strides), "layout_transpose")
        tiles = -(-shape[p] // 32) * -(-shape[last] // 32)
        return out_shape, launch, (tiles, min(others, 65535)), (np.int64(shape[p]), np.int64(others))


def merged_axes(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same transpose on fewer axes: input axes that stay next to each other, in order, in the
    output are one axis (NCHW -> NHWC is (N, C, HW) -> (N, HW, C)). Axis 0 stays alone, so that
    the batch stays a run-time extent."""
    groups: list[list[int]] = []
    for axis in perm:
        if groups and axis == groups[-1][-1] + 1 and axis != 1:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # the groups in input order
    new_shape = tuple(int(np.prod([shape[a] for a in groups[g]], dtype=np.int64)) for g in order)
    position = {g: i for i, g in enumerate(order)}
    return new_shape, tuple(position[g] for g in range(len(groups)))


def transpose_defines(shape: tuple[int, ...], perm: tuple[int, ...], out_strides: tuple[int, ...]) -> dict[str, Any]:
    """kernels/layout_transpose.cu's macros for an input of `shape` (C-contiguous) and an output of `out_strides`."""
    rank = len(shape)
    last, p = rank - 1, perm[-1]  # input axis `p` becomes the output's innermost
    out_of = [0] * rank  # the output stride of each input axis
    for position, axis in enumerate(perm):
        out_of[axis] = out_strides[position]
    in_strides = contiguous_strides(shape)
    others = [d for d in range(rank) if d not in (p, last)]
    return {
        "OTHERS": len(others),
        "OTHER_DIMS": _macro_list([1] + [shape[d] for d in others[1:]]),  # the first one's is never read
        "OTHER_IN_STRIDES": _macro_list([in_strides[d] for d in others]),
        "OTHER_OUT_STRIDES": _macro_list([out_of[d] for d in others]),
        "IN_STRIDE_P": in_strides[p], "OUT_STRIDE_P": out_of[p], "IN_STRIDE_LAST": in_strides[last],
        "OUT_STRIDE_LAST": out_of[last], "EXTENT_LAST": shape[last],
    }


class PadKernel(LayoutKernel):
    """kernels/layout_pad.cu for one Pad node."""

    def __init__(self, name: str, bytes_per_image: int, spec: Any):
        super().__init__(name, bytes_per_image)
        self.spec = spec

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        spec = self.spec
        x = checked_input(inputs[0] if inputs else None, "X", self.name)
        if x.ndim != len(spec.begins):
            raise PluginError(f"{self.name}: X has rank {x.ndim}, the pad takes rank {len(spec.begins)}")
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            y = output_array(out, spec.output_shape(tuple(x.shape)), self.name)
            if not y.size:
                return [y]
            if not x.size:
                y[...] = np.float32(spec.value)
                return [y]
            launch = self._remembered((x.shape, y.strides), lambda: function(
                "layout_pad.cu", pad_defines(spec, tuple(x.shape), tuple(y.shape), element_strides(y)), "layout_pad"))
            launch((-(-y.size // BLOCK),), (BLOCK,), (x, y, np.int64(y.size)))
        return [y]


def pad_defines(spec: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...], out_strides: tuple[int, ...]) -> dict[str, Any]:
    """kernels/layout_pad.cu's macros."""
    modes = {"constant": 0, "reflect": 1, "edge": 2}
    pad_axis0 = bool(spec.begins[0] or spec.ends[0])
    if not pad_axis0:  # its extent is never read: one module serves every batch
        in_shape, out_shape = (1, *in_shape[1:]), (1, *out_shape[1:])
    return {"RANK": len(in_shape), "PAD_AXIS0": pad_axis0, "OUT_DIMS": _macro_list(out_shape), "IN_DIMS": _macro_list(in_shape),
            "BEGINS": _macro_list(spec.begins), "SRC_STRIDES": _macro_list(contiguous_strides(in_shape)),
            "DST_STRIDES": _macro_list(out_strides), "MODE": modes[spec.mode], "VALUE": _float_literal(spec.value)}


def _float_literal(value: float) -> str:
    value = float(np.float32(value))
    if np.isnan(value):
        return "__int_as_float(0x7fc00000)"
    if np.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    return f"{value!r}f"


class ResizeKernel(LayoutKernel):
    """kernels/layout_resize.cu for one Resize node (the two innermost axes); C-contiguous output only."""

    out_view = "contiguous"

    def __init__(self, name: str, bytes_per_image: int, spec: Any, flops_per_image: int):
        super().__init__(name, bytes_per_image)
        self.spec, self._flops = spec, flops_per_image

    def flops(self, batch: int) -> int:
        return batch * self._flops

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        spec = self.spec
        x = checked_input(inputs[0] if inputs else None, "X", self.name)
        if x.ndim != len(spec.sizes) or tuple(x.shape[1:-2]) != tuple(spec.sizes[1:-2]):
            raise PluginError(f"{self.name}: X has shape {tuple(x.shape)}, the resize takes (N, {', '.join(map(str, spec.sizes[1:-2]))}, H, W)")
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            y = output_array(out, spec.output_shape(tuple(x.shape)), self.name)
            if out is not None and not y.flags.c_contiguous:
                raise PluginError(f"{self.name}: out must be C-contiguous")
            if y.size:
                launch = self._remembered((x.shape,), lambda: function(
                    "layout_resize.cu", resize_defines(spec, tuple(x.shape), tuple(y.shape)), "layout_resize"))
                launch((-(-y.size // BLOCK),), (BLOCK,), (x, y, np.int64(y.size)))
        return [y]


def resize_defines(spec: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> dict[str, Any]:
    """kernels/layout_resize.cu's macros."""
    (ih, iw), (oh, ow) = in_shape[-2:], out_shape[-2:]
    codes = {"asymmetric": 0, "half_pixel": 1, "pytorch_half_pixel": 2, "align_corners": 3}
    nearest = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}
    return {"IH": ih, "IW": iw, "OH": oh, "OW": ow, "SCALE_H": _float_literal(spec.scales[-2]),
            "SCALE_W": _float_literal(spec.scales[-1]), "COORDINATES": codes[spec.coordinates],
            "NEAREST_MODE": nearest[spec.nearest], "LINEAR": int(spec.mode == "linear")}


def concat_source(segments: Sequence[tuple[int, int, int]], axis_total: int, inner: int, in_outer: Sequence[int], out_outer: int,
                  wide: bool = True, element: str = "float") -> str:
    """The one-pass Concat kernel for `segments`, (input, output start, width) of each input it
    copies (those written in place are left out): thread i takes element i of the copied columns
    seen as (row, column, inner); each input is read and the output written in contiguous runs
    of `inner`. `in_outer`/`out_outer`: row strides in elements (a view's rows may be apart). Unless
    `wide`, the element index is split with 32-bit arithmetic (division by a constant is far cheaper).
    `element`: the CUDA type of an element (a linked Concat copies 16-bit values several at a time,
    linked_concat.py), which every count above is in."""
    copied = sum(width for _k, _start, width in segments)
    params = "".join(f"const {element}* __restrict__ in{k}, " for k, _s, _w in segments)
    lines = [
        f'extern "C" __global__ void __launch_bounds__({BLOCK}) layout_concat({params}{element}* __restrict__ out, long long total)',
        "{",
        f"    const long long i = blockIdx.x * {BLOCK}LL + threadIdx.x;",
        "    if (i >= total) return;",
        f"    typedef {'unsigned long long' if wide else 'unsigned int'} index;",
        f"    const index e = (index)i, inner = e % {inner}u, column = (e / {inner}u) % {copied}u, row = e / {inner * copied}u;",
        f"    {element} v;",
        "    long long at;",
    ]
    first = 0
    for n, (k, start, width) in enumerate(segments):
        test = "if" if n == 0 else "else if"
        condition = f"column < {first + width}" if n < len(segments) - 1 else "1"
        lines.append(f"    {test} ({condition}) {{ v = __ldg(in{k} + row * {in_outer[k]}LL + (long long)(column - {first}u) * {inner}LL + inner); "
                     f"at = {start - first}LL + column; }}")
        first += width
    lines += [f"    out[row * {out_outer}LL + at * {inner}LL + inner] = v;", "}"]
    return "\n".join(lines) + "\n"


class ConcatKernel(LayoutKernel):
    """Concat in one launch (concat_source's kernel). `copying(positions)` gives the same kernel
    for the other inputs only, where the producers of `positions` wrote their slices in place."""

    in_views = True  # an input that is rows of contiguous runs (a slice of a Concat's buffer) is read in place

    def __init__(self, name: str, bytes_per_image: int, spec: Any, skip: frozenset[int] = frozenset()):
        super().__init__(name, bytes_per_image)
        self.spec, self.skip = spec, skip
        self.input_slices = (spec.axis, tuple(zip(spec.starts, (s + w for s, w in zip(spec.starts, spec.widths)))))

    def copying(self, positions: frozenset[int]) -> "ConcatKernel | None":
        positions = frozenset(positions) | self.skip
        if len(positions) == len(self.spec.widths):
            return None
        kept = sum(w for k, w in enumerate(self.spec.widths) if k not in positions)
        per_image = self._bytes_per_image * kept // max(1, sum(self.spec.widths))
        return ConcatKernel(f"{self.name}(copies {len(self.spec.widths) - len(positions)} of {len(self.spec.widths)})",
                            per_image, self.spec, positions)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        import cupy

        if len(inputs) != len(self.spec.widths):
            raise PluginError(f"{self.name}: {len(inputs)} inputs given, the concat takes {len(self.spec.widths)}")
        for k, x in enumerate(inputs):
            if type(x) is not cupy.ndarray or x.dtype != np.float32:
                checked_input(x, f"input {k}", self.name)
        key = (tuple((x.shape, x.strides) for x in inputs), None if out is None else (out.shape, out.strides))
        call = self._remembered(key, lambda: self._prepare(inputs, out))
        with cuda.on_stream(stream):
            y = output_array(out, call.shape, self.name)
            if call.launch is None:
                return [y]
            target = y if call.writes_out else cupy.empty(y.shape, dtype=cupy.float32)
            sources = [inputs[k] if direct else cupy.ascontiguousarray(inputs[k]) for k, direct in call.reads]
            call.launch(call.grid, (BLOCK,), (*sources, target, np.int64(call.total)))
            if target is not y:
                y[...] = target
        return [y]

    def _prepare(self, inputs: Sequence[Any], out: Any) -> "_ConcatCall":
        """What every call with arrays of these shapes and strides does: checked once, kept (`_remembered`)."""
        spec, axis = self.spec, self.spec.axis
        first = inputs[0]
        for k, x in enumerate(inputs):
            if x.ndim != first.ndim or x.shape[axis] != spec.widths[k] or \
                    any(a != b for d, (a, b) in enumerate(zip(x.shape, first.shape)) if d != axis):
                raise PluginError(f"{self.name}: input {k} has shape {tuple(x.shape)}, which does not concatenate along axis "
                                  f"{axis} with width {spec.widths[k]}")
        shape = spec.output_shape(tuple(first.shape))
        copied = [k for k in range(len(inputs)) if k not in self.skip]
        if out is not None:
            output_array(out, shape, self.name)  # its shape checked here, once
        out_outer = outer_stride(out, axis) if out is not None else None
        writes_out = out is None or out_outer is not None
        if not writes_out and self.skip:
            raise PluginError(f"{self.name}: out is not rows of contiguous runs along axis {axis}")
        if out_outer is None:
            out_outer = int(np.prod(shape[axis:], dtype=np.int64))  # a C-contiguous array's (a new one, or the copy's target)
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        rows = int(np.prod(shape[:axis], dtype=np.int64))
        in_outer = {k: outer_stride(inputs[k], axis) for k in copied}
        reads = [(k, in_outer[k] is not None) for k in copied]
        in_outer = {k: (stride if stride is not None else int(np.prod(inputs[k].shape[axis:], dtype=np.int64)))
                    for k, stride in in_outer.items()}
        segments = [(k, spec.starts[k], spec.widths[k]) for k in copied]
        total = rows * inner * sum(w for _k, _s, w in segments)
        if not total:
            return _ConcatCall(shape, None, (0,), 0, reads, writes_out)
        launch = compiled_concat(concat_source(segments, sum(spec.widths), inner, in_outer, out_outer, wide=total > INT32_LIMIT),
                                 (), "layout_concat")
        return _ConcatCall(shape, launch, (-(-total // BLOCK),), total, reads, writes_out)


@dataclass(frozen=True)
class _ConcatCall:
    shape: tuple[int, ...]
    launch: Any  # None: nothing to copy
    grid: tuple[int, ...]
    total: int
    reads: list[tuple[int, bool]]  # (input, read in place; else through a contiguous copy)
    writes_out: bool  # into `out` itself; else into a contiguous array copied there
