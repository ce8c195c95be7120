"""A custom op's kernel in CUDA C: a .cu file compiled by NVRTC for each node, with every shape
and attribute of the node as a macro, its errors reported at the file's own lines (the user-kernel
machinery of user_kernels/, given a contract made from the declaration).

The entry point (by default the op type in lower case) takes each input, then each output, then
the batch of the call:

    extern "C" __global__ void swish(const float* x, float* y, int batch)

Macros, for each input and output by its declared name in capitals (X, Y): X_RANK; X_DIM0 ..
X_DIM<rank-1>; X_PER_IMAGE (elements of one row of the first axis); X_SIZE (all its elements).
For a tensor whose first axis is the batch, X_DIM0 is `(batch)` and X_SIZE counts the call's
rows: both are read inside the kernel. HAS_<NAME> is 0 for an optional input the node leaves
out (its pointer is then null). Each attribute is ATTR_<NAME> (a float as a float literal), a
list of numbers ATTR_<NAME>_0 .. and ATTR_<NAME>_COUNT. Directives (`// opplugin: block=256`,
`outputs_per_thread=N`, `grid=...`) work as for a user's Conv kernel; `#error reject: why` turns
a node down (it then runs on the next implementation, or the reference).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from ..user_kernels.compiler import Compiled, Rejected, compile_node
from ..user_kernels.contract import Contract
from ..user_kernels.source import KernelSource, UserKernelError, evaluate
from .calling import DeclarationError
from .declaration import Implementation
from .outputs import batched_inputs, bytes_of, call_batch, new_outputs

# C types of the tensors a kernel may take
C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.int32): "int",
           np.dtype(np.int64): "long long", np.dtype(np.uint8): "unsigned char", np.dtype(np.bool_): "bool"}
GRID_X_LIMIT = 2**31 - 1


class CudaSource(Implementation):
    def __init__(self, path: str | Path, *, entry: str | None = None, name: str | None = None):
        self.path, self.entry = str(path), entry
        self.name = name or f"cuda:{Path(path).name}"
        self._compiled: dict[tuple, Compiled] = {}

    def source(self, op, node: NodeInfo) -> KernelSource:
        """The file read now (so an edit between runs is seen), held to the node's contract."""
        return KernelSource(self.path, op.op_type, declared=contract_for_node(op, node, self.entry))

    def unsupported_reason(self, op, node: NodeInfo, device: Device) -> str | None:
        types = [t for t in [*node.inputs, *node.outputs] if t.name and np.dtype(t.dtype) not in C_TYPES]
        if types:
            return f"{self.name} takes {', '.join(str(d) for d in C_TYPES)} tensors; {types[0].name} is {types[0].dtype}"
        if not device.is_cuda:
            return f"{self.name} needs a GPU"
        try:
            self.compiled(op, node, on_gpu=True)
        except Rejected as reason:
            return f"{self.name} rejects it: {reason}"
        return None

    def compiled(self, op, node: NodeInfo, on_gpu: bool) -> Compiled:
        """The node's compile (once per source text and macros): Rejected for a node the file turns
        down, UserKernelError (FILE:LINE: message) for any other failure."""
        source = self.source(op, node)
        defines = node_macros(op, node)
        key = (source.text, tuple(defines.items()), on_gpu)
        if key not in self._compiled:
            self._compiled[key] = compile_node(source, defines, on_gpu)
            source.check_grid(defines)
        return self._compiled[key]

    def build(self, op, node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        return CudaSourceKernel(self, op, node, variant, self.compiled(op, node, on_gpu=True), poison)


def compile_offline(implementation: CudaSource, op, node: NodeInfo) -> None:
    """Compile the node's source through NVRTC alone (no GPU): its errors, at the file's lines."""
    implementation.compiled(op, node, on_gpu=False)


def contract_for_node(op, node: NodeInfo, entry: str | None = None) -> Contract:
    """The contract of the op's kernel for this node: its entry point, and a parameter per input and output."""
    present = {index: t for index, t in enumerate(node.inputs) if t.name}
    default = next(iter(present.values())).dtype if present else np.float32  # an input left out: typed as the first
    parameters = [f"const {_c_type(present[i].dtype if i in present else default)}* {name.lower()}"
                  for i, name in enumerate(op.input_names)]
    parameters += [f"{_c_type(t.dtype)}* {name.lower()}" for name, t in zip(op.output_names, node.outputs)]
    return Contract(op_type=op.op_type, entry=entry or op.name.lower(), parameters=(*parameters, "int batch"),
                    defines=lambda info, epilogue: node_macros(op, info), outputs_per_image=lambda d: 0, weights=False,
                    starter="")


def _c_type(dtype) -> str:
    return C_TYPES.get(np.dtype(dtype), "float")


def node_macros(op, node: NodeInfo) -> dict[str, Any]:
    """The node's macros (see the module's docstring): int, float or C text values."""
    macros: dict[str, Any] = {}
    flags = batched_inputs(node)
    planned = next((t.shape[0] for t, b in zip(node.inputs, flags) if b), None)
    for index, name in enumerate(op.input_names):
        tensor = node.inputs[index] if index < len(node.inputs) else None
        present = tensor is not None and bool(tensor.name)
        if index >= op.required_inputs:
            macros[f"HAS_{name.upper()}"] = int(present)
        if present:
            macros.update(_tensor_macros(name.upper(), tuple(tensor.shape), flags[index]))
    for name, tensor in zip(op.output_names, node.outputs):
        batched = planned is not None and bool(tensor.shape) and tensor.shape[0] == planned
        macros.update(_tensor_macros(name.upper(), tuple(tensor.shape), batched))
    for name, value in node.spec.items():
        macros.update(_attribute_macros(f"ATTR_{name.upper()}", value))
    return macros


def _tensor_macros(prefix: str, shape: tuple[int, ...], batched: bool) -> dict[str, Any]:
    macros: dict[str, Any] = {f"{prefix}_RANK": len(shape)}
    for axis, size in enumerate(shape):
        macros[f"{prefix}_DIM{axis}"] = "(batch)" if axis == 0 and batched else int(size)
    per_image = int(np.prod(shape[1:])) if shape else 1
    macros[f"{prefix}_PER_IMAGE"] = per_image
    macros[f"{prefix}_SIZE"] = f"((long long)(batch) * {per_image}LL)" if batched else int(np.prod(shape))
    return macros


def _attribute_macros(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, (bool, int, float, np.integer, np.floating)):
        return {name: float(value) if isinstance(value, (float, np.floating)) else int(value)}
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return {f"{name}_COUNT": len(value), **{f"{name}_{i}": v for i, v in enumerate(value)}}
    return {}  # text, tensors, graphs: no macro


class CudaSourceKernel(Kernel):
    """One node's build of a CudaSource: launched with its inputs, new outputs and the call's batch."""

    def __init__(self, implementation: CudaSource, op, node: NodeInfo, variant: str, compiled: Compiled, poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.source = implementation.source(op, node)
        self.defines = node_macros(op, node)
        self.name = f"{op.name}.{variant}"
        self.function = compiled.module.get_function(self.source.contract.entry)
        self.functions = [self.function]

    def flops(self, batch: int) -> int:
        return 0  # unknown: the kernel is the user's

    def bytes_moved(self, batch: int) -> int:
        return bytes_of(self.node, batch)

    def grid(self, batch: int, elements: int) -> tuple[int, ...]:
        launch = self.source.launch
        if launch.grid:
            names = self.source.grid_names(self.defines, batch)
            grid = tuple(evaluate(text, names, self.source.grid_where) for text in launch.grid)
        else:
            grid = (max(1, -(-elements // (launch.outputs_per_thread * launch.block))),)
        if grid[0] > GRID_X_LIMIT or any(g > 65535 for g in grid[1:]) or any(g < 1 for g in grid):
            raise UserKernelError(f"{self.implementation.path}: grid {grid} for {self.node.name} at batch {batch} is outside CUDA's limits")
        return grid

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy

        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = call_batch(self.node, inputs)
            outputs = new_outputs(self.node, batch, self.poison)
            if outputs[0].size:
                arguments = [np.uint64(0) if value is None else cupy.ascontiguousarray(value) for value in inputs]
                arguments += [np.uint64(0)] * (len(self.op.input_names) - len(arguments))  # optional inputs left out
                try:
                    self.function(self.grid(batch or 0, int(outputs[0].size)), (self.source.launch.block,),
                                  (*arguments, *outputs, np.int32(batch or 0)))
                except UserKernelError:
                    raise
                except Exception as err:
                    raise DeclarationError(f"{self.implementation.path}: the kernel failed on {self.node.name}: {err}") from None
        return outputs
