"""A custom op's kernel in Python on CuPy arrays: any function (a CuPy ElementwiseKernel or
ReductionKernel inside it, or plain CuPy array code), or a cupy.RawKernel launched as is.

    CuPy(function)                      function(*inputs, **attributes) -> an array, or one per output
    CuPy(raw_kernel, grid=..., block=)  raw_kernel(grid, (block,), (*inputs, *outputs, *attributes, n))

A function gets the attributes it names as parameters (all of them with **kwargs). A RawKernel
gets the outputs made for it (NaN-filled in a check), then each attribute in declaration order
(a float as float32, an int as int32), then n, the first output's element count, as an int32;
`grid` is a tuple or a function of n (default: one thread per element).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from .calling import DeclarationError, accepted
from .declaration import Implementation
from .outputs import bytes_of, call_batch, held_to_declaration, new_outputs

DEFAULT_BLOCK = 256


class CuPy(Implementation):
    def __init__(self, function: Any, *, name: str | None = None, grid: tuple[int, ...] | Callable[[int], Any] | None = None,
                 block: int = DEFAULT_BLOCK):
        if not callable(function):
            raise DeclarationError(f"CuPy({function!r}): give a function on CuPy arrays or a cupy.RawKernel")
        self.function, self.grid, self.block = function, grid, int(block)
        self.name = name or f"cupy:{getattr(function, '__name__', None) or getattr(function, 'name', 'kernel')}"

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


class CuPyKernel(Kernel):
    """One node's CuPy implementation, launched on the step's stream."""

    def __init__(self, implementation: CuPy, op, node: NodeInfo, variant: str, poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.name = f"{op.name}.{variant}"
        self.attributes = dict(node.spec)
        self.raw = _is_raw_kernel(implementation.function)
        self.functions = [implementation.function] if self.raw else []

    def flops(self, batch: int) -> int:
        return 0  # unknown: the function is the user's

    def bytes_moved(self, batch: int) -> int:
        return bytes_of(self.node, batch)

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = call_batch(self.node, inputs)
            results = self._launch(list(inputs), batch) if self.raw else self._call(list(inputs))
            return held_to_declaration(self.op.op_type, self.implementation.name, self.node, results, batch)

    def _call(self, inputs: list[Any]) -> Any:
        function = self.implementation.function
        try:
            return function(*inputs, **accepted(function, self.attributes))
        except DeclarationError:
            raise
        except Exception as err:
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name} raised "
                                   f"{type(err).__name__}: {err}") from None

    def _launch(self, inputs: list[Any], batch: int | None) -> list[Any]:
        outputs = new_outputs(self.node, batch, self.poison)
        n = int(outputs[0].size)
        if n == 0:
            return outputs
        scalars = [_scalar(self.node.name, name, value) for name, value in self.attributes.items()]
        grid = self.implementation.grid
        grid = grid(n) if callable(grid) else grid or (max(1, -(-n // self.implementation.block)),)
        try:
            self.implementation.function(tuple(grid), (self.implementation.block,), (*inputs, *outputs, *scalars, np.int32(n)))
        except Exception as err:
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.implementation.name} failed to launch: "
                                   f"{type(err).__name__}: {err}") from None
        return outputs


def _scalar(node: str, name: str, value: Any) -> Any:
    """An attribute as a RawKernel argument: a float as float32, an int (or bool) as int32."""
    if isinstance(value, (bool, int, np.integer)):
        return np.int32(value)
    if isinstance(value, (float, np.floating)):
        return np.float32(value)
    raise DeclarationError(f"{node}: attribute {name!r} is {type(value).__name__}; a RawKernel takes int and float attributes only")
