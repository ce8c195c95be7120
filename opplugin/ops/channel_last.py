"""A tensor kept channel-last in a 16-bit format between two steps (plan/channel_last.py), as every op's kernels
see it: uint16 [N][H][W][C] holding the format's bits, where the model has FP32 [N][C][H][W]. What a kernel of
any op needs of it: the shape, the check of what it is handed, the numbering of the formats in the CUDA sources
(half_bits.cuh's FORMAT), the bits of a configuration's links (its name's `_h` field) that every op shares, and
the configuration of a plain kernel's linked sibling (a pool's, a normalisation's: "cuda_fp16_h3").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .config_grammar import Config, parse, tagged

INPUT, OUTPUT = 1, 2  # a configuration's links: X comes, Y goes channel-last in the format (a Conv adds its residual, 4)
FORMAT_CODES = {"fp16": 1, "bf16": 2}  # half_bits.cuh's FORMAT, gemm_wgmma's HALF_OPERANDS


def channel_last_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """(N, H, W, C) of an NCHW shape."""
    n, c, *spatial = shape
    return (n, *spatial, c)


def checked_linked(cupy: Any, array: Any, nchw: tuple[int, ...], what: str, kernel: str) -> Any:
    """`array` as a contiguous channel-last tensor of the format's bits (uint16) whose NCHW shape is `nchw`;
    a PluginError naming what came instead (an FP32 tensor where the plan linked this one: a plan out of step)."""
    from ..errors import PluginError

    expected = channel_last_shape(nchw)
    if not isinstance(array, cupy.ndarray) or array.dtype != cupy.uint16 or tuple(array.shape) != expected:
        got = f"{type(array).__name__} {getattr(array, 'dtype', '')} {tuple(getattr(array, 'shape', ()))}"
        raise PluginError(f"{kernel}: {what} is linked channel-last in 16 bits: expected a uint16 array of shape {expected}, got {got}")
    return cupy.ascontiguousarray(array)


PLAIN = "cuda"  # a plain kernel's variant, on FP32 tensors in the model's layout, whose linked sibling LinkedPlain configures
LINKED_FAMILIES = {f"{PLAIN}_{fmt}": fmt for fmt in FORMAT_CODES}  # a linked sibling's family -> the format of its tensors


@dataclass(frozen=True)
class LinkedPlain(Config):
    """The linked sibling of an op's plain kernel (a pool's, a normalisation's): one exact in any 16-bit format,
    whose family names the format ("cuda_fp16") and `links` which tensors (INPUT, OUTPUT) it keeps channel-last."""

    links: int = tagged("h")

    @property
    def format(self) -> str:
        return LINKED_FAMILIES[self.family]


def linked_plain(config_type: type[LinkedPlain], fmt: str, inputs: frozenset[int], output: bool, op: str,
                 reason: Callable[[int], str | None] = lambda links: None) -> LinkedPlain:
    """The `config_type` that keeps X (where `inputs` holds 0) and Y (where `output`) channel-last in `fmt`; a
    PluginError for another format or input, or for links the op cannot keep (`reason` of them says why)."""
    from ..errors import PluginError

    family = f"{PLAIN}_{fmt}"
    if family not in LINKED_FAMILIES or not inputs <= {0}:
        raise PluginError(f"a {op} keeps its X alone channel-last in {' or '.join(FORMAT_CODES)}, not inputs {sorted(inputs)} in {fmt}")
    config = config_type(family, (INPUT if inputs else 0) | (OUTPUT if output else 0))
    why = reason(config.links)
    if why:
        raise PluginError(f"{config.name()}: {why}")
    return config


def named_linked_plain(config_type: type[LinkedPlain], variant: str | None, on_gpu: bool, op: str,
                       reason: Callable[[int], str | None] = lambda links: None) -> LinkedPlain | None:
    """The `config_type` a linked sibling's `variant` names; None for any name of no linked family (the plain
    kernel's are its plugin's to judge); a PluginError for a name without links, no GPU, or links the op cannot
    keep (`reason` of them says why)."""
    from ..errors import PluginError

    if variant is None or not variant.startswith(tuple(LINKED_FAMILIES)):
        return None
    _, config = parse(variant, dict.fromkeys(LINKED_FAMILIES, config_type), op)
    if config is None:
        raise PluginError(f"{variant!r} names no links: {config_type.form(variant)} ({config_type.meanings()})")
    if not on_gpu:
        raise PluginError(f"variant {variant!r} needs a CUDA device; the CPU device runs the numpy reference")
    why = reason(config.links)
    if why:
        raise PluginError(f"variant {variant!r}: {why}")
    return config


def plain_offer(offer: Any, variant: str | None, config: LinkedPlain | None) -> Any:
    """What the step of a plain kernel that joins the links in any format keeps channel-last (registry.ChannelLast):
    its op's `offer` (None: nothing) in any format with the plain kernel (`variant` None or PLAIN), in the format of
    a linked variant's `config` (whose links the plan makes again); None for a variant of another kind."""
    if offer is None or (variant not in (None, PLAIN) and config is None):
        return None
    return offer if config is None else replace(offer, format=config.format)


def check_offered(offer: Any, output: bool, fmt: str, step: str, variant: str | None) -> None:
    """A PluginError unless `offer` (plain_offer's) keeps its tensors, the output too where `output`, in `fmt`."""
    from ..errors import PluginError

    if offer is None or (output and not offer.output) or offer.format not in (None, fmt):
        raise PluginError(f"{step}: {variant or PLAIN} keeps no such tensor channel-last in {fmt}")


def linked_call_arrays(cupy: Any, x: Any, out: Any, links: int, sample: tuple[int, ...], output_shape: Callable[[int], tuple[int, ...]],
                       kernel: str) -> tuple[Any, Any, int]:
    """(X, Y, batch) for one call of a kernel with these `links` (INPUT, OUTPUT), on its stream: X checked (the
    format's bits channel-last where linked, else float32 NCHW of the per-image shape `sample`), contiguous and
    16-byte aligned for 16-byte loads; Y `out` checked (`output_shape(batch)` NCHW; written in full) or a new
    array, the format's bits channel-last where linked, else float32 NCHW. A PluginError for what does not fit."""
    from ..errors import PluginError
    from .operands import batched_input, contiguous_out

    if links & INPUT:
        x = checked_linked(cupy, x, (x.shape[0] if getattr(x, "ndim", 0) == len(sample) + 1 else -1, *sample), "input X", kernel)
    else:
        x = batched_input(cupy, x, sample, "X", kernel)
    batch = int(x.shape[0])
    shape = output_shape(batch)
    if out is not None and links & OUTPUT:
        checked_linked(cupy, out, shape, "output", kernel)
        if not out.flags.c_contiguous or out.data.ptr % 16:
            raise PluginError(f"{kernel}: out must be C-contiguous and 16-byte aligned (its 16-byte stores)")
    elif not links & OUTPUT:
        contiguous_out(cupy, out, shape, kernel)
    x = cupy.ascontiguousarray(x)
    if links & INPUT and x.data.ptr % 16:  # a fresh allocation is aligned
        x = x.copy()
    if out is not None:
        return x, out, batch
    if links & OUTPUT:
        return x, cupy.empty(channel_last_shape(shape), dtype=cupy.uint16), batch
    return x, cupy.empty(shape, dtype=cupy.float32), batch
