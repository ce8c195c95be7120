"""A custom op's kernel in CUDA C: a .cu file (or the text of one) compiled by NVRTC for each node,
with every shape and attribute of the node as a macro, its errors reported at the file's own lines
(the user-kernel machinery of user_kernels/, given a contract made from the declaration).

    CudaSource("swish.cu")                              entry point: the op type in lower case
    CudaSource(text, entry="swish", block=128, grid=lambda batch, macros: (...,))

The entry point takes each input, then each output, then the batch of the call, each pointer
typed after its tensor's dtype (float, double, int, long long, ...):

    extern "C" __global__ void swish(const float* x, float* y, int batch)

Macros, for each input and output by its declared name in capitals (X, Y): X_RANK; X_DIM0 ..
X_DIM<rank-1>; X_PER_IMAGE (elements of one row of the first axis); X_SIZE (all its elements).
For a tensor whose first axis is the batch, X_DIM0 is `(batch)` and X_SIZE counts the call's
rows: both are read inside the kernel. HAS_<NAME> is 0 for an optional input the node leaves
out (its pointer is then null). Each attribute is ATTR_<NAME> (a float as a float literal), a
list of numbers ATTR_<NAME>_0 .. and ATTR_<NAME>_COUNT (text attributes have none). BLOCK and
OUTPUTS_PER_THREAD are the launch's.

The launch: `block` threads a block; by default a one-dimensional grid covers the first output's
elements at `outputs_per_thread` a thread; `grid(batch, macros)` (macros as numbers at that batch)
or a fixed tuple replaces it. Directives in the file (`// opplugin: block=256`,
`outputs_per_thread=N`, `grid=...`) override these arguments, as for a user's Conv kernel.
`#error reject: why` turns a node down (it then runs on the next implementation, or the
reference). A compile error is one UserKernelError whose first line is FILE:LINE: message.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from ..user_kernels.compiler import Compiled, Rejected, compile_node
from ..user_kernels.contract import Contract
from ..user_kernels.plugin import probe_launch
from ..user_kernels.source import (DEFAULT_BLOCK, KernelSource, LaunchSpec, UserKernelError, check_entry_point, evaluate,
                                   read_kernel_file, strip_comments)
from .calling import DeclarationError
from .declaration import DeviceCode, Implementation
from .outputs import CallShapes, batched_inputs, sample_values

# C types of the tensors a kernel may take (float16 has none: it would need cuda_fp16.h)
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.int8): "signed char",
           np.dtype(np.int16): "short", np.dtype(np.int32): "int", np.dtype(np.int64): "long long",
           np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short", np.dtype(np.uint32): "unsigned int",
           np.dtype(np.uint64): "unsigned long long", np.dtype(np.bool_): "bool"}
GRID_X_LIMIT = 2**31 - 1
# the file name NVRTC's messages give for a source passed as text, its implementation's name inside
INLINE_FILE = "<{name}>"

Grid = Callable[[int, Mapping[str, Any]], Any]


class CudaSource(Implementation):
    """A CUDA C kernel for a custom op, compiled per node (see the module's docstring).

    `source`: a .cu file's path (read again at each build, so an edit between runs is seen), or
    the CUDA C text itself (anything with a newline in it, or `__global__`). `entry`: the entry
    point (default: the op type in lower case). `name`: the variant's name (default
    "cuda:FILE", or "cuda" for text). `block`, `outputs_per_thread`, `grid`: the launch, where the
    file's directives do not say it."""

    def __init__(self, source: str | Path, *, entry: str | None = None, name: str | None = None, block: int = DEFAULT_BLOCK,
                 outputs_per_thread: int = 1, grid: Grid | tuple[int, ...] | None = None):
        inline = isinstance(source, str) and ("\n" in source or "__global__" in source)
        self.text = source if inline else None
        self.name = name or ("cuda" if inline else f"cuda:{Path(source).name}")
        self.path = INLINE_FILE.format(name=self.name) if inline else str(source)
        if entry is not None and not re.fullmatch(r"[A-Za-z_]\w*", entry):
            raise DeclarationError(f"CudaSource({self.path}): the entry point {entry!r} is not a C name")
        if not isinstance(block, int) or not 1 <= block <= 1024:
            raise DeclarationError(f"CudaSource({self.path}): block must be a whole number from 1 to 1024, got {block!r}")
        if not isinstance(outputs_per_thread, int) or outputs_per_thread < 1:
            raise DeclarationError(f"CudaSource({self.path}): outputs_per_thread must be a whole number from 1, got {outputs_per_thread!r}")
        if grid is not None and not callable(grid) and not _is_grid(grid):
            raise DeclarationError(f"CudaSource({self.path}): grid is a function (batch, macros) -> tuple or a tuple of "
                                   f"one to three whole numbers, got {grid!r}")
        self.entry, self.grid = entry, grid
        self.launch_defaults = LaunchSpec(block=block, outputs_per_thread=outputs_per_thread)
        self._compiled: dict[tuple, Compiled | Rejected] = {}

    def source(self, op, node: NodeInfo) -> KernelSource:
        """The file read now (so an edit between runs is seen), held to the node's contract."""
        contract = contract_for_node(op, node, self.entry)
        if self.text is None:
            return KernelSource(self.path, op.op_type, declared=contract, defaults=self.launch_defaults)
        source = KernelSource(self.path, op.op_type, text=self.text, declared=contract, defaults=self.launch_defaults)
        check_entry_point(self.path, self.text, contract)
        return source

    def unsupported_reason(self, op, node: NodeInfo, device: Device) -> str | None:
        types = [t for t in [*node.inputs, *node.outputs] if t.name and np.dtype(t.dtype) not in C_TYPES]
        if types:
            return f"{self.name} takes {', '.join(str(d) for d in C_TYPES)} tensors; {types[0].name} is {np.dtype(types[0].dtype)}"
        if not device.is_cuda:
            return f"{self.name} needs a GPU"
        try:
            self.prepare(op, node, on_gpu=True)
        except Rejected as reason:
            return f"{self.name} rejects it: {reason}"
        return None

    def prepare(self, op, node: NodeInfo, on_gpu: bool) -> tuple[KernelSource, Compiled]:
        """The node's source and its compile (once per text, launch and macros): Rejected for a node
        the file turns down, UserKernelError (FILE:LINE: message first) for any other failure."""
        source = self.source(op, node)
        defines = node_macros(op, node)
        key = (source.text, source.launch, source.contract.signature, tuple(defines.items()), on_gpu)
        if key not in self._compiled:
            try:
                compiled: Compiled | Rejected = compile_node(source, defines, on_gpu)
            except Rejected as reason:
                compiled = reason
            else:
                source.check_grid(node_macros(op, node, batch=1))
            self._compiled[key] = compiled
        compiled = self._compiled[key]
        if isinstance(compiled, Rejected):
            raise compiled
        return source, compiled

    def compiled(self, op, node: NodeInfo, on_gpu: bool) -> Compiled:
        return self.prepare(op, node, on_gpu)[1]

    def compile_offline(self, op, node: NodeInfo) -> None:
        """Compile the node's source through NVRTC alone (no GPU needed): Rejected, or its errors at the file's lines."""
        self.prepare(op, node, on_gpu=False)

    def device_code(self, op) -> DeviceCode:
        text = self.text if self.text is not None else read_kernel_file(self.path)
        return DeviceCode(self.name, self.entry or c_name(op.name).lower(), self.path, text,
                          "__shared__" in strip_comments(text), is_file=self.text is None)

    def build(self, op, node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        source, compiled = self.prepare(op, node, on_gpu=True)
        kernel = CudaSourceKernel(self, op, node, variant, source, compiled, poison)
        probe_launch(kernel, sample_inputs(node, 1), self.path, node.name)  # a hang or a fault here, not mid-run
        return kernel


def _is_grid(value: Any) -> bool:
    return (isinstance(value, (tuple, list)) and 1 <= len(value) <= 3
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value))


