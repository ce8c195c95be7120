"""What a user's kernel source must provide, per ONNX op type: its entry point, the
signature the runner launches it with, the macros it gets for each node, and the
shape of its output.

Each contract is data plus two small functions, so that the starter, the compile
check and the launch all read the same facts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import PluginError
from ..registry import NodeInfo


@dataclass(frozen=True)
class Contract:
    """One op type's contract with a user kernel."""

    op_type: str
    entry: str  # the extern "C" __global__ function the runner launches
    parameters: tuple[str, ...]  # C parameter declarations, in launch order
    defines: Callable[[NodeInfo, object], dict[str, int]]  # the node's macros (and its fused epilogue)
    outputs_per_image: Callable[[dict[str, int]], int]  # elements one image's output holds, from the macros
    weights: bool  # whether the node has weights the runner can put in __constant__ memory
    starter: str  # the starter's file name under opplugin/starters

    @property
    def signature(self) -> str:
        return f'extern "C" __global__ void {self.entry}({", ".join(self.parameters)})'

    @property
    def parameter_types(self) -> str:
        """The parameter types alone, for the compile-time signature check."""
        return ", ".join(p.rsplit(" ", 1)[0] for p in self.parameters)


# the activations a user's `fuses=epilogue` Conv kernel applies itself, as its ACT macro
USER_ACTIVATION_CODES = {None: 0, "Relu": 1, "Tanh": 2}


def user_fusable(epilogue) -> bool:
    """Whether a user's `fuses=epilogue` kernel can run `epilogue` from its ACT, PKH, PKW
    macros: no residual, and no activation or a plain Relu or Tanh. Any other runs after
    the kernel as a CuPy step."""
    from ..ops.activation import Activation

    act = epilogue.activation
    return not epilogue.residual and (act is None or (act.op in USER_ACTIVATION_CODES and act == Activation.plain(act.op)))


def conv_user_defines(spec, epilogue) -> dict[str, int]:
    """The Conv contract's macros for a spec and the epilogue the kernel applies itself (NONE for none)."""
    from ..ops.conv.families.base import shape_defines

    defines = shape_defines(spec, epilogue)
    for name in ("BLOCK", "RESIDUAL", "POOL_FIRST", "ACTIVATION(v)"):  # the source's own directive says its block size
        defines.pop(name, None)
    defines["ACT"] = USER_ACTIVATION_CODES[epilogue.activation.op if epilogue.activation else None]
    return defines


def _conv_defines(node: NodeInfo, epilogue) -> dict[str, int]:
    from ..ops.conv.epilogue import NONE
    from ..ops.conv.spec import ConvSpec

    spec = ConvSpec.from_node(node)
    if spec.rank != 2:
        raise PluginError(f"the Conv contract covers 2-D convolution; {node.name} is {spec.rank}-D")
    return conv_user_defines(spec, epilogue or NONE)


def _elementwise_defines(node: NodeInfo, epilogue) -> dict[str, int]:
    shape = node.inputs[0].shape
    if not shape or any(d < 1 for d in shape):
        raise PluginError(f"{node.op_type} {node.name}: its input shape {list(shape)} is not known")
    return {"N_PER_IMAGE": int(np.prod(shape[1:])) if len(shape) > 1 else 1}


CONTRACTS: dict[str, Contract] = {
    "Conv": Contract(
        op_type="Conv",
        entry="conv",
        parameters=("const float* x", "const float* w", "const float* b", "float* y", "int batch"),
        defines=_conv_defines,
        outputs_per_image=lambda d: d["M"] * d["POH"] * d["POW"],
        weights=True,
        starter="conv.cu",
    ),
    "Relu": Contract(
        op_type="Relu",
        entry="relu",
        parameters=("const float* x", "float* y", "int batch"),
        defines=_elementwise_defines,
        outputs_per_image=lambda d: d["N_PER_IMAGE"],
        weights=False,
        starter="relu.cu",
    ),
}


def contract_for(op_type: str) -> Contract:
    """The contract of `op_type`; a PluginError listing those there are otherwise."""
    try:
        return CONTRACTS[op_type]
    except KeyError:
        raise PluginError(f"no user-kernel contract for op type {op_type!r}; there is one for {', '.join(CONTRACTS)}") from None
