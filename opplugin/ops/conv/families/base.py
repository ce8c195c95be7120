"""What every CUDA Conv variant shares: the -D shape macros, the family
interface, constant-memory upload and the kernel object that checks its
arguments and launches.

A *family* is one optimisation (one source in kernels/, or a pair); a
*variant* is a family with its configuration, a frozen `Config` whose name
says it, e.g. "const_rb_t8x1_m4" (8 output rows x 1 column, 4 maps per
thread; see ops/config_grammar.py). The family's plain name ("const_rb")
picks its configuration by a heuristic.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ....gpu import cuda
from ....gpu.kernel_cache import CompileJob
from ....errors import PluginError
from ....registry import Kernel
from ...config_grammar import Config
from ...operands import FLOAT32, checked_array
from ..epilogue import NONE, RESIDUAL_INPUT, Epilogue, kernel_name
from ..prologue import PROLOGUE_INPUT
from ..spec import ConvSpec

CONSTANT_MEMORY_BYTES = 64 * 1024  # the __constant__ space of every CUDA device so far
BLOCK = 256  # threads per block: 8 warps, enough to hide load latency at these small per-thread costs
INT32_MAX = 2**31 - 1
# Most multiply-adds per tap-loop body for which the channel loop is unrolled too:
# past this, ptxas time grows fast (seconds) while a channel loop costs little,
# since its index is uniform across the warp.
UNROLL_BUDGET = 1024

Weights = tuple[np.ndarray, "np.ndarray | None"]


def unit_arch(unit: "CompileUnit", arch: str) -> str:
    """The target `unit` is compiled for on a GPU of architecture `arch`: "sm_90a" for wgmma's code."""
    return arch + "a" if unit.arch_specific else arch


@dataclass(frozen=True)
class CompileUnit:
    """One kernel function of a variant: kernels/<source>, specialised by `defines`."""

    source: str
    function: str
    defines: dict[str, int | str] = field(default_factory=dict)
    arch_specific: bool = False  # compiled for "sm_90a" rather than "sm_90": uses wgmma


def constant_bytes(spec: ConvSpec) -> int:
    """Bytes of __constant__ memory the filters and bias of this node need."""
    return 4 * (int(np.prod(spec.weight_shape)) + (spec.out_channels if spec.has_bias else 0))


def shape_defines(spec: ConvSpec, epilogue: Epilogue = NONE) -> dict[str, int | str]:
    """The -D macros every variant is specialised with (all but the batch).

    OH, OW are the conv's output size; POH, POW the size written (after the
    fused pool, if any); PKH, PKW and the epilogue's own macros (RESIDUAL,
    POOL_FIRST, ACTIVATION(v): see kernels/conv_epilogue.cuh) describe the epilogue.
    """
    (h, w), (kh, kw), (sh, sw), (dh, dw) = spec.in_size, spec.kernel, spec.strides, spec.dilations
    oh, ow = spec.out_size
    poh, pow_ = epilogue.output_size((oh, ow))
    pkh, pkw = epilogue.pool or (1, 1)
    return {
        "C": spec.in_channels,
        "M": spec.out_channels,
        "G": spec.group,
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
        "POH": poh,
        "POW": pow_,
        "PKH": pkh,
        "PKW": pkw,
        # without pads every tap of every output lies inside the image: skip the bounds tests
        "PADDED": int(any(spec.pads)),
        "HAS_BIAS": int(spec.has_bias),
        "BLOCK": BLOCK,
    } | epilogue.defines()


# The map-group kernels (const_mo, const_rb, const_tile) compile one copy of
# their tile loop per group of maps a thread computes, chained as templates:
# NVRTC stops at about 200 and compile time grows with each, so cap it.
MAX_MAP_GROUPS = 64
# ... and each copy unrolls its taps for every output of its thread tile, so the whole kernel's
# unrolled multiply-adds are about M x a thread's outputs per map x the unrolled taps; ptxas time
# grows faster than they do. On a 61-map depthwise 5x7 layer (a 2-core CPU, sm_90): const_tile_t8x8_m1
# (27k) took 86 s, const_tile_t2x2_m1 (8.5k) 8.4 s, const_rb_t2x1_m1 (4.3k) 3.9 s. The families
# with weights in global memory (depthwise, the GEMMs) take the layers past the budget.
UNROLLED_BUDGET = 12288


