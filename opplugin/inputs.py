"""Choosing the inputs a command feeds a model: the bundled Fashion-MNIST test set
for image classifiers of its kind, seeded random data of any batch for anything else.

With `pinned=True` the arrays live in page-locked host memory, so a GPU run copies
them to the device by DMA without staging them first (the fast path)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cuda, data
from .errors import InputError
from .model import SHIPPED_MODELS, Model

DATA_CHOICES = ("auto", "fashion-mnist", "random")


@dataclass
class Inputs:
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    source: str
    pinned: bool = False


def _empty(shape: tuple[int, ...], pinned: bool) -> np.ndarray:
    return cuda.pinned_empty(shape, np.float32) if pinned else np.empty(shape, np.float32)


def make_inputs(model: Model, batch: int, source: str = "auto", seed: int = 0, pinned: bool = False) -> Inputs:
    if source not in DATA_CHOICES:
        raise InputError(f"unknown data source {source!r}; choose from {', '.join(DATA_CHOICES)}")
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise InputError(f"batch must be a positive integer, got {batch}")
    pinned = bool(pinned) and cuda.is_available()
    if source == "auto":
        source = "fashion-mnist" if model.name in SHIPPED_MODELS else "random"
    if source == "random":
        shapes = model.input_shapes(batch)
        feeds = {
            name: data.random_inputs(shape[0], shape[1:], seed=seed + n, out=_empty(shape, pinned))
            for n, (name, shape) in enumerate(shapes.items())
        }
        return Inputs(feeds, None, f"random uniform [0, 1), seed {seed}", pinned)

    if len(model.inputs) != 1:
        raise InputError(f"{model.name} has {len(model.inputs)} inputs; the Fashion-MNIST data feeds models with one image input")
    if batch > data.TEST_IMAGES:
        raise InputError(f"the bundled test set has {data.TEST_IMAGES} images; for batch {batch} use --data random")
    images, labels = data.load_test_set()
    name = model.inputs[0].name
    shape = model.sample_shape(name)
    if len(shape) != 3:
        raise InputError(f"{model.name}'s input {name!r} is {list(shape)}, not an image (C, H, W); use --data random")
    try:
        images = data.to_model_input(images[:batch], shape)
    except ValueError as err:
        raise InputError(f"{model.name}'s input {name!r} does not take Fashion-MNIST images: {err}; use --data random") from None
    if pinned:
        pageable, images = images, _empty(images.shape, True)
        np.copyto(images, pageable)
    return Inputs({name: images}, labels[:batch].astype(np.int64), f"Fashion-MNIST test set, first {batch} images", pinned)
