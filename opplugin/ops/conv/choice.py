"""Which CUDA variant a Conv node gets when the user names none.

1. The tuning cache. `opplugin tune MODEL` times every FP32-exact configuration
   of each Conv on this GPU and records the fastest that passed its check (see
   `opplugin.tuning_cache`: one JSON file keyed by GPU name, node shape and fused
   epilogue, batch bucket and opplugin version). When the cache has an entry for
   this node (its own batch bucket, else the nearest tuned one within a factor
   of 16) and that variant can still run the node, it is the choice.

2. Otherwise a heuristic, which times nothing. It prefers the families in the
   order the seeds' optimisations build on each other, most refined first, and
   takes the first one that can run the node with its fused epilogue, if any:
   register tiles of rows x columns x maps (`const_tile`), then of rows x
   maps (`const_rb`), then several maps per thread (`const_mo`),
   then one output per thread from constant memory (`const`), then `baseline`,
   which runs every 2-D Conv (also with weights computed at run time). A family
   name stands for the configuration its `configs()` lists first: the one its
   author expects to be fastest without spilling. When no family fuses the
   epilogue, the same order picks a plain kernel and the epilogue follows as
   CuPy array operations.
"""
from __future__ import annotations

from ...device import Device
from ...errors import PluginError
from ...tuning_cache import key_for, lookup
from . import families
from .epilogue import Epilogue
from .spec import ConvSpec

PREFERENCE = ("const_tile", "const_rb", "const_mo", "const", "baseline")


def heuristic_variant(spec: ConvSpec, weights, epilogue: Epilogue) -> str:
    for name in PREFERENCE:
        if families.unsupported_reason(spec, name, weights, epilogue) is None:
            return families.resolve(spec, name, epilogue)
    for name in PREFERENCE:  # none fuses: the plain kernel runs, the epilogue follows in CuPy
        if families.unsupported_reason(spec, name, weights) is None:
            return families.resolve(spec, name)
    raise PluginError(f"no CUDA variant can run this Conv ({spec})")


def cached_variant(spec: ConvSpec, weights, epilogue: Epilogue, device: Device) -> str | None:
    """The tuned choice for this node on this GPU, if the cache has one that still runs it."""
    choice = lookup(key_for(spec, epilogue, device.name))
    if choice is None or families.unsupported_reason(spec, choice.variant, weights, epilogue) is not None:
        return None
    return choice.variant


def choose_variant(spec: ConvSpec, weights, epilogue: Epilogue, device: Device) -> str:
    """The configured variant name for this node on this device: tuned, else the heuristic's."""
    return cached_variant(spec, weights, epilogue, device) or heuristic_variant(spec, weights, epilogue)