def map_groups_reason(spec: ConvSpec, config: Config, maps: int, unrolled_per_map: int = 0) -> str | None:
    """Why the map groups of `config` make too much code: too many copies of the loop, or too many
    multiply-adds unrolled over all of them (`unrolled_per_map`: those of one map's copy)."""
    groups = -(-spec.out_channels // maps)
    if groups > MAX_MAP_GROUPS:
        return (
            f"{config}: {spec.out_channels} maps at {maps} per thread make {groups} map groups, each a compiled "
            f"copy of the kernel's loop; at most {MAX_MAP_GROUPS}"
        )
    unrolled = spec.out_channels * unrolled_per_map
    if unrolled > UNROLLED_BUDGET:
        return (
            f"{config}: its {groups} map groups unroll {unrolled} multiply-adds in all, more than the "
            f"{UNROLLED_BUDGET} that compile in seconds"
        )
    return None


def unroll_channels(spec: ConvSpec, multiply_adds_per_tap: int) -> int:
    """Unroll the channel loop fully when the unrolled body stays small, else not at all."""
    taps = (spec.in_channels // spec.group) * int(np.prod(spec.kernel))
    return spec.in_channels // spec.group if taps * multiply_adds_per_tap <= UNROLL_BUDGET else 1


def filter_constants(weights: Weights, arrange: Callable[[np.ndarray], np.ndarray] = np.asarray) -> dict[str, np.ndarray]:
    """The __constant__ arrays of a constant-memory family: `filters` (the weights in
    the layout its source reads, `arrange`d) and `bias` when the node has one."""
    w, b = weights
    return {"filters": arrange(w)} | ({} if b is None else {"bias": b})


def unit_jobs(units: Sequence[CompileUnit], constants: Mapping[str, np.ndarray] | None, arch: str) -> list[CompileJob]:
    """The compile of each unit for a GPU of `arch`: its source with its defines and, where the
    module gets `constants` (name -> values of a __constant__ array the source declares), a
    digest of their values.

    The digest specialises the module: equal compiles share one loaded module, and so one
    constant bank, and two nodes with different weights must not share one."""
    extra = {"OPPLUGIN_WEIGHTS_DIGEST": constants_digest(constants)} if constants else {}
    return [cuda.module_job(unit.source, unit.defines | extra, arch, arch_specific=unit.arch_specific) for unit in units]


def load_functions(units: Sequence[CompileUnit], constants: Mapping[str, np.ndarray] | None = None) -> list[Any]:
    """The loaded CUDA functions of `units`, in their order, each compiled as `unit_jobs` says
    (units with equal jobs share a module), with `constants` uploaded into their modules."""
    modules, functions = {}, []
    for unit, job in zip(units, unit_jobs(units, constants, cuda.device_arch())):
        module = cuda.load(job)
        functions.append(module.get_function(unit.function))  # compiles and loads the module
        modules[id(module)] = module
    for module in modules.values():
        for name, values in (constants or {}).items():
            upload_constant(module, name, values)
    return functions


def constants_digest(constants: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for name, values in constants.items():
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(values, dtype=np.float32).tobytes())
    return f"0x{digest.hexdigest()}"


def upload_constant(module: Any, name: str, values: np.ndarray) -> None:
    """Copy host values into the module's __constant__ array `name` (synchronously)."""
    import cupy

    host = np.ascontiguousarray(values, dtype=np.float32).ravel()
    pointer = module.get_global(name)
    pointer.copy_from_host(host.ctypes.data_as(ctypes.c_void_p), host.nbytes)
    cupy.cuda.runtime.deviceSynchronize()  # a pageable copy may still be in flight when memcpy returns


class BlockTiledConfig(Config):
    """A Config whose `block` field is the block tile, BM maps x BN pixels x BK of K: its sides by name."""

    block: tuple[int, int, int]

    @property
    def bm(self) -> int:
        return self.block[0]

    @property
    def bn(self) -> int:
        return self.block[1]

    @property
    def bk(self) -> int:
        return self.block[2]


def filters_maps_last(w: np.ndarray) -> np.ndarray:
    """[M][C/G][KH][KW] -> [C/G][KH][KW][M]: the maps of one tap side by side."""
    return np.moveaxis(np.asarray(w, dtype=np.float32), 0, -1)


class Family:
    """One optimisation. Subclasses set the class attributes (`config_type`: the Config
    they are configured by) and implement `configs`, `compile_units` and `build` (which loads
    its functions with `load`), with `module_constants` where their modules hold the weights;
    `reason` adds their own limits."""

    name: str = ""
    summary: str = ""  # what it does and why it should be faster
    exact: bool = True  # False: fp16/tf32 arithmetic, opt-in only, never auto-picked
    precision: str = "fp32"  # the format its products' operands are rounded to ("tf32", "fp16", "bf16"), as a plan shows it
    # how an exact family earns the name: "construction" (FP32 multiply-adds, in some order) or
    # "measurement" (other arithmetic whose measured error meets the same bound, e.g. 3xTF32)
    exact_by: str = "construction"
    constant_weights: bool = False  # filters go into __constant__ memory at build time
    weights_at_build: bool = False  # rearranges the weights on the device at build time (they must be constant)
    fuses: bool = False  # can run an Epilogue (activation, max pool) in the same kernel
    takes_prologue: bool = False  # can apply a Prologue (prologue.py) to the input values it loads
    config_type: type[Config] = Config  # no fields: the family's name is its one configuration
    archs: tuple[str, ...] | None = None  # the architectures it runs on ("sm_90"); None: sm_80 and later

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # help(family) shows what the family does: its summary is its docstring
        if not cls.__doc__ and cls.summary:
            cls.__doc__ = f"`{cls.name}`: {cls.summary}."

    def runs_here(self) -> bool:
        """Whether the current GPU runs the family's code (`archs`); True without a device (offline compiles)."""
        return self.archs is None or not cuda.is_available() or cuda.device_arch() in self.archs

    def configs(self, spec: ConvSpec, epilogue: Epilogue = NONE) -> list[Config]:
        """The configurations tuning tries for this node; the first is the heuristic's pick."""
        return [Config(self.name)]

    def default(self, spec: ConvSpec, epilogue: Epilogue = NONE) -> Config | None:
        """The configuration the family's plain name stands for on this node; None when none fits."""
        configs = self.configs(spec, epilogue)
        return configs[0] if configs else None

    def unconfigured_reason(self, spec: ConvSpec, epilogue: Epilogue) -> str:
        """Why no configuration of the family fits this node (`default` gave None)."""
        return f"no {self.name} configuration fits this Conv"

    def reason(self, spec: ConvSpec, config: Config, epilogue: Epilogue) -> str | None:
        """Why this configuration cannot run this shape (beyond the shared limits); None if it can."""
        return None

    def channel_last_links(self, spec: ConvSpec, epilogue: Epilogue) -> int:
        """The tensors its kernels can keep channel-last in its 16-bit format on this Conv with this epilogue
        (channel_last.py's bits, INPUT, OUTPUT, RESIDUAL, each on its own; a configuration's `links` sets them);
        0: none, as in every FP32 family."""
        return 0

    def compile_units(self, spec: ConvSpec, config: Config, epilogue: Epilogue = NONE) -> list[CompileUnit]:
        raise NotImplementedError

    def module_constants(self, spec: ConvSpec, config: Config, weights: Weights | None) -> dict[str, np.ndarray] | None:
        """The __constant__ arrays (name -> values) its modules get at build; None: they get none."""
        return None

    def compile_jobs(self, spec: ConvSpec, config: Config, weights: Weights | None, epilogue: Epilogue, arch: str) -> list[CompileJob]:
        """What `build` compiles for this node on a GPU of `arch`, without compiling it."""
        return unit_jobs(self.compile_units(spec, config, epilogue), self.module_constants(spec, config, weights), arch)

    def load(self, spec: ConvSpec, config: Config, weights: Weights | None, epilogue: Epilogue = NONE) -> list[Any]:
        """The functions of the node's compile units, loaded with its module constants: what `build` launches."""
        return load_functions(self.compile_units(spec, config, epilogue), self.module_constants(spec, config, weights))

    def build(self, spec: ConvSpec, config: Config, weights: Weights | None, epilogue: Epilogue = NONE) -> "ConvKernel":
        raise NotImplementedError


class ConvKernel(Kernel):
    """A built variant for one node. Call it with the node's inputs (CuPy arrays):
    [x] for the constant-weight variants (extra inputs ignored), [x, w, b?] for
    those that read the weights at call time. Subclasses implement `_launch`.

    `config` is its configuration, `variant` that configuration's name
    ("const_rb_t8x1_m4"); `functions` are the compiled CUDA functions it launches,
    whose attributes (registers, local memory) the lab reads. `alignment`: the bytes
    the kernel needs x, y and the residual aligned to (16 for float4 loads and stores)."""

    reads_weights = False
    out_view = "contiguous"  # __call__ takes out= (registry.Kernel)
    replayable = True  # launches only through its Functions; scratch and copies it allocates refuse a recording
    # the kernel takes a pointer to the residual operand after the weights' (null without one): the fusing families
    residual_parameter = False
    # ... and then one to the prologue's operand (null without a prologue): the families that take a prologue
    prologue_parameter = False
    # whether a call can raise a NaN/Inf flag as it stores its outputs (`nonfinite`), sparing a
    # watched step the pass over them that would check them after it (runtime/exact.py)
    flags_nonfinite = False

    def __init__(self, spec: ConvSpec, config: Config, functions: Sequence[Any], epilogue: Epilogue = NONE, *, alignment: int = 4):
        self.spec = spec
        self.config = config
        self.variant = config.name()
        self.name = kernel_name(self.variant, epilogue)
        self.functions = list(functions)
        self.epilogue = epilogue
        self.alignment = alignment

    @property
    def nonfinite_exact(self) -> bool:
        """NaN and Inf follow onnxruntime except through a fused max pool (see exact.py)."""
        return self.epilogue.pool is None

    def flops(self, batch: int) -> int:
        """With a fused pool, only the conv outputs the pool reads are computed."""
        return self.spec.flops(batch, self.epilogue.conv_size_read(self.spec.out_size))

    def bytes_moved(self, batch: int) -> int:
        """Fewest bytes: input, weights and a residual operand read once, the (pooled) output written once."""
        conv_out = int(np.prod(self.spec.output_shape(batch))) * 4
        residual = conv_out if self.epilogue.residual else 0
        return self.spec.bytes_moved(batch) - conv_out + residual + int(np.prod(self.output_shape(batch))) * 4

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.spec.out_channels, *self._written_size)

    @functools.cached_property
    def _written_size(self) -> tuple[int, ...]:
        return tuple(self.epilogue.output_size(self.spec.out_size))

    def workspace_bytes(self, batch: int) -> int:
        """Scratch device memory a call of this batch allocates besides its output."""
        return 0

    def __call__(self, inputs: Sequence[Any], stream: Any = None, *, out: Any = None, nonfinite: int = 0) -> list[Any]:
        """[y] for the step's inputs (X, W, B, then the residual operand of a fused Add);
        y is `out` when given (written in full), else a new array. `nonfinite`, for a kernel that
        `flags_nonfinite`: the device address of a zeroed byte it sets if y holds a NaN or an Inf."""
        import cupy

        if not inputs:
            raise PluginError(f"{self.name}: no inputs given")
        if nonfinite and not self.flags_nonfinite:
            raise PluginError(f"{self.name}: this kernel does not flag NaN and Inf itself")
        x = inputs[0]
        # the checks of the common case first, cheaply: an eager step's host time is what they cost
        if not (isinstance(x, cupy.ndarray) and x.dtype is FLOAT32 and x.shape[1:] == self._input_image and x.ndim == 4):
            x = self._checked_input(cupy, x)
        batch = x.shape[0]
        if batch > self._most_images:
            raise PluginError(f"{self.name}: batch {batch} is too large for 32-bit indexing; split the batch")
        with cuda.on_stream(stream):
            x = self._input_array(cupy, x)
            weights = self._weight_args(cupy, inputs) if self.reads_weights else ()
            if self.residual_parameter:
                weights += (self._residual_arg(cupy, inputs, batch),)
            if self.prologue_parameter:
                weights += (self._prologue_arg(cupy, inputs, batch),)
            y = self._output(cupy, out, batch)
            target = y if self.alignment <= 4 or y.data.ptr % self.alignment == 0 else cupy.empty_like(y)
            if batch and nonfinite:
                self._launch(x, weights, target, batch, nonfinite=nonfinite)
            elif batch:
                self._launch(x, weights, target, batch)
            if target is not y:
                y[...] = target
        return [y]

    @functools.cached_property
    def _input_image(self) -> tuple[int, ...]:
        return (self.spec.in_channels, *self.spec.in_size)

    @functools.cached_property
    def _most_images(self) -> int:
        """The largest batch whose outputs a kernel can index with 32-bit ints."""
        return INT32_MAX // math.prod(self.spec.out_size)

    def _checked_input(self, cupy: Any, x: Any) -> Any:
        """X, or a PluginError naming what is wrong with it."""
        x = checked_array(cupy, x, "input X", self.name)
        spec = self.spec
        if x.ndim != 4 or tuple(x.shape[1:]) != self._input_image:
            raise PluginError(
                f"{self.name}: input X has shape {tuple(x.shape)}, expected (N, {spec.in_channels}, "
                f"{spec.in_size[0]}, {spec.in_size[1]})"
            )
        return x

    def _input_array(self, cupy: Any, x: Any) -> Any:
        """X as the kernel reads it: contiguous, aligned for its vector loads."""
        x = cupy.ascontiguousarray(x)
        return x if x.data.ptr % self.alignment == 0 else x.copy()  # a fresh allocation is aligned

    def _launch(self, x: Any, weights: tuple, y: Any, batch: int) -> None:
        """Launch on x into y; `weights` are the pointer arguments between them: (w, b) when the
        kernel reads its weights, then the residual's when it takes one, then the prologue's."""
        raise NotImplementedError

    _prologue_constants: Any = None  # an affine prologue's a and b on the device, uploaded at the first call

    def _prologue_arg(self, cupy: Any, inputs: Sequence[Any], batch: int) -> Any:
        """The prologue's operand: the scale s as a contiguous (batch, C) device array, an affine's
        constants (a then b), or a null pointer without a prologue."""
        prologue = self.epilogue.prologue
        if prologue is None:
            return np.uint64(0)
        if not prologue.takes_operand:
            if self._prologue_constants is None:
                self._prologue_constants = cupy.asarray(prologue.constants())
            return self._prologue_constants
        if len(inputs) <= PROLOGUE_INPUT or inputs[PROLOGUE_INPUT] is None:
            raise PluginError(f"{self.name}: the prologue's scale operand (input {PROLOGUE_INPUT}) is missing from the inputs")
        s = checked_array(cupy, inputs[PROLOGUE_INPUT], "prologue scale operand", self.name)
        shape = (batch, self.spec.in_channels, 1, 1)
        if tuple(s.shape) != shape:
            raise PluginError(f"{self.name}: the prologue's scale operand has shape {tuple(s.shape)}, expected {shape}")
        return cupy.ascontiguousarray(s)

    def _residual_arg(self, cupy: Any, inputs: Sequence[Any], batch: int) -> Any:
        """The residual operand as a contiguous, aligned device array; a null pointer without one."""
        if not self.epilogue.residual:
            return np.uint64(0)
        if len(inputs) <= RESIDUAL_INPUT or inputs[RESIDUAL_INPUT] is None:
            raise PluginError(f"{self.name}: the residual operand (input {RESIDUAL_INPUT}) is missing from the inputs")
        r = checked_array(cupy, inputs[RESIDUAL_INPUT], "residual operand", self.name)
        shape = self.spec.output_shape(batch)
        if tuple(r.shape) != tuple(shape):
            raise PluginError(f"{self.name}: the residual operand has shape {tuple(r.shape)}, expected {tuple(shape)}")
        r = cupy.ascontiguousarray(r)
        return r if r.data.ptr % self.alignment == 0 else r.copy()

    # the (W, B) inputs last checked and what they gave: a plan passes the same device weights on
    # every call, and their checks cost a few microseconds a call (a tenth of a small layer's time)
    _checked_weights: tuple[Any, Any, tuple] | None = None

    def _weight_args(self, cupy: Any, inputs: Sequence[Any]) -> tuple:
        """(w, b) as contiguous device arrays; b is a null pointer without a bias."""
        w_in = inputs[1] if len(inputs) > 1 else None
        b_in = inputs[2] if len(inputs) > 2 else None
        known = self._checked_weights
        if known is not None and w_in is known[0] and b_in is known[1] and w_in.shape == self.spec.weight_shape:
            return known[2]
        args = self._checked_weight_args(cupy, inputs)
        # only arrays used as they are: a contiguous copy would miss later writes into w_in
        if args[0] is w_in and (not self.spec.has_bias or args[1] is b_in):
            self._checked_weights = (w_in, b_in, args)
        return args

    def _checked_weight_args(self, cupy: Any, inputs: Sequence[Any]) -> tuple:
        spec = self.spec
        if len(inputs) < 2:
            raise PluginError(f"{self.name}: the weights W are missing from the inputs")
        w = checked_array(cupy, inputs[1], "weights W", self.name)
        if tuple(w.shape) != spec.weight_shape:
            raise PluginError(f"{self.name}: weights W have shape {tuple(w.shape)}, expected {spec.weight_shape}")
        if not spec.has_bias:
            return cupy.ascontiguousarray(w), np.uint64(0)  # null bias pointer: the kernel never reads it
        if len(inputs) < 3 or inputs[2] is None:
            raise PluginError(f"{self.name}: the bias B is missing from the inputs")
        b = checked_array(cupy, inputs[2], "bias B", self.name)
        if tuple(b.shape) != (spec.out_channels,):
            raise PluginError(f"{self.name}: bias B has shape {tuple(b.shape)}, expected ({spec.out_channels},)")
        return cupy.ascontiguousarray(w), cupy.ascontiguousarray(b)

    def _output(self, cupy: Any, out: Any, batch: int) -> Any:
        shape = self.output_shape(batch)
        if out is None:
            return cupy.empty(shape, dtype=cupy.float32)
        if isinstance(out, cupy.ndarray) and out.dtype is FLOAT32 and out.shape == shape and out.flags.c_contiguous:
            return out  # a prebound output (runtime/output_reuse.py) or a Concat's slice, as expected
        out = checked_array(cupy, out, "output", self.name)
        if tuple(out.shape) != shape or not out.flags.c_contiguous:
            raise PluginError(f"{self.name}: output must be a C-contiguous float32 array of shape {shape}")
        return out


class GridKernel(ConvKernel):
    """A variant that is one kernel function over a 2-D grid: x covers
    `threads(batch)` threads in blocks of BLOCK, y the map groups."""

    def __init__(self, spec, config, function, *, threads_per_image: int, grid_y: int, reads_weights: bool, epilogue=NONE,
                 residual_parameter: bool = False, alignment: int = 4):
        super().__init__(spec, config, [function], epilogue, alignment=alignment)
        self._function = function
        self._threads_per_image = threads_per_image
        self._grid_y = grid_y
        self.reads_weights = reads_weights
        self.residual_parameter = residual_parameter

    def _launch(self, x, weights, y, batch):
        grid = (-(-batch * self._threads_per_image // BLOCK), self._grid_y, 1)
        self._function(grid, (BLOCK, 1, 1), (x, *weights, y, np.int32(batch)))


