"""A custom op's kernel in Python on CuPy arrays: any function (plain CuPy array code, a CuPy
ElementwiseKernel or ReductionKernel, a function that calls them), or a cupy.RawKernel launched
as is.

    CuPy(function)                      function(*inputs, **attributes) -> an array, or one per output
    CuPy(elementwise_kernel)            kernel(*inputs, *attributes)    (positionally, see below)
    CuPy(raw_kernel, grid=..., block=)  raw_kernel(grid, (block,), (*inputs, *outputs, *attributes, n))

A function gets the attributes it names as parameters (all of them where it takes **kwargs); what
it returns is held to the declaration (each output's shape at the call's batch, and dtype).

A CuPy ElementwiseKernel or ReductionKernel has no Python signature: it gets the inputs, then for
each further input parameter it declares, the attribute of that parameter's name (else the next
attribute in declaration order), as a scalar of the parameter's type (of the first input's dtype for
a float where the type is a placeholder such as T, int32 for an int); it allocates its outputs.

A RawKernel gets the outputs made for it (NaN-filled in a check), then each number attribute in
declaration order (a float as float32, an int or bool as int32; text attributes are skipped), then
n, the first output's element count, as an int32. `grid` is a tuple or a function of n (default:
one thread per element, `block` threads a block). CuPy is imported only on the GPU machine.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from .calling import DeclarationError, accepted
from .declaration import Implementation
from .outputs import CallShapes

DEFAULT_BLOCK = 256


class CuPy(Implementation):
    """A CuPy function or kernel for a custom op (see the module's docstring). `name`: the variant's
    name (default "cupy:<the function's name>"); `grid`, `block`: a RawKernel's launch."""

    def __init__(self, function: Any, *, name: str | None = None, grid: tuple[int, ...] | Callable[[int], Any] | None = None,
                 block: int = DEFAULT_BLOCK):
        if not callable(function):
            raise DeclarationError(f"CuPy({function!r}): give a function on CuPy arrays or a cupy.RawKernel")
        if not isinstance(block, int) or not 1 <= block <= 1024:
            raise DeclarationError(f"CuPy({function!r}): block must be a whole number from 1 to 1024, got {block!r}")
        self.function, self.grid, self.block = function, grid, int(block)
        self.name = name or f"cupy:{getattr(function, '__name__', None) or getattr(function, 'name', None) or 'kernel'}"

    def unsupported_reason(self, op, node: NodeInfo, device: Device) -> str | None:
        return None if device.is_cuda else f"{self.name} runs on CuPy arrays and needs a GPU"

    def build(self, op, node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        return CuPyKernel(self, op, node, variant, poison)


def _is_raw_kernel(function: Any) -> bool:
    try:
        import cupy
    except ImportError:
        return False
    return isinstance(function, cupy.RawKernel)


def is_cupy_kernel(function: Any) -> bool:
    """An ElementwiseKernel or ReductionKernel (anything with CuPy's `in_params` and `nin`)."""
    return hasattr(function, "in_params") and hasattr(function, "nin")


class CuPyKernel(Kernel):
    """One node's CuPy implementation, launched on the step's stream."""

    def __init__(self, implementation: CuPy, op, node: NodeInfo, variant: str, poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.name = f"{op.name}.{variant}"
        self.shapes = CallShapes(node)
        self.variant_name = variant
        self.attributes = dict(node.spec if node.spec is not None else op.make_spec(node))
        function = implementation.function
        self.raw = _is_raw_kernel(function)
        self.functions = [function] if self.raw else []  # what the lab reads registers and local memory from
        if not self.raw and implementation.grid is not None:
            raise DeclarationError(f"{node.name}: {op.op_type} {implementation.name}: grid is a RawKernel's; "
                                   f"{type(function).__name__} is none")
        # a RawKernel's attribute arguments, found wrong here rather than at the first launch
        self.scalars = [_scalar(node.name, name, value) for name, value in self.attributes.items()
                        if not isinstance(value, str)] if self.raw else []

    def flops(self, batch: int) -> int:
        return 0  # unknown: the function is the user's

    def bytes_moved(self, batch: int) -> int:
        return self.shapes.bytes(batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy

        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = self.shapes.batch(inputs)
            results = self._launch(list(inputs), batch) if self.raw else self._call(list(inputs))
            results = self.shapes.held(self.op.op_type, self.implementation.name, results, batch)
            for tensor, value in zip(self.node.outputs, results):
                if not isinstance(value, cupy.ndarray):
                    raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name} returned "
                                           f"{tensor.name} as {type(value).__module__}.{type(value).__name__}, not a CuPy array")
            return [cupy.ascontiguousarray(value) for value in results]

    def _call(self, inputs: list[Any]) -> Any:
        function = self.implementation.function
        try:
            if is_cupy_kernel(function):
                return function(*inputs, *kernel_attributes(function, inputs, self.attributes))
            return function(*inputs, **accepted(function, self.attributes))
        except DeclarationError:
            raise
        except Exception as err:
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name} raised "
                                   f"{type(err).__name__}: {_first(err)}") from None

    def _launch(self, inputs: list[Any], batch: int | None) -> list[Any]:
        import cupy

        outputs = self.shapes.new_outputs(batch, self.poison)
        n = int(outputs[0].size)
        if n == 0:
            return outputs
        grid = self.implementation.grid
        try:
            grid = grid(n) if callable(grid) else grid or (max(1, -(-n // self.implementation.block)),)
            grid = tuple(int(g) for g in grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        except Exception as err:
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name}: the grid for n={n} "
                                   f"failed: {type(err).__name__}: {_first(err)}") from None
        arguments = [np.uint64(0) if value is None else cupy.ascontiguousarray(value) for value in inputs]
        try:
            self.implementation.function(grid, (self.implementation.block,), (*arguments, *outputs, *self.scalars, np.int32(n)))
        except Exception as err:
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name} failed to launch: "
                                   f"{type(err).__name__}: {_first(err)}") from None
        return outputs


def kernel_attributes(kernel: Any, inputs: Sequence[Any], attributes: dict[str, Any]) -> list[Any]:
    """The attributes an ElementwiseKernel or ReductionKernel takes after the inputs: one for each
    further input parameter, by that parameter's name where an attribute has it, else the next in
    declaration order, each as a NumPy scalar of the parameter's type."""
    params = list(kernel.in_params)[len(inputs):int(kernel.nin)]
    remaining = [name for name in attributes if not any(p.name == name for p in params)]
    floating = next((np.dtype(v.dtype) for v in inputs if v is not None and np.issubdtype(v.dtype, np.floating)), np.dtype(np.float32))
    values = []
    for param in params:
        if param.name in attributes:
            value = attributes[param.name]
        elif remaining:
            value = attributes[remaining.pop(0)]
        else:
            break  # fewer attributes than parameters: the kernel says what is missing
        dtype = getattr(param, "dtype", None)
        if dtype is not None:
            values.append(np.dtype(dtype).type(value))
        elif isinstance(value, (float, np.floating)):
            values.append(floating.type(value))
        elif isinstance(value, (bool, int, np.integer, np.bool_)):
            values.append(np.int32(value))
        else:
            values.append(value)
    return values


def _scalar(node: str, name: str, value: Any) -> Any:
    """An attribute as a RawKernel argument: a float as float32, an int (or bool) as int32."""
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return np.int32(value)
    if isinstance(value, (float, np.floating)):
        return np.float32(value)
    raise DeclarationError(f"{node}: attribute {name!r} is {type(value).__name__}; a RawKernel takes int and float attributes "
                           "only (give it another implementation kind, or leave the attribute out)")


def _first(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
