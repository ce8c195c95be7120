"""A custom op's kernel in Triton: a @triton.jit function, or an @triton.autotune one whose
every configuration becomes a variant of its own (named like triton:swish:BLOCK=1024,w4,s3), so
that `opplugin tune` checks each against the reference before it times it (Triton's own
autotuner keeps the fastest unchecked).

    Triton(kernel, grid)                kernel[grid](*inputs, *outputs, **keywords, **configuration)
    Triton(kernel, grid, BLOCK=1024)    ... the same, with BLOCK=1024 in every launch

The inputs and outputs are passed in order as torch tensors that share the CuPy arrays' memory
(DLPack: no copy); the outputs are made by opplugin (NaN-filled in a check; zeroed where the
autotuner's `reset_to_zero` names them). Keywords, each only where the kernel has a parameter of
that name: each attribute by its name, `n_elements` (the first output's element count), `batch`
(the call's), and the numbers a CUDA source gets as macros (cuda_source.py), at the call's batch:
X_DIM1, Y_SIZE, HAS_B, ATTR_STRIDES_0 and so on, so that a kernel such as a Conv reads its shapes
and list attributes as plain integers. Then an autotune configuration's meta-parameters,
num_warps, num_stages (and num_ctas, maxnreg where set), and the constructor's extra keywords.
`grid` is a tuple or a function of the launch's meta-parameters, as Triton's own. The launch runs
on the step's CuPy stream. The build launches each variant once on random inputs, so a kernel that
does not compile is one DeclarationError line there. Triton needs torch and a GPU; without them the
op's other kernels or its reference run. triton and torch are imported only when a kernel is built.
"""
from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import first_line
from ..gpu.device import Device
from ..registry import Kernel, NodeInfo
from .calling import DeclarationError
from .cuda_source import node_macros, sample_inputs
from .declaration import DeviceCode, Implementation
from .outputs import CallShapes


class Triton(Implementation):
    """A Triton kernel for a custom op (see the module's docstring). `name`: the variant's name
    (default "triton:<the kernel's name>"; an autotuned kernel's configurations add theirs)."""

    def __init__(self, kernel: Any, grid: tuple[int, ...] | Callable[[dict], Any], *, name: str | None = None, **launch: Any):
        tuner = _autotuner(kernel)
        self.function = tuner.fn if tuner is not None else kernel
        self.configs = list(tuner.configs) if tuner is not None else []
        self.reset_to_zero = list(getattr(tuner, "reset_to_zero", None) or [])
        if not callable(grid) and not isinstance(grid, (tuple, list)):
            raise DeclarationError(f"Triton({_name_of(self.function)}): grid is a tuple or a function of the meta-parameters, got {grid!r}")
        self.grid, self.launch = grid if callable(grid) else tuple(grid), dict(launch)
        self.name = name or f"triton:{_name_of(self.function)}"
        for config in self.configs:
            clash = set(getattr(config, "kwargs", {})) & set(self.launch)
            if clash:
                raise DeclarationError(f"{self.name}: {sorted(clash)[0]} is both an autotune meta-parameter and a keyword of Triton()")
        self.by_variant = {_config_name(self.name, c): c for c in self.configs} if self.configs else {self.name: None}

    def variants(self) -> list[str]:
        return list(self.by_variant)

    def unsupported_reason(self, op, node: NodeInfo, device: Device) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed"
        if importlib.util.find_spec("torch") is None:
            return f"{self.name} needs torch, which is not installed"
        if not device.is_cuda:
            return f"{self.name} needs a GPU"
        return None

    def device_code(self, op) -> DeviceCode | None:
        """The kernel as the device names it (its function's name) in the Python file it is written in."""
        function = _python_function(self.function)
        try:
            path = inspect.getsourcefile(function)
            text = Path(path).read_text() if path else None
        except (TypeError, OSError, UnicodeDecodeError):
            text = None
        if text is None:
            return None
        return DeviceCode(self.name, _name_of(self.function), path, text)

    def build(self, op, node: NodeInfo, device: Device, variant: str, poison: bool) -> Kernel:
        kernel = TritonKernel(self, op, node, variant, self.by_variant[variant], poison)
        kernel.compile_now()
        return kernel


