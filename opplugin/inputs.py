"""Choosing the inputs a command feeds a model: the bundled Fashion-MNIST test set
for image classifiers of its kind, seeded random data for anything else."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import data
from .errors import InputError
from .model import SHIPPED_MODELS, Model

DATA_CHOICES = ("auto", "fashion-mnist", "random")


@dataclass
class Inputs:
    feeds: dict[str, np.ndarray]
    labels: np.ndarray | None
    source: str


def make_inputs(model: Model, batch: int, source: str = "auto", seed: int = 0) -> Inputs:
    if source not in DATA_CHOICES:
        raise InputError(f"unknown data source {source!r}; choose from {', '.join(DATA_CHOICES)}")
    if not isinstance(batch, int) or batch < 1:
        raise InputError(f"batch must be a positive integer, got {batch}")
    if source == "auto":
        source = "fashion-mnist" if model.name in SHIPPED_MODELS else "random"
    if source == "random":
        shapes = model.input_shapes(batch)
        feeds = {name: data.random_inputs(shape[0], shape[1:], seed=seed + n) for n, (name, shape) in enumerate(shapes.items())}
        return Inputs(feeds, None, f"random uniform [0, 1), seed {seed}")

    if len(model.inputs) != 1:
        raise InputError(f"{model.name} has {len(model.inputs)} inputs; the Fashion-MNIST data feeds models with one image input")
    if batch > data.TEST_IMAGES:
        raise InputError(f"the bundled test set has {data.TEST_IMAGES} images; for batch {batch} use --data random")
    images, labels = data.load_test_set()
    name = model.inputs[0].name
    shape = model.sample_shape(name)
    if len(shape) != 3:
        raise InputError(f"{model.name}'s input {name!r} is {list(shape)}, not an image (C, H, W); use --data random")
    feeds = {name: data.to_model_input(images[:batch], shape)}
    return Inputs(feeds, labels[:batch].astype(np.int64), f"Fashion-MNIST test set, first {batch} images")
