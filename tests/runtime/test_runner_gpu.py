"""One runner, a thousand runs of varying batch sizes: device and pinned memory stay
flat after warm-up, and equal inputs give identical outputs every time.

Set OPPLUGIN_FIGURES to a file name to get the memory figures as JSON."""
import gc
import json
import os

import numpy as np
import pytest

from opplugin.inputs.feeds import make_inputs
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu

RUNS = 1000


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("name, chunk", [("lenet86", 16), ("tiny", None)])
def test_a_thousand_runs_keep_memory_flat_and_results_identical(name, chunk, tiny_model_path):
    model = load_model(tiny_model_path if name == "tiny" else name)
    # lenet86 in chunks of 16 on 3 streams: 1 to 4 chunks a run, inputs above 1 MiB staged through pinned buffers
    runner = Runner(model, 64, "cuda", chunk=chunk)
    input_name = model.inputs[0].name
    batches = [int(b) for b in np.random.default_rng(7).integers(1, 65, RUNS)]
    inputs = {b: make_inputs(model, b, "random", seed=b).feeds for b in sorted(set(batches))}

    expected = {}
    for _ in range(2):  # warm-up: every batch size twice, so every buffer has been needed once
        for b, feeds in inputs.items():
            expected[b] = runner.run(feeds).outputs
    gc.collect()
    before, resident_before = runner.memory(), _resident_bytes()

    for b in batches:
        outputs = runner.run(inputs[b]).outputs
        for key, value in outputs.items():
            assert np.array_equal(value, expected[b][key]), f"batch {b}: {key} differs from the first run"
    gc.collect()
    after, resident_after = runner.memory(), _resident_bytes()

    figures = {"model": name, "runs": RUNS, "before": before, "after": after,
               "host_resident_growth_bytes": resident_after - resident_before,
               "batches": sorted(set(batches))[:1] + sorted(set(batches))[-1:], "input": input_name}
    if os.environ.get("OPPLUGIN_FIGURES"):
        with open(os.environ["OPPLUGIN_FIGURES"] + f".{name}.json", "w") as out:
            json.dump(figures, out, indent=2)
    assert after == before, figures
    assert resident_after - resident_before < 64 * 2**20, figures
