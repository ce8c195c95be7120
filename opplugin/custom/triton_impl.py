"""A custom op's kernel in Triton: a @triton.jit function, or an @triton.autotune one whose
every configuration becomes a variant of its own, so that `opplugin tune` checks each against
the reference before it times it (Triton's own autotuner keeps the fastest unchecked).

    Triton(kernel, grid)    kernel[grid](*inputs, *outputs, **keywords)

The inputs and outputs are passed in order as torch tensors that share the CuPy arrays' memory
(DLPack: no copy); keywords are those of the kernel's parameters named after an attribute, or
`n_elements` (the first output's element count), or `batch`. `grid` is a tuple or a function of
the launch's meta-parameters, as Triton's own. The launch runs on the step's stream. Triton needs
torch and a GPU; without them the op's other kernels or its reference run.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import first_line
from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from .calling import DeclarationError
from .declaration import Implementation
from .outputs import bytes_of, call_batch, held_to_declaration, new_outputs


class Triton(Implementation):
    def __init__(self, kernel: Any, grid: tuple[int, ...] | Callable[[dict], Any], *, name: str | None = None):
        self.function, self.configs = _jit_function(kernel), list(getattr(kernel, "configs", None) or [])
        self.grid = grid
        base = getattr(self.function, "__name__", None) or getattr(getattr(self.function, "fn", None), "__name__", "kernel")
        self.name = name or f"triton:{base}"
        self.by_variant = {_config_name(self.name, c): c for c in self.configs} if self.configs else {self.name: None}

    def variants(self) -> list[str]:
        return list(self.by_variant)

    def unsupported_reason(self, op, node: NodeInfo, device: Device) -> str | None:
        if not device.is_cuda:
            return f"{self.name} needs a GPU"
        for module in ("triton", "torch"):
            try:
                __import__(module)
            except ImportError:
                return f"{self.name} needs {module}, which is not installed"
        return None

    def build(self, op, node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        kernel = TritonKernel(self, op, node, variant, self.by_variant[variant], poison)
        kernel.compile_now()
        return kernel


def _jit_function(kernel: Any) -> Any:
    """The @triton.jit function under an @triton.autotune (or heuristics) wrapper."""
    while hasattr(kernel, "fn") and not hasattr(kernel, "arg_names"):
        kernel = kernel.fn
    return kernel


def _config_name(base: str, config: Any) -> str:
    """A configuration as a variant name: its meta-parameters, warps and stages (triton:swish:BLOCK=1024,w4,s3)."""
    settings = ",".join(f"{k}={v}" for k, v in sorted(getattr(config, "kwargs", {}).items()))
    return f"{base}:{settings},w{getattr(config, 'num_warps', 4)},s{getattr(config, 'num_stages', 3)}"


class TritonKernel(Kernel):
    """One node's launch of a Triton kernel in one configuration."""

    def __init__(self, implementation: Triton, op, node: NodeInfo, variant: str, config: Any, poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.variant_name, self.config = variant, config
        self.name = f"{op.name}.{variant}"
        self.attributes = dict(node.spec)

    def flops(self, batch: int) -> int:
        return 0  # unknown: the kernel is the user's

    def bytes_moved(self, batch: int) -> int:
        return bytes_of(self.node, batch)

    def compile_now(self) -> None:
        """One launch on the node's shapes (random data): Triton compiles on first launch, and its
        errors are the declaration's, one line, here rather than in the middle of a run."""
        import cupy
        import numpy as np

        rng = np.random.default_rng(0)
        inputs = [None if not t.name else cupy.asarray(self.node.constants[t.name]) if t.name in self.node.constants
                  else cupy.asarray(rng.standard_normal(t.shape).astype(t.dtype)) for t in self.node.inputs]
        self(inputs, None)
        cupy.cuda.get_current_stream().synchronize()

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy
        import torch

        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = call_batch(self.node, inputs)
            outputs = new_outputs(self.node, batch, self.poison)
            if outputs[0].size:
                current = stream if stream is not None else cupy.cuda.get_current_stream()
                with torch.cuda.stream(torch.cuda.ExternalStream(current.ptr)):
                    self._launch(torch, [None if v is None else torch.from_dlpack(cupy.ascontiguousarray(v)) for v in inputs],
                                 [torch.from_dlpack(o) for o in outputs], batch)
            return held_to_declaration(self.op.op_type, self.variant_name, self.node, outputs, batch)

    def _launch(self, torch, inputs: list[Any], outputs: list[Any], batch: int | None) -> None:
        function = self.implementation.function
        names = set(getattr(function, "arg_names", ()))
        available = {**self.attributes, "n_elements": int(outputs[0].numel()), "batch": int(batch or 0)}
        keywords = {k: v for k, v in available.items() if k in names}
        launch = dict(keywords)
        if self.config is not None:
            launch.update(self.config.kwargs)
            launch.update(num_warps=self.config.num_warps, num_stages=self.config.num_stages)
        grid = self.implementation.grid
        try:
            function[grid](*inputs, *outputs, **launch)
        except Exception as err:  # Triton's compile errors are many types, several lines each
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.variant_name} failed: {first_line(err, named=True)}") from None