def _autotuner(kernel: Any) -> Any:
    """The @triton.autotune wrapper (triton.runtime.Autotuner: its `configs` and `fn`), or None.
    Its `fn` is launched as it is: a @triton.heuristics wrapper under it still applies."""
    wraps = getattr(kernel, "fn", None)
    if type(kernel).__name__ == "Autotuner" or (hasattr(kernel, "configs") and wraps is not None and not inspect.isfunction(wraps)):
        return kernel
    return None


def _python_function(kernel: Any) -> Any:
    """The Python function under @triton.jit (and any @triton.heuristics), or None."""
    for _ in range(8):
        if inspect.isfunction(kernel):
            return kernel
        kernel = getattr(kernel, "fn", None)
    return None


def _jit_source(kernel: Any) -> str | None:
    """The source Triton compiles of the @triton.jit function under any wrapper (from its `def`), or None."""
    for _ in range(8):
        if kernel is None or inspect.isfunction(kernel):
            return None
        if isinstance(getattr(kernel, "src", None), str):
            return kernel.src
        kernel = getattr(kernel, "fn", None)
    return None


def _name_of(kernel: Any) -> str:
    function = _python_function(kernel)
    return getattr(kernel, "__name__", None) or getattr(function, "__name__", None) or "kernel"


def _config_name(base: str, config: Any) -> str:
    """A configuration as a variant name: its meta-parameters, warps and stages (triton:swish:BLOCK=1024,w4,s3),
    with its CTAs and register cap where set."""
    settings = [f"{k}={v}" for k, v in sorted(getattr(config, "kwargs", {}).items())]
    settings += [f"w{getattr(config, 'num_warps', 4)}", f"s{getattr(config, 'num_stages', 3)}"]
    if (getattr(config, "num_ctas", 1) or 1) != 1:
        settings.append(f"c{config.num_ctas}")
    if getattr(config, "maxnreg", None):
        settings.append(f"r{config.maxnreg}")
    return f"{base}:{','.join(settings)}"


def config_keywords(config: Any) -> dict[str, Any]:
    """What a launch in this autotune configuration adds: its meta-parameters and its options."""
    if hasattr(config, "all_kwargs"):
        return dict(config.all_kwargs())
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def compile_message(err: BaseException, function: Any) -> str:
    """A Triton error as one line: a compile error as FILE:LINE: its message (Triton counts lines
    from the kernel's `def`), any other as its type and first line."""
    node, message = getattr(err, "node", None), getattr(err, "error_message", None)
    if node is None or not hasattr(node, "lineno") or not hasattr(err, "src"):
        return first_line(err, named=True)
    if not message and err.__cause__ is not None:
        message = first_line(err.__cause__, named=True)
    text = message.strip().splitlines()[0] if message and message.strip() else type(err).__name__
    where = f"line {node.lineno} of the kernel"
    python = _python_function(function)
    own = _jit_source(function)
    if own is not None and err.src is not None and own != err.src:  # in a @triton.jit function the kernel calls
        return f"line {node.lineno} of a function {_name_of(function)} calls: {text}"
    try:
        lines, start = inspect.getsourcelines(python)
        offset = next(i for i, line in enumerate(lines) if re.match(r"\s*def\s", line))
        where = f"{inspect.getsourcefile(python)}:{start + offset + node.lineno - 1}"
    except (TypeError, OSError, StopIteration):
        pass
    return f"{where}: {text}"


