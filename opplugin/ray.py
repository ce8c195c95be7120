"""Batch inference on a Ray cluster: `Predictor`, a callable class for Ray Data's
`Dataset.map_batches`, so that Ray spreads the data set over actors (one per GPU, or
CPU workers) and opplugin runs each actor's share.

    ds.map_batches(Predictor, fn_constructor_kwargs={"model": "lenet86"},
                   num_gpus=1, concurrency=4, batch_format="numpy")

Each actor builds one Runner when Ray starts it and reuses it for every batch. The
Runner picks its device as it always does ("auto": the GPU when CuPy sees one, and Ray
shows an actor only the GPU it was given), so the same code runs the CUDA kernels on a
GPU actor and the numpy reference on a CPU one. A batch arrives as a dict of columns;
the model's inputs are read from the columns named after them, and the batch that comes
back holds the graph's outputs by name (and any `pass_through` columns, untouched).

Ray comes in the `ray` extra (pip install 'opplugin[ray]'); without it, importing this
module raises RayNotInstalled, whose message says so in one line.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import InputError, OpPluginError


class RayNotInstalled(OpPluginError, ImportError):
    """opplugin.ray was imported where Ray Data is not installed."""


try:
    # The real Ray: an absolute import finds the top-level package, never this module.
    import ray  # noqa: F401
    import ray.data  # noqa: F401
except ImportError:
    raise RayNotInstalled("opplugin.ray needs Ray Data, which is not installed: pip install 'opplugin[ray]'") from None

from .gpu.device import select_device
from .graph.model import Model, choose_batch, load_model
from .runtime import Runner
from .inputs.user_data import fix_input_shapes, require_runnable_inputs

# What a Predictor hands on to its Runner; see Runner's docstring for each.
RUNNER_OPTIONS = ("device", "variants", "registry", "chunk", "streams", "kernels", "cuda_graphs")


class Predictor:
    """Runs `model` (a shipped model's name, an ONNX file, or a loaded Model) on each
    batch Ray Data hands it, a dict of numpy columns, and returns the outputs as a
    dict of numpy arrays, one per graph output name, row for row.

    `batch` is the largest batch you expect (the runner sizes its chunks from it; give
    map_batches' batch_size); `input_shapes` fixes free input sizes as --input-shape does
    ({"input": [None, 3, 224, 224]}, None for a free axis); `pass_through` names columns
    copied unchanged into each output batch (an id or a file path, say). Every other
    keyword goes to the Runner: device, variants, registry, chunk, streams, kernels,
    cuda_graphs.
    """

    def __init__(self, model: str | os.PathLike | Model, *, batch: int | None = None,
                 input_shapes: dict[str, list[int | None]] | None = None, pass_through: tuple[str, ...] | list[str] = (),
                 **runner_options: Any):
        unknown = sorted(set(runner_options) - set(RUNNER_OPTIONS))
        if unknown:
            raise InputError(f"Predictor does not take {', '.join(unknown)}; its runner options are {', '.join(RUNNER_OPTIONS)}")
        self.model = model if isinstance(model, Model) else load_model(model)
        if input_shapes:
            fix_input_shapes(self.model, input_shapes, "input_shapes")
        require_runnable_inputs(self.model)
        device = runner_options.pop("device", "auto")
        device = select_device(device) if device is None or isinstance(device, str) else device
        self.inputs = [value.name for value in self.model.inputs]
        self.outputs = list(self.model.outputs)
        self.pass_through = tuple(pass_through)
        clashes = [name for name in self.pass_through if name in self.outputs or name in self.inputs]
        if clashes:
            raise InputError(f"pass_through names {', '.join(map(repr, clashes))}, which is {self.model.name}'s own input "
                             f"or output; pass through other columns")
        self.runner = Runner(self.model, choose_batch(self.model, batch, device), device, **runner_options)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = self._feeds(batch)
        rows = self._rows(feeds)
        carried = {name: self._column(batch, name, "a pass_through column") for name in self.pass_through}
        for name, column in carried.items():
            if len(column) != rows:
                raise InputError(f"column {name!r} has {len(column)} rows; the batch's inputs have {rows}")
        if rows == 0:  # Ray may hand on an empty batch (after a filter, say): the outputs are empty too
            outputs = {name: self._empty(name) for name in self.outputs}
        else:
            outputs = self.runner.run(feeds).outputs
        return {name: outputs[name] for name in self.outputs} | carried

    # --- reading a batch -------------------------------------------------------------------

    def _column(self, batch: Any, name: str, what: str) -> np.ndarray:
        if not isinstance(batch, dict):
            raise InputError(f"Predictor takes batches as a dict of numpy arrays, got {type(batch).__name__}: "
                             "call map_batches with batch_format=\"numpy\"")
        if name not in batch:
            raise InputError(f"the batch has no column {name!r} ({what} of {self.model.name}); its columns are "
                             f"{', '.join(map(repr, batch)) or 'none'} (Dataset.rename_columns renames one)")
        return batch[name]

    def _feeds(self, batch: Any) -> dict[str, np.ndarray]:
        """The model's inputs from the batch's columns, checked: float32, and a sample's shape the model's."""
        feeds = {}
        for name in self.inputs:
            column = self._column(batch, name, "an input")
            if not isinstance(column, np.ndarray):
                raise InputError(f"column {name!r} is a {type(column).__name__}, not a numpy array: call map_batches "
                                 "with batch_format=\"numpy\"")
            if column.dtype == object:
                raise InputError(f"column {name!r} holds arrays of different shapes (numpy dtype object); "
                                 f"{self.model.name} takes one shape, {self._wanted(name)}")
            if column.dtype != np.float32:
                raise InputError(f"column {name!r} is {column.dtype}; {self.model.name} takes float32 "
                                 "(convert it with .astype(numpy.float32) in a map_batches step before)")
            if self._batched(name) and tuple(column.shape[1:]) != self.runner.plan.shape_of(name)[1:]:
                raise InputError(f"column {name!r} has shape {list(column.shape)}; {self.model.name} takes {self._wanted(name)}")
            feeds[name] = column
        return feeds

    def _rows(self, feeds: dict[str, np.ndarray]) -> int:
        """The batch's rows; the runner's own check for what a column cannot show (an unchunkable model's batch)."""
        rows = {len(feeds[name]) for name in self.inputs if self._batched(name)}
        if len(rows) > 1:
            raise InputError(f"the input columns have different numbers of rows {sorted(rows)}")
        if rows == {0}:
            return 0
        return self.runner.check_feeds(feeds)

    def _batched(self, name: str) -> bool:
        layout = self.runner.layout
        return layout.chunkable and name in layout.batched_inputs

    def _wanted(self, name: str) -> str:
        shape = self.runner.plan.shape_of(name)
        return f"[N, {', '.join(map(str, shape[1:]))}]" if self._batched(name) else str(list(shape))

    def _empty(self, name: str) -> np.ndarray:
        info = self.runner.plan.tensors[name]
        return np.empty((0, *info.shape[1:]), info.dtype)
