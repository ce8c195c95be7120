"""On the GPU: a run copies nothing but what depends on its input (constants stay on the
device; with onnxruntime's CUDA provider, nothing crosses to the host between steps), and
`bench --e2e` measures a small model beside its peers."""
from __future__ import annotations

import pytest
from onnx_builders import save
from resnet_block import resnet_block

from opplugin import sessions
from opplugin.data import make_inputs
from opplugin.lab import e2e
from opplugin.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


def copied_tensors(result) -> set[str]:
    return {span.name.split(" ", 2)[-1] for span in result.spans if span.kind == "copy"}


def test_a_run_copies_no_constant_and_with_the_cuda_provider_nothing_between_steps(tmp_path):
    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    runner = Runner(model, 8, "cuda")
    feeds = make_inputs(model, 8, "random", pinned=True).feeds
    for _ in range(2):  # the second run is what every later run does
        copied = copied_tensors(runner.run(feeds))
    assert not copied & set(model.initializers), f"constants copied on a run: {copied & set(model.initializers)}"
    graph_tensors = {"x", *model.outputs}
    # every node has a plugin (the residual Add > Relu fused into the Conv): with either onnxruntime build
    # only the graph's input and output cross
    assert not [s for s in runner.plan.steps if s.kind == "onnxruntime"] and copied <= graph_tensors


def test_bench_e2e_measures_opplugin_and_says_why_a_peer_is_missing(tmp_path):
    path = save(resnet_block(), tmp_path / "block.onnx")
    rows = e2e.bench_case(tmp_path / "block.onnx", load_model(path), 4, warmup=1, repeat=3)
    by_peer = {row["peer"]: row for row in rows}
    ours = by_peer["opplugin"]
    assert ours["status"] == "ok" and ours["rel_l2"] <= e2e.FP32_TOLERANCE and ours["top1_agreement"] == 1.0
    # two runners give the two figures (see e2e.time_opplugin), so neither bounds the other
    assert ours["host_to_host_ms"] > 0 and ours["device_ms"] > 0 and ours["device_free_bytes"] > 0
    assert by_peer["onnxruntime_cuda"]["status"] == ("ok" if sessions.has_cuda() else "unavailable")
    # no block.pt beside the file: PyTorch needs onnx2torch, which may or may not be installed
    assert by_peer["pytorch"]["status"] in ("ok", "unavailable")
