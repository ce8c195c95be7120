"""Bring your own kernel: a user's .cu file runs in place of opplugin's own kernels.

    from opplugin.runtime import Runner
    runner = Runner(model, 1000, kernels={"Conv": "my_conv.cu"})

`KernelSource` reads a file (its directives, its entry point) and makes the source
NVRTC compiles per node; `UserPlugin` runs it; `user_registry` puts user plugins in
place of the registered ones; `CudaSourcePlugin` is the base class for a CUDA source
whose launch needs Python (see helper.py). The contract per op type is in contract.py,
and `opplugin new conv FILE` writes a starter that spells it out.

This package is what a run needs, and imports no lab: the tools around a kernel file
(--sanitize, --watch, `opplugin new`) are in user_kernel_tools/, and a user kernel's
bench and tune trial is lab/user_trial.py.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Mapping

from ..registry import Plugin, plugins
from .contract import CONTRACTS, Contract, contract_for
from .helper import CudaSourcePlugin
from .plugin import UserKernel, UserPlugin
from .source import KernelSource, UserKernelError, UserKernelHang

__all__ = ["CONTRACTS", "Contract", "CudaSourcePlugin", "KernelSource", "UserKernel", "UserKernelError", "UserKernelHang",
           "UserPlugin", "contract_for", "starter_text", "user_registry"]


def user_registry(kernels: Mapping[str, "KernelSource | str | Path"], base: Mapping[str, Plugin] | None = None,
                  *, poison: bool = False, probe: bool = True) -> dict[str, Plugin]:
    """The registry `base` (default: the registered plugins) with a UserPlugin per op type of
    `kernels` ({"Conv": "my_conv.cu"}); the plugin it replaces runs what the source rejects.
    `poison` fills outputs with NaN before each launch (check's setting); `probe` runs each
    node's kernel once on one image at build, to catch a hang there."""
    registry = dict(plugins() if base is None else base)
    for op_type, value in kernels.items():
        source = KernelSource.coerce(value, op_type)
        fallback = registry.get(op_type)
        if isinstance(fallback, UserPlugin):
            fallback = fallback.fallback
        registry[op_type] = UserPlugin(source, fallback, poison=poison, probe=probe)
    return registry


def starter_text(op_type: str) -> str:
    """The starter kernel of an op type with a contract."""
    return resources.files("opplugin.starters").joinpath(contract_for(op_type).starter).read_text()