class TritonKernel(Kernel):
    """One node's launch of a Triton kernel in one configuration, on the step's stream."""

    def __init__(self, implementation: Triton, op, node: NodeInfo, variant: str, config: Any, poison: bool):
        self.implementation, self.op, self.node, self.poison = implementation, op, node, poison
        self.variant_name, self.config = variant, config
        self.shapes = CallShapes(node)
        self.name = f"{op.name}.{variant}"
        self.attributes = dict(node.spec if node.spec is not None else op.make_spec(node))
        self.arg_names = list(getattr(implementation.function, "arg_names", ()))
        self._launches: dict[int | None, dict[str, Any]] = {}  # per batch: what a launch passes by name
        self._streams: dict[int, Any] = {}  # CuPy stream pointer -> torch's handle on it
        outputs = len(node.outputs)
        # the outputs the autotuner says to zero before a launch (kernels that accumulate with atomics)
        positions = {name: index for index, name in enumerate(self.arg_names)}
        first_output = len(node.inputs)
        self.zeroed = [positions[name] - first_output for name in implementation.reset_to_zero
                       if name in positions and 0 <= positions[name] - first_output < outputs]

    def flops(self, batch: int) -> int:
        return 0  # unknown: the kernel is the user's

    def bytes_moved(self, batch: int) -> int:
        return self.shapes.bytes(batch)

    def compile_now(self) -> None:
        """One launch on one image of random inputs: Triton compiles on first launch, and its
        errors are the declaration's, one line, here rather than in the middle of a run."""
        import cupy

        self(sample_inputs(self.node, 1), None)
        cupy.cuda.get_current_stream().synchronize()

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> list[Any]:
        import cupy
        import torch

        from ..gpu import cuda

        with cuda.on_stream(stream):
            batch = self.shapes.batch(inputs)
            outputs = self.shapes.new_outputs(batch, self.poison)
            for index in self.zeroed:
                outputs[index].fill(0)
            if any(o.size for o in outputs):
                current = stream if stream is not None else cupy.cuda.get_current_stream()
                with torch.cuda.stream(self._torch_stream(current)):
                    self._launch([None if v is None else torch.from_dlpack(cupy.ascontiguousarray(v)) for v in inputs],
                                 [torch.from_dlpack(o) for o in outputs], batch)
            return self.shapes.held(self.op.op_type, self.variant_name, outputs, batch)

    def _torch_stream(self, current: Any) -> Any:
        """torch's handle on the CuPy stream (made once per stream: it costs microseconds a call)."""
        import cupy
        import torch

        if current.ptr not in self._streams:
            device = torch.device("cuda", cupy.cuda.runtime.getDevice())
            # CuPy's null stream is the legacy default stream, torch's default stream too
            self._streams[current.ptr] = (torch.cuda.ExternalStream(current.ptr, device=device) if current.ptr
                                          else torch.cuda.default_stream(device))
        return self._streams[current.ptr]

    def _launch(self, inputs: list[Any], outputs: list[Any], batch: int | None) -> None:
        function = self.implementation.function
        try:
            function[self.implementation.grid](*inputs, *outputs, **self.launch_keywords(batch))
        except Exception as err:  # Triton's compile errors are many types, several lines each
            raise DeclarationError(f"{self.node.name}: {self.op.op_type} {self.variant_name} failed: "
                                   f"{compile_message(err, function)}") from None

    def launch_keywords(self, batch: int | None) -> dict[str, Any]:
        """What a launch at this batch passes by name (see the module's docstring), made once per batch."""
        if batch not in self._launches:
            numbers = {k: v for k, v in node_macros(self.op, self.node, batch if batch is not None else 0).items()
                       if isinstance(v, (int, float))}
            elements = int(np.prod(self.shapes.output_shapes(batch)[0]))
            offered = {**numbers, **self.attributes, "batch": int(batch or 0), "n_elements": elements}
            launch = {k: v for k, v in offered.items() if k in self.arg_names}
            if self.config is not None:
                launch.update(config_keywords(self.config))
            self._launches[batch] = {**launch, **self.implementation.launch}
        return self._launches[batch]
