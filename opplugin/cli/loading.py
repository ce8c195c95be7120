"""The model a command works on: loaded with its free sizes fixed (by --input-shape and the
user's own data), on its device, at the batch the command runs."""
from __future__ import annotations

import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from ..custom.functions import function_ids, with_function_references
from ..errors import InputError
from ..gpu.device import select_device
from ..graph.model import BUNDLED_MODELS, choose_batch, load_model
from ..inputs.feeds import pinned_copy
from ..inputs.user_data import fix_input_shapes, load_feeds, load_images, require_runnable_inputs
from .options import DataOptions, ModelOptions


@dataclass(frozen=True)
class Loaded:
    """A command's model, its device, the batch it runs (see model.choose_batch), and the
    user's own feeds (--load-inputs, --images) when given."""

    model: Any
    device: Any
    batch: int
    feeds: dict[str, Any] | None = None
    source: str | None = None


def load(model: ModelOptions, device: str, *, cuda_graphs: bool | None = None, streams: int | None = None,
         data: DataOptions | None = None, free_batch_default: int | None = None) -> Loaded:
    """The model (with --input-shape and the user's data fixing its free sizes), its device
    and the batch the command runs; a stderr line says where that batch came from when the
    user gave none and the model is not a shipped one. `cuda_graphs` and `streams` are the
    runner's flags: True (--cuda-graphs typed) and more than one stream need a GPU."""
    loaded = load_declared(model.model, model.ops, data.keep if data is not None else ())
    fix_input_shapes(loaded, model.input_shapes)
    feeds, source = _user_feeds(data, loaded) if data is not None else (None, None)
    require_runnable_inputs(loaded)
    chosen = select_device(device)
    if cuda_graphs is True and not chosen.is_cuda:  # nothing to capture
        raise InputError("--cuda-graphs needs a CUDA device; here plugin steps run the numpy reference on the CPU")
    if streams is not None and streams > 1 and not chosen.is_cuda:  # lanes of numpy only contend for the same cores
        raise InputError(f"--streams {streams} needs a CUDA device; here plugin steps run the numpy reference on the CPU, "
                         "one chunk at a time")
    if feeds is not None:
        batch = _batch_of(model.batch, loaded, feeds)
        return Loaded(loaded, chosen, batch, _pinned(feeds, chosen), source)
    batch = choose_batch(loaded, model.batch, chosen, default=free_batch_default)
    if model.batch is None and loaded.fixed_batch is not None:
        print(f"Batch {batch}: {loaded.name}'s fixed batch", file=sys.stderr)
    elif model.batch is None and loaded.name not in BUNDLED_MODELS:
        print(f"Batch {batch}: the default for a model with a free batch (--batch N to choose)", file=sys.stderr)
    return Loaded(loaded, chosen, batch)


def load_declared(model: str, ops_files: tuple[str, ...], keep: tuple[str, ...] = ()):
    """The model with the custom ops of the --ops files declared (the functions they name kept whole), and
    the --keep tensors left for its runs to compute (load_model's `keep`)."""
    ops = read_ops(ops_files)
    loaded = load_model(model, keep_functions=function_ids(ops), keep=keep)
    loaded.declare(with_function_references(ops, loaded.original))
    return loaded


def read_ops(paths: tuple[str, ...]) -> list:
    """The custom ops of the --ops files (DeclarationError: a file that does not load, two for one op)."""
    if not paths:
        return []
    from ..custom.loading import distinct, load_ops

    files = dict.fromkeys(Path(p).resolve() if Path(p).is_file() else Path(p) for p in paths)  # a file named twice loads once
    return distinct([op for path in files for op in load_ops(path)], "--ops")


def _user_feeds(data: DataOptions, model) -> tuple[dict[str, Any] | None, str | None]:
    """The feeds of --load-inputs or --images, and where they came from (None, None without them)."""
    if data.load_inputs:
        return load_feeds(data.load_inputs, model), f"--load-inputs {data.load_inputs}"
    if data.images:
        feeds = load_images(data.image_options(), model)
        return feeds, f"--images {data.images}, {next(iter(feeds.values())).shape[0]} images"
    return None, None


def _batch_of(asked: int | None, model, feeds: dict[str, Any]) -> int:
    """The batch the user's data holds; --batch, when given, must say the same."""
    batch = int(feeds[model.batch_input.name].shape[0])
    if asked is not None and asked != batch:
        raise InputError(f"--batch {asked}: the inputs given hold a batch of {batch}; leave --batch out or give {batch}")
    return batch


def _pinned(feeds: dict[str, Any], device) -> dict[str, Any]:
    """On a GPU the feeds go to pinned memory, so the run copies them by DMA without staging."""
    if not device.is_cuda:
        return feeds
    return {name: pinned_copy(array) for name, array in feeds.items()}
