"""The unmodified model on onnxruntime's CPU provider, a slice of the batch at a
time, so that a comparison at batch 200,000 needs no more memory than the
outputs themselves."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .model import Model

ROWS_PER_SLICE = 4096


def reference_outputs(model: Model, feeds: dict[str, np.ndarray], batched: frozenset[str] | set[str],
                      rows_per_slice: int = ROWS_PER_SLICE) -> dict[str, np.ndarray]:
    """The graph outputs for `feeds`; inputs named in `batched` are cut along their first axis
    (the others go whole to every slice). With no batched inputs the batch runs in one go."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o for o in model.outputs]
    if not batched:
        return dict(zip(names, session.run(names, feeds)))
    batch = next(feeds[n].shape[0] for n in batched)
    parts: list[list[np.ndarray]] = []
    for start in range(0, batch, rows_per_slice):
        rows = slice(start, min(start + rows_per_slice, batch))
        piece = {n: (v[rows] if n in batched else v) for n, v in feeds.items()}
        parts.append(session.run(names, piece))
    return {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(names)}
