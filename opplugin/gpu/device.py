"""Where a plan runs: the CPU (plugin steps run their numpy reference) or a CUDA
device (plugin steps run CUDA kernels through CuPy; see cuda.py)."""
from __future__ import annotations

from dataclasses import dataclass

from . import cuda
from ..errors import DeviceError


@dataclass(frozen=True)
class Device:
    """"cpu" (numpy reference kernels) or "cuda" (CuPy), with the GPU's name,
    compute capability ("9.0") and total memory for a CUDA device."""

    kind: str
    name: str = "cpu"
    compute_capability: str = ""
    memory_bytes: int | None = None  # a GPU's total memory, for reports

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def arch(self) -> str:
        """The architecture its kernels are compiled for ("sm_90"; cuda.arch_of), for a CUDA device."""
        return cuda.arch_of(self.compute_capability)


CPU = Device("cpu")


def current_cuda_device() -> Device:
    """The current CUDA device (CuPy must see one)."""
    name, capability = cuda.current_properties()
    return Device("cuda", name, capability, cuda.total_memory_bytes())


def select_device(requested: str | None = "auto") -> Device:
    """"auto" takes the GPU when CuPy sees one; "cuda" without one is an error."""
    requested = requested or "auto"
    if requested == "cpu":
        return CPU
    if requested not in ("auto", "cuda"):
        raise DeviceError(f"unknown device {requested!r}; choose auto, cpu or cuda")
    if cuda.is_available():
        return current_cuda_device()
    if requested == "cuda":
        raise DeviceError("--device cuda was asked for, but no CUDA device is usable (is CuPy installed and a GPU visible?)")
    return CPU
