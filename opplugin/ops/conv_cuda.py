"""The CUDA variants of Conv: specialisation, launch geometry, constant upload, timing.

Each variant is one source in kernels/. Every shape constant of the node is
compiled in through NVRTC -D macros (see `shape_defines`); only the batch size
is a kernel argument. The constant-memory variants also get their own module
per distinct (W, B): a digest of the weights is one of the macros, because
CuPy shares a loaded module (and so its __constant__ bank) between compiles
of equal source and options.

Variant names: "baseline", "const", "const_mo" (maps per thread chosen by
`default_maps_per_thread`) and "const_mo<N>" (N maps per thread, e.g.
"const_mo8"). Kernel names say the configuration: "conv.const_mo4".
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import statistics
from typing import Any, Sequence

import numpy as np

from .. import cuda
from ..registry import Kernel, PluginError
from .conv import ConvSpec

VARIANTS: dict[str, str] = {
    "baseline": "one thread per output element; weights read from global memory (also run-time weights)",
    "const": "one thread per output element; filters and bias in __constant__ memory, shape compiled in",
    "const_mo": "filters in __constant__ memory; each thread computes several output maps of one pixel",
}

CONSTANT_MEMORY_BYTES = 64 * 1024  # the __constant__ space of every CUDA device so far
BLOCK = 256  # threads per block: 8 warps, enough to hide load latency at these small per-thread costs
MAX_MAPS_PER_THREAD = 64  # beyond this the accumulators no longer fit in registers
# Most multiply-adds per tap-loop body for which the channel loop is unrolled too:
# past this, ptxas time grows fast (seconds) while a channel loop costs little,
# since its index is uniform across the warp and weights still load as uniform pairs.
UNROLL_BUDGET = 1024
INT32_MAX = 2**31 - 1

_MO_VARIANT = re.compile(r"const_mo(\d+)")


def parse_variant(variant: str) -> tuple[str, int | None]:
    """("const_mo", 8) for "const_mo8"; (variant, None) for a plain name."""
    if variant in VARIANTS:
        return variant, None
    match = _MO_VARIANT.fullmatch(variant)
    if match:
        return "const_mo", int(match.group(1))
    raise PluginError(f"unknown Conv variant {variant!r}; choose from {', '.join(VARIANTS)} or const_mo<N>")


def default_maps_per_thread(out_channels: int) -> int:
    """All maps when there are few (one group: every filter index a literal),
    else the largest divisor of M between 16 and 8 (no short group), else 8."""
    if out_channels <= 16:
        return out_channels
    for count in range(16, 7, -1):
        if out_channels % count == 0:
            return count
    return 8


def constant_bytes(spec: ConvSpec) -> int:
    """Bytes of __constant__ memory the filters and bias of this node need."""
    return 4 * (int(np.prod(spec.weight_shape)) + (spec.out_channels if spec.has_bias else 0))


def _shape_reason(spec: ConvSpec, variant: str) -> str | None:
    """Why `variant` cannot run this shape, whatever the weights; None if it can."""
    family, maps = parse_variant(variant)
    if spec.rank != 2:
        return f"only 2-D convolution is implemented (this Conv is {spec.rank}-D)"
    if spec.group != 1:
        return f"only group=1 is implemented (this Conv has group={spec.group})"
    if spec.out_channels > 65535:
        return f"{spec.out_channels} output maps exceed the grid's y limit of 65535"
    pixels = int(np.prod(spec.out_size))
    if spec.batch * pixels > INT32_MAX:
        return f"batch {spec.batch} x {pixels} output pixels exceeds 32-bit indexing; split the batch"
    if family != "baseline" and constant_bytes(spec) > CONSTANT_MEMORY_BYTES:
        return (
            f"filters and bias need {constant_bytes(spec)} bytes, more than the 64 KiB "
            f"({CONSTANT_MEMORY_BYTES} bytes) of __constant__ memory"
        )
    if maps is not None and not 1 <= maps <= min(spec.out_channels, MAX_MAPS_PER_THREAD):
        return (
            f"{variant} computes {maps} maps per thread; this Conv has {spec.out_channels} output maps "
            f"and at most {MAX_MAPS_PER_THREAD} fit in registers"
        )
    return None


def unsupported_reason(
    spec: ConvSpec, variant: str, weights: tuple[np.ndarray, np.ndarray | None] | None
) -> str | None:
    """None when `variant` can run this Conv, else the reason (shown by `opplugin plan`)."""
    try:
        reason = _shape_reason(spec, variant)
    except PluginError as err:
        return str(err)
    if reason:
        return reason
    if variant != "baseline" and weights is None:
        return "the weights are not constant (not initializers): __constant__ memory is filled once, at build time"
    return None


def shape_defines(spec: ConvSpec) -> dict[str, int | str]:
    """The -D macros every variant is specialised with (all but the batch)."""
    (h, w), (kh, kw), (sh, sw), (dh, dw) = spec.in_size, spec.kernel, spec.strides, spec.dilations
    oh, ow = spec.out_size
    return {
        "C": spec.in_channels,
        "M": spec.out_channels,
        "H": h,
        "W": w,
        "KH": kh,
        "KW": kw,
        "SH": sh,
        "SW": sw,
        "PH": spec.pads[0],
        "PW": spec.pads[1],
        "DH": dh,
        "DW": dw,
        "OH": oh,
        "OW": ow,
        # without pads every tap of every output lies inside the image: skip the bounds tests
        "PADDED": int(any(spec.pads)),
        "HAS_BIAS": int(spec.has_bias),
        "BLOCK": BLOCK,
    }


def _unroll_c(spec: ConvSpec, multiply_adds_per_tap: int) -> int:
    """Unroll the channel loop fully when the unrolled body stays small, else not at all."""
    taps = spec.in_channels * int(np.prod(spec.kernel))
    return spec.in_channels if taps * multiply_adds_per_tap <= UNROLL_BUDGET else 1


def compile_plan(spec: ConvSpec, variant: str) -> tuple[str, str, dict[str, int | str]]:
    """(source file, kernel function, -D macros) for a variant; PluginError if it cannot run."""
    reason = _shape_reason(spec, variant)
    if reason:
        raise PluginError(f"variant {variant!r}: {reason}")
    family, maps = parse_variant(variant)
    defines = shape_defines(spec)
    if family == "const_mo":
        maps = maps or default_maps_per_thread(spec.out_channels)
        defines["MO"] = maps
        # one copy of the loop per map group: M multiply-adds per tap in the whole kernel
        defines["UNROLL_C"] = _unroll_c(spec, spec.out_channels)
    else:
        defines["UNROLL_C"] = _unroll_c(spec, 1)
    return f"conv_{family}.cu", f"conv_{family}", defines


def kernel_name(spec: ConvSpec, variant: str) -> str:
    """The name a built kernel reports, e.g. "conv.const_mo4"."""
    family, maps = parse_variant(variant)
    if family == "const_mo":
        return f"conv.const_mo{maps or default_maps_per_thread(spec.out_channels)}"
    return f"conv.{family}"


def _weights_digest(w: np.ndarray, b: np.ndarray | None) -> str:
    digest = hashlib.blake2b(np.ascontiguousarray(w, dtype=np.float32).tobytes(), digest_size=8)
    if b is not None:
        digest.update(np.ascontiguousarray(b, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _upload_constant(module: Any, name: str, values: np.ndarray) -> None:
    """Copy host values into the module's __constant__ array `name`."""
    host = np.ascontiguousarray(values, dtype=np.float32).ravel()
    pointer = module.get_global(name)
    pointer.copy_from_host(host.ctypes.data_as(ctypes.c_void_p), host.nbytes)


