"""Calling a user's function (a reference, a shape function, a kernel) the way a declaration
promises: attributes by name, floating inputs in float64 for a reference, and any exception it
raises as one line that names the node and the op."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import PluginError


class DeclarationError(PluginError):
    """A declaration that cannot serve a node: inputs that do not match, a shape function or
    reference that raises, a kernel that does not load."""


def accepted(function: Callable[..., Any], attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes `function` takes by name (all of them where it takes **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or a CuPy kernel: no signature to read
        return dict(attributes)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(attributes)
    return {k: v for k, v in attributes.items() if k in parameters}


def float64(value: Any) -> Any:
    """A floating array as float64 (what a reference computes in); others as they are."""
    if value is None:
        return None
    array = np.asarray(value)
    return array.astype(np.float64) if np.issubdtype(array.dtype, np.floating) else array


def run_reference(function: Callable[..., Any], op: str, node: str, inputs: Sequence[Any], attributes: Mapping[str, Any],
                  outputs: int) -> list[np.ndarray]:
    """`function`'s outputs for `inputs` (cast to float64) and `attributes`, as a list of arrays:
    a DeclarationError naming the node when it raises or returns the wrong number of outputs."""
    arguments = [float64(value) for value in inputs]
    try:
        with np.errstate(all="ignore"):  # overflow in a saturating function (exp of -800) is its right answer
            result = function(*arguments, **accepted(function, attributes))
    except Exception as err:
        raise DeclarationError(f"{node}: the reference of {op} raised {type(err).__name__}: {err}") from None
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(results) != outputs:
        raise DeclarationError(f"{node}: the reference of {op} returned {len(results)} outputs, it declares {outputs}")
    return [np.asarray(r) for r in results]
