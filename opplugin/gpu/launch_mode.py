"""Whether the kernels being built will be launched from CUDA graphs (the default on a GPU)
or one by one from Python: a variant's cost to the host depends on it (ops/conv/cost.py).
The runner says which while it builds its kernels; anything built outside a runner (`plan`)
assumes the default."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

_REPLAYED: ContextVar[bool] = ContextVar("opplugin_launches_replayed", default=True)


def launches_replayed() -> bool:
    """True when the kernels built now will run inside CUDA graphs."""
    return _REPLAYED.get()


@contextlib.contextmanager
def building_for(replayed: bool) -> Iterator[None]:
    """Kernels built inside will be launched from CUDA graphs (`replayed`) or eagerly."""
    token = _REPLAYED.set(bool(replayed))
    try:
        yield
    finally:
        _REPLAYED.reset(token)
