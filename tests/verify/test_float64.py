"""A whole model evaluated in float64 (verify/float64.evaluate_model): what bench --e2e --precision
measures a reduced precision against."""
from __future__ import annotations

import numpy as np
from onnx_builders import tiny_cnn

from opplugin.ort.sessions import Reference
from opplugin.verify import float64


def test_a_whole_model_in_float64_agrees_with_onnxruntimes_float32_to_float32s_rounding():
    model = tiny_cnn()
    x = np.random.default_rng(1).standard_normal((3, 3, 12, 12)).astype(np.float32)
    exact = float64.evaluate_model(model, {"x": x})
    ours = Reference(model)({"x": x})
    (name,) = [output.name for output in model.graph.output]
    assert list(exact) == [name] and exact[name].dtype == np.float64 and exact[name].shape == ours[name].shape
    assert np.linalg.norm(exact[name] - ours[name]) <= 1e-6 * np.linalg.norm(exact[name])
    assert model.graph.initializer[0].data_type == 1  # the model itself stays float32
