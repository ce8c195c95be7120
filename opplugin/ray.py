"""Batch inference on a Ray cluster: `Predictor`, a callable class for Ray Data's
`Dataset.map_batches`, so that Ray spreads the data set over actors (one per GPU, or
CPU workers) and opplugin runs each actor's share.

    ds.map_batches(Predictor, fn_constructor_kwargs={"model": "lenet86"},
                   num_gpus=1, concurrency=4, batch_format="numpy")

Each actor builds one Runner when Ray starts it and reuses it for every batch. The
Runner picks its device as it always does ("auto": the GPU when CuPy sees one, and Ray
shows an actor only the GPU it was given), so the same code runs the CUDA kernels on a
GPU actor and the numpy reference on a CPU one. A batch arrives as a dict of columns;
the model's inputs are read from the columns named after them (a model of one input also
takes a lone column of any other name, as Ray's `data`: inputs/columns.py), and the batch
that comes back holds the graph's outputs by name (and any `pass_through` columns, untouched).

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
from .inputs.columns import BatchColumns
from .inputs.user_data import fix_input_shapes, require_runnable_inputs

# What a Predictor hands on to its Runner; see Runner's docstring for each.
RUNNER_OPTIONS = ("device", "variants", "registry", "chunk", "streams", "kernels", "cuda_graphs", "precision", "keep_fp32")


class Predictor:
    """Runs `model` (a shipped model's name, an ONNX file, or a loaded Model) on each
    batch Ray Data hands it, a dict of numpy columns, and returns the outputs as a
    dict of numpy arrays, one per graph output name, row for row.

    `batch` is the largest batch you expect (the runner sizes its chunks from it; give
    map_batches' batch_size); `input_shapes` fixes free input sizes as --input-shape does
    ({"input": [None, 3, 224, 224]}, None for a free axis); `pass_through` names columns
    copied unchanged into each output batch (an id or a file path, say). Every other
    keyword goes to the Runner: device, variants, registry, chunk, streams, kernels,
    cuda_graphs, precision ("fp32" by default; "tf32", "fp16", "bf16"; "mixed" with keep_fp32: see
    plan/precision.py).
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
        layout = self.runner.layout
        self.columns = BatchColumns(self.model.name, {name: tuple(self.runner.plan.shape_of(name)) for name in self.inputs},
                                    frozenset(layout.batched_inputs) & frozenset(self.inputs) if layout.chunkable else frozenset(),
                                    self.pass_through)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = self.columns.feeds(batch)
        rows = self._rows(feeds)
        carried = self.columns.carried(batch, rows)
        if rows == 0:  # Ray may hand on an empty batch (after a filter, say): the outputs are empty too
            outputs = {name: self._empty(name) for name in self.outputs}
        else:
            outputs = self.runner.run(feeds).outputs
        return {name: outputs[name] for name in self.outputs} | carried

    def _rows(self, feeds: dict[str, np.ndarray]) -> int:
        """The batch's rows; the runner's own check for what a column cannot show (an unchunkable model's batch)."""
        rows = {len(feeds[name]) for name in self.columns.batched}
        if len(rows) > 1:
            raise InputError(f"the input columns have different numbers of rows {sorted(rows)}")
        if rows == {0}:
            return 0
        return self.runner.check_feeds(feeds)

    def _empty(self, name: str) -> np.ndarray:
        info = self.runner.plan.tensors[name]
        return np.empty((0, *info.shape[1:]), info.dtype)
