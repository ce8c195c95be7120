"""On the GPU, eager runs reuse each step's output array (runtime/output_reuse.py) without
handing back stale values."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


def test_eager_runs_reuse_each_steps_output_and_give_fresh_results():
    model = load_model("lenet86")
    runner = Runner(model, 8, "cuda", chunk=8, streams=1, cuda_graphs=False)
    lane = runner.scheduler.lanes[0]
    feeds = [make_inputs(model, 8, "random", seed).feeds for seed in (1, 2, 3)]
    fresh = [Runner(model, 8, "cuda", chunk=8, streams=1, cuda_graphs=True).run(f).outputs for f in feeds]
    for turn in range(2):
        for f, expected in zip(feeds, fresh):
            outputs = runner.run(f).outputs
            for name, value in expected.items():
                assert np.array_equal(outputs[name], value), (turn, name)
    assert lane.prebound.nbytes > 0  # the steps' outputs were kept and handed back
    kept = {index: array.data.ptr for index, (_batch, array) in lane.prebound._arrays.items()}
    runner.run(feeds[0])
    assert {index: array.data.ptr for index, (_batch, array) in lane.prebound._arrays.items()} == kept
