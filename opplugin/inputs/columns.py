"""A batch of named columns read as a model's inputs: what Ray Data's `map_batches` hands a
callable with batch_format="numpy", a dict of numpy arrays. Every check ends in one
InputError line naming the column.

A column named after an input feeds it. A model of one input also takes the batch's one
column besides those passed through, whatever its name: Ray's own readers call it `data`
(`read_numpy`, `from_numpy`), and a lone tensor column can mean nothing else. With several
candidates and none named after the input, the error lists them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError

RENAME_HINT = "Dataset.rename_columns renames one"


@dataclass(frozen=True)
class BatchColumns:
    """What a batch must hold for one model."""

    model: str                             # the model's name, for the messages
    shapes: dict[str, tuple[int, ...]]     # each input's shape in the plan, the batch first
    batched: frozenset[str]                # the inputs split by rows (their first axis the batch)
    pass_through: tuple[str, ...] = ()     # columns copied unchanged into each output batch

    def feeds(self, batch: Any) -> dict[str, np.ndarray]:
        """The model's inputs from the batch's columns, checked: float32, and a sample's shape the model's."""
        return {name: self._input(name, column, batch[column]) for name, column in self.sources(batch).items()}

    def carried(self, batch: Any, rows: int) -> dict[str, np.ndarray]:
        """The pass-through columns, each of the inputs' `rows`."""
        carried = {}
        for name in self.pass_through:
            column = self._column(batch, name, "a pass_through column")
            if len(column) != rows:
                raise InputError(f"column {name!r} has {len(column)} rows; the batch's inputs have {rows}")
            carried[name] = column
        return carried

    def sources(self, batch: Any) -> dict[str, str]:
        """The column that feeds each input."""
        inputs = list(self.shapes)
        _require_dict(batch)
        if len(inputs) == 1 and inputs[0] not in batch:
            others = [column for column in batch if column not in self.pass_through]
            if len(others) == 1:
                return {inputs[0]: others[0]}
            if others:
                raise InputError(f"the batch has no column {inputs[0]!r} ({self.model}'s one input), and more than one "
                                 f"other column could take its place: {', '.join(map(repr, others))} ({RENAME_HINT})")
        for name in inputs:
            self._column(batch, name, "an input")
        return {name: name for name in inputs}

    def _column(self, batch: Any, name: str, what: str) -> np.ndarray:
        _require_dict(batch)
        if name not in batch:
            raise InputError(f"the batch has no column {name!r} ({what} of {self.model}); its columns are "
                             f"{', '.join(map(repr, batch)) or 'none'} ({RENAME_HINT})")
        return batch[name]

    def _input(self, name: str, column: str, values: Any) -> np.ndarray:
        called = f"column {column!r}" + (f" (input {name!r})" if column != name else "")
        if not isinstance(values, np.ndarray):
            raise InputError(f"{called} is a {type(values).__name__}, not a numpy array: call map_batches "
                             "with batch_format=\"numpy\"")
        if values.dtype == object:
            raise InputError(f"{called} holds arrays of different shapes (numpy dtype object); "
                             f"{self.model} takes one shape, {self.wanted(name)}")
        if values.dtype != np.float32:
            raise InputError(f"{called} is {values.dtype}; {self.model} takes float32 "
                             "(convert it with .astype(numpy.float32) in a map_batches step before)")
        if name in self.batched and tuple(values.shape[1:]) != tuple(self.shapes[name][1:]):
            raise InputError(f"{called} has shape {list(values.shape)}; {self.model} takes {self.wanted(name)}")
        return values

    def wanted(self, name: str) -> str:
        """An input's shape as a message shows it: [N, 1, 86, 86] where the batch is free."""
        shape = self.shapes[name]
        return f"[N, {', '.join(map(str, shape[1:]))}]" if name in self.batched else str(list(shape))


def _require_dict(batch: Any) -> None:
    if not isinstance(batch, dict):
        raise InputError(f"Predictor takes batches as a dict of numpy arrays, got {type(batch).__name__}: "
                         "call map_batches with batch_format=\"numpy\"")