class CudaConvKernel:
    """One Conv node's compiled variant. Call it with the node's inputs (CuPy arrays)."""

    def __init__(self, spec: ConvSpec, name: str, function: Any, maps_per_block: int, reads_weights: bool):
        self.spec = spec
        self.name = name
        self._function = function
        self._grid_y = -(-spec.out_channels // maps_per_block)
        self._reads_weights = reads_weights  # baseline: W, B come in at call time

    def flops(self, batch: int) -> int:
        return self.spec.flops(batch)

    def bytes_moved(self, batch: int) -> int:
        return self.spec.bytes_moved(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None) -> list[Any]:
        """[y] for inputs [x, w, b?]; y is `out` when given (written in full), else a new array."""
        import cupy

        spec = self.spec
        if not inputs:
            raise PluginError(f"{self.name}: no inputs given")
        x = _checked_array(cupy, inputs[0], "input X", self.name)
        if x.ndim != 4 or tuple(x.shape[1:]) != (spec.in_channels, *spec.in_size):
            raise PluginError(
                f"{self.name}: input X has shape {tuple(x.shape)}, expected (N, {spec.in_channels}, "
                f"{spec.in_size[0]}, {spec.in_size[1]})"
            )
        batch = int(x.shape[0])
        pixels = batch * int(np.prod(spec.out_size))
        if pixels > INT32_MAX:
            raise PluginError(f"{self.name}: batch {batch} is too large for 32-bit indexing; split the batch")
        with cuda.on_stream(stream):
            x = cupy.ascontiguousarray(x)
            weight_args = self._weight_args(cupy, inputs) if self._reads_weights else ()
            y = self._output(cupy, out, batch)
            if pixels:
                grid = (-(-pixels // BLOCK), self._grid_y, 1)
                self._function(grid, (BLOCK, 1, 1), (x, *weight_args, y, np.int32(batch)))
        return [y]

    def _weight_args(self, cupy: Any, inputs: Sequence[Any]) -> tuple:
        spec = self.spec
        if len(inputs) < 2:
            raise PluginError(f"{self.name}: the weights W are missing from the inputs")
        w = _checked_array(cupy, inputs[1], "weights W", self.name)
        if tuple(w.shape) != spec.weight_shape:
            raise PluginError(f"{self.name}: weights W have shape {tuple(w.shape)}, expected {spec.weight_shape}")
        if not spec.has_bias:
            return cupy.ascontiguousarray(w), np.uint64(0)  # null bias pointer: the kernel never reads it
        if len(inputs) < 3 or inputs[2] is None:
            raise PluginError(f"{self.name}: the bias B is missing from the inputs")
        b = _checked_array(cupy, inputs[2], "bias B", self.name)
        if tuple(b.shape) != (spec.out_channels,):
            raise PluginError(f"{self.name}: bias B has shape {tuple(b.shape)}, expected ({spec.out_channels},)")
        return cupy.ascontiguousarray(w), cupy.ascontiguousarray(b)

    def _output(self, cupy: Any, out: Any, batch: int) -> Any:
        shape = self.spec.output_shape(batch)
        if out is None:
            return cupy.empty(shape, dtype=cupy.float32)
        out = _checked_array(cupy, out, "output", self.name)
        if tuple(out.shape) != shape or not out.flags.c_contiguous:
            raise PluginError(f"{self.name}: output must be a C-contiguous float32 array of shape {shape}")
        return out


def _checked_array(cupy: Any, array: Any, what: str, kernel: str) -> Any:
    if not isinstance(array, cupy.ndarray):
        raise PluginError(f"{kernel}: {what} must be a CuPy array on the GPU, got {type(array).__name__}")
    if array.dtype != cupy.float32:
        raise PluginError(f"{kernel}: {what} must be float32, got {array.dtype}")
    return array


def build_kernel(
    spec: ConvSpec, variant: str, weights: tuple[np.ndarray, np.ndarray | None] | None
) -> Kernel:
    """Compile `variant` for this Conv; the constant variants upload (W, B) into their module now."""
    reason = unsupported_reason(spec, variant, weights)
    if reason:
        raise PluginError(f"variant {variant!r} cannot run this Conv: {reason}")
    source_file, function_name, defines = compile_plan(spec, variant)
    family, _ = parse_variant(variant)
    if family == "baseline":
        module = cuda.compile_module(source_file, defines)
        function = module.get_function(function_name)
        return CudaConvKernel(spec, kernel_name(spec, variant), function, 1, reads_weights=True)

    w, b = weights
    if tuple(w.shape) != spec.weight_shape or (b is not None) != spec.has_bias:
        raise PluginError(f"weights {tuple(w.shape)} (bias {b is not None}) do not match the Conv {spec}")
    defines["OPPLUGIN_WEIGHTS_DIGEST"] = f"0x{_weights_digest(w, b)}"
    module = cuda.compile_module(source_file, defines)
    function = module.get_function(function_name)  # compiles and loads the module
    # const_mo keeps its filters as [C][KH][KW][M]: the maps of one tap side by side
    _upload_constant(module, "filters", np.moveaxis(w, 0, -1) if family == "const_mo" else w)
    if b is not None:
        _upload_constant(module, "bias", b)
    import cupy

    cupy.cuda.runtime.deviceSynchronize()  # a pageable copy may still be in flight when memcpy returns
    maps_per_block = defines.get("MO", 1)
    return CudaConvKernel(spec, kernel_name(spec, variant), function, maps_per_block, reads_weights=False)


def time_kernels(kernels: Sequence[Any], spec: ConvSpec, warmup: int = 2, repeat: int = 5) -> list[float]:
    """Median milliseconds of each kernel on one fresh random input of the spec's shape."""
    import cupy

    x = cupy.random.standard_normal(spec.input_shape(), dtype=cupy.float32)
    inputs = [x, cupy.random.standard_normal(spec.weight_shape, dtype=cupy.float32)]
    if spec.has_bias:
        inputs.append(cupy.random.standard_normal((spec.out_channels,), dtype=cupy.float32))
    out = cupy.empty(spec.output_shape(), dtype=cupy.float32)
    return [
        statistics.median(cuda.time_ms(lambda k=kernel: k(inputs, None, out=out), warmup=warmup, repeat=repeat))
        for kernel in kernels
    ]


def fastest(kernels: Sequence[Kernel], spec: ConvSpec) -> Kernel:
    """The candidate with the smallest median time on the spec's shape."""
    if not kernels:
        raise PluginError(f"no CUDA variant can run this Conv ({spec})")
    if len(kernels) == 1:
        return kernels[0]
    medians = time_kernels(kernels, spec)
    return kernels[medians.index(min(medians))]
