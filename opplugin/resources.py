"""Where the shipped CUDA sources and models live.

In a wheel they are installed inside the package (opplugin/kernels, opplugin/models);
in a plain checkout on PYTHONPATH they sit beside the package at the repository top.
"""
from __future__ import annotations

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


def kernel_source(filename: str) -> str:
    return (kernels_dir() / filename).read_text()