def c_name(name: str) -> str:
    """A declared name as a C identifier (what is not a letter, digit or _ becomes _)."""
    name = re.sub(r"\W", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def contract_for_node(op, node: NodeInfo, entry: str | None = None) -> Contract:
    """The contract of the op's kernel for this node: its entry point, and a parameter per input and output."""
    present = {index: t for index, t in enumerate(node.inputs) if t.name}
    default = next(iter(present.values())).dtype if present else np.float32  # an input left out: typed as the first
    parameters = [f"const {_c_type(present[i].dtype if i in present else default)}* {c_name(name).lower()}"
                  for i, name in enumerate(op.input_names)]
    parameters += [f"{_c_type(t.dtype)}* {c_name(name).lower()}" for name, t in zip(op.output_names, node.outputs)]
    return Contract(op_type=op.op_type, entry=entry or c_name(op.name).lower(), parameters=(*parameters, "int batch"),
                    defines=lambda info, epilogue: node_macros(op, info), outputs_per_image=lambda d: 0, weights=False,
                    starter="")


def _c_type(dtype) -> str:
    return C_TYPES.get(np.dtype(dtype), "float")


def node_macros(op, node: NodeInfo, batch: int | None = None) -> dict[str, Any]:
    """The node's macros (see the module's docstring): int, float or C text values. With `batch`,
    those that follow the batch (X_DIM0, X_SIZE of a batched tensor) are numbers at it."""
    macros: dict[str, Any] = {}
    flags = batched_inputs(node)
    planned = next((t.shape[0] for t, b in zip(node.inputs, flags) if b), None)
    for index, name in enumerate(op.input_names):
        tensor = node.inputs[index] if index < len(node.inputs) else None
        present = tensor is not None and bool(tensor.name)
        if index >= op.required_inputs:
            macros[f"HAS_{c_name(name).upper()}"] = int(present)
        if present:
            macros.update(_tensor_macros(c_name(name).upper(), tuple(tensor.shape), flags[index], batch))
    for name, tensor in zip(op.output_names, node.outputs):
        batched = planned is not None and bool(tensor.shape) and tensor.shape[0] == planned
        macros.update(_tensor_macros(c_name(name).upper(), tuple(tensor.shape), batched, batch))
    attributes = node.spec if node.spec is not None else op.make_spec(node)
    for name, value in attributes.items():
        macros.update(_attribute_macros(f"ATTR_{c_name(name).upper()}", value))
    return macros


def _tensor_macros(prefix: str, shape: tuple[int, ...], batched: bool, batch: int | None) -> dict[str, Any]:
    macros: dict[str, Any] = {f"{prefix}_RANK": len(shape)}
    per_image = int(np.prod(shape[1:])) if shape else 1
    for axis, size in enumerate(shape):
        macros[f"{prefix}_DIM{axis}"] = ("(batch)" if batch is None else int(batch)) if axis == 0 and batched else int(size)
    macros[f"{prefix}_PER_IMAGE"] = per_image
    if batched:
        macros[f"{prefix}_SIZE"] = f"((long long)(batch) * {per_image}LL)" if batch is None else int(batch) * per_image
    else:
        macros[f"{prefix}_SIZE"] = int(np.prod(shape))
    return macros


def _attribute_macros(name: str, value: Any) -> dict[str, Any]:
    number = (bool, int, float, np.integer, np.floating, np.bool_)
    if isinstance(value, number):
        return {name: float(value) if isinstance(value, (float, np.floating)) else int(value)}
    if isinstance(value, (list, tuple)) and all(isinstance(v, number) for v in value):
        return {f"{name}_COUNT": len(value),
                **{f"{name}_{i}": float(v) if isinstance(v, (float, np.floating)) else int(v) for i, v in enumerate(value)}}
    return {}  # text, tensors, graphs, None: no macro


def sample_inputs(node: NodeInfo, rows: int | None = 1) -> list[Any]:
    """CuPy inputs for a trial launch (outputs.sample_values on the device)."""
    import cupy

    return [None if value is None else cupy.asarray(value) for value in sample_values(node, rows)]


class CudaSourceKernel(Kernel):
    """One node's build of a CudaSource: launched with its inputs, new outputs (NaN-filled first
    where `poison`) and the call's batch, on the step's stream."""

    def __init__(self, implementation: CudaSource, op, node: NodeInfo, variant: str, source: KernelSource, compiled: Compiled,
                 poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.source, self.shapes = source, CallShapes(node)
        self._grids: dict[int, tuple[int, ...]] = {}  # by batch: a launch's grid, worked out once
        self.name = f"{op.name}.{variant}"
        self.function = compiled.module.get_function(source.contract.entry)
        self.functions = [self.function]  # what the lab reads registers and local memory from

    def flops(self, batch: int) -> int:
        return 0  # unknown: the kernel is the user's

    def bytes_moved(self, batch: int) -> int:
        return self.shapes.bytes(batch)

    def macros(self, batch: int) -> dict[str, Any]:
        """The node's macros as numbers at this batch, with BLOCK, OUTPUTS_PER_THREAD and batch."""
        launch = self.source.launch
        return {**node_macros(self.op, self.node, batch), "BLOCK": launch.block,
                "OUTPUTS_PER_THREAD": launch.outputs_per_thread, "batch": batch}

    def grid(self, batch: int, elements: int) -> tuple[int, ...]:
        """The launch's grid at this batch (`elements`: the first output's there), once per batch."""
        if batch not in self._grids:
            self._grids[batch] = self._grid(batch, elements)
        return self._grids[batch]

    def _grid(self, batch: int, elements: int) -> tuple[int, ...]:
        launch, chosen = self.source.launch, self.implementation.grid
        where = self.implementation.path
        if launch.grid:
            names = self.source.grid_names(node_macros(self.op, self.node, batch), batch)
            grid = tuple(evaluate(text, names, self.source.grid_where) for text in launch.grid)
        elif callable(chosen):
            try:
                given = chosen(batch, self.macros(batch))
            except Exception as err:
                raise DeclarationError(f"{where}: the grid function raised {type(err).__name__}: {err} "
                                       f"({self.node.name}, batch {batch})") from None
            grid = tuple(given) if isinstance(given, (tuple, list)) else (given,)
            if not _is_grid(grid):
                raise DeclarationError(f"{where}: the grid function gave {given!r} for {self.node.name} at batch {batch}; "
                                       "give one to three whole numbers")
            grid = tuple(int(g) for g in grid)
        elif chosen is not None:
            grid = tuple(int(g) for g in chosen)
        else:
            grid = (max(1, -(-elements // (launch.outputs_per_thread * launch.block))),)
        if grid[0] > GRID_X_LIMIT or any(g > 65535 for g in grid[1:]) or any(g < 1 for g in grid):
            raise UserKernelError(f"{where}: grid {grid} for {self.node.name} at batch {batch} is outside CUDA's limits")
        return grid

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy

        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = self.shapes.batch(inputs)
            outputs = self.shapes.new_outputs(batch, self.poison)
            if any(o.size for o in outputs):
                arguments = [np.uint64(0) if value is None else cupy.ascontiguousarray(value, dtype=tensor.dtype)
                             for value, tensor in zip(inputs, self.node.inputs)]
                arguments += [np.uint64(0)] * (len(self.op.input_names) - len(arguments))  # optional inputs left out
                grid = self.grid(batch or 0, int(outputs[0].size))
                try:
                    self.function(grid, (self.source.launch.block,), (*arguments, *outputs, np.int32(batch or 0)))
                except Exception as err:
                    raise DeclarationError(f"{self.implementation.path}: the kernel failed on {self.node.name}: {err}") from None
        return outputs
