"""Where opplugin's files live: the shipped CUDA sources and models, and the user's cache directory.

In a wheel the kernels and models are installed inside the package (opplugin/kernels,
opplugin/models); in a plain checkout on PYTHONPATH they sit beside the package at the
repository top. The cache directory (the tuning cache, the compiled kernels) is
``$OPPLUGIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/opplugin``, else ``~/.cache/opplugin``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # opplugin/
CACHE_DIR_ENV = "OPPLUGIN_CACHE_DIR"


def _find(name: str) -> Path:
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"opplugin's {name}/ folder is missing (looked in {_PACKAGE} and {_PACKAGE.parent})")


def kernels_dir() -> Path:
    return _find("kernels")


def models_dir() -> Path:
    return _find("models")


_INCLUDE = re.compile(r'^#include "([\w.]+\.cuh)"$', re.MULTILINE)


def kernel_source(filename: str) -> str:
    """kernels/<filename> with its `#include "x.cuh"` lines replaced by those files:
    NVRTC gets one self-contained source, whichever way the package is installed."""
    text = (kernels_dir() / filename).read_text()
    return _INCLUDE.sub(lambda match: kernel_source(match.group(1)), text)


def cache_dir() -> Path:
    """The user's cache directory for opplugin (it may not exist yet)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opplugin"
