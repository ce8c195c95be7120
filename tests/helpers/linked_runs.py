"""A Runner in fp16 or bf16 of a model whose steps keep tensors channel-last in the format, and the rule its
outputs are held to against onnxruntime's (GPU tests of the linked pools and normalisations)."""
from __future__ import annotations

import numpy as np


def runner_and_session(model, precision: str, batch: int = 16):
    """A Runner of `model` (a loaded Model) in `precision` on the GPU, and onnxruntime's CPU session of it."""
    import onnxruntime

    from opplugin.runtime import Runner

    return Runner(model, batch, "cuda", precision=precision), onnxruntime.InferenceSession(model.proto.SerializeToString(),
                                                                                           providers=["CPUExecutionProvider"])


def assert_within_the_formats_rule(got: np.ndarray, expected: np.ndarray, precision: str, rounded: bool = True) -> None:
    """`got` within a run in `precision`'s rule of onnxruntime's `expected`; `rounded`: and not FP32's result."""
    from opplugin.verify.check import default_tolerance

    atol, rtol = default_tolerance(precision)
    scale = max(1.0, float(np.sqrt(np.mean(expected.astype(np.float64) ** 2))))
    assert np.all(np.abs(got - expected) <= atol * scale + rtol * np.abs(expected))
    if rounded:
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) > 1e-6, "the run moved by no rounding at all: was it in FP32?"
