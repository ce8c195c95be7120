"""Where the shipped CUDA sources and models live.

In a wheel they are installed inside the package (opplugin/kernels, opplugin/models);
in a plain checkout on PYTHONPATH they sit beside the package at the repository top.
"""
from __future__ import annotations

import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


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
