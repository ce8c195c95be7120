"""PyTorch in a run's precision, for every PyTorch peer (bench --e2e's modules, the Conv suites' cuDNN):
torch's switches for FP32 and TF32, and the conversion of a module, a tensor or a Conv's weights to
FP16 or BF16 in channels_last, the layout cuDNN's tensor-core kernels read fastest. Nothing here
imports torch: each function takes the module its caller imported, so a stand-in serves the CPU tests.
"""
from __future__ import annotations

import copy
from typing import Any

# the precisions in which the module and its input are converted, to these torch dtypes (by name)
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(torch: Any, precision: str) -> Any:
    return getattr(torch, TORCH_DTYPES[precision])


def converted_module(torch: Any, module: Any, precision: str) -> Any:
    """A copy of `module` in the dtype of `precision` and in channels_last (the FP32 module stays as it is,
    for the FP32 rows and any other precision)."""
    return copy.deepcopy(module).to(torch_dtype(torch, precision)).to(memory_format=torch.channels_last)


def converted_input(torch: Any, x: Any, precision: str) -> Any:
    """`x` in the dtype of `precision`; a 4-D (image) tensor in channels_last too, as the module's weights are.
    An input of integers (token ids) stays as it is."""
    if not x.is_floating_point():
        return x
    dtype = torch_dtype(torch, precision)
    return x.to(dtype=dtype, memory_format=torch.channels_last) if x.ndim == 4 else x.to(dtype=dtype)


def fp32_settings(torch: Any) -> None:
    """cuDNN picks its fastest algorithm once per shape; neither cuDNN nor cuBLAS may use TF32."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def precision_settings(torch: Any, precision: str) -> None:
    """fp32_settings, with TF32 allowed for cuDNN and cuBLAS under tf32 alone (under fp16 and bf16 what
    is left in FP32 stays exact, as opplugin's FP32 steps do)."""
    fp32_settings(torch)
    if precision == "tf32":
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
