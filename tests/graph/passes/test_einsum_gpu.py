"""On the GPU: every Einsum of test_einsum's cases, rewritten as MatMul between Transposes, run by
a Runner (eager and in a CUDA graph) against onnxruntime's Einsum on the original graph, fresh inputs."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import save
from einsum_cases import CASES, einsum_feeds, einsum_model, onnxruntime_einsum

from opplugin.graph.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("equation", list(CASES))
def test_einsum_as_matmul_matches_onnxruntime_on_the_gpu(equation, graphs, tmp_path):
    a_shape, b_shape, b_constant = CASES[equation]
    original = einsum_model(equation, a_shape, b_shape, b_constant)
    runner = Runner(load_model(save(original, tmp_path / "einsum.onnx")), 4, "cuda", cuda_graphs=graphs)
    assert all(s.kind == "plugin" for s in runner.plan.steps), runner.plan.fallbacks
    for seed in (1, 2):  # the second run replays the graph
        feeds = einsum_feeds(original, a_shape, b_shape, 4, seed=seed)
        np.testing.assert_allclose(runner.run(feeds).outputs["y"], onnxruntime_einsum(original, feeds), rtol=1e-5, atol=1e-5)
