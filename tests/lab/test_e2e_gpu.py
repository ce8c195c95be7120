"""On the GPU: a run copies nothing but what depends on its input (constants stay on the
device; with onnxruntime's CUDA provider, nothing crosses to the host between steps), and
`bench --e2e` measures a small model beside its peers."""
from __future__ import annotations

import pytest
from onnx_builders import save
from resnet_block import resnet_block

from opplugin.ort import sessions
from opplugin.inputs.feeds import make_inputs
from opplugin.lab import e2e
from opplugin.graph.model import load_model
from opplugin.runtime import Runner

pytestmark = pytest.mark.gpu


def copied_tensors(result) -> set[str]:
    return {span.name.split(" ", 2)[-1] for span in result.spans if span.kind == "copy"}


def test_a_run_copies_no_constant_and_with_the_cuda_provider_nothing_between_steps(tmp_path):
    model = load_model(save(resnet_block(), tmp_path / "block.onnx"))
    runner = Runner(model, 8, "cuda")
    feeds = make_inputs(model, 8, "random", pinned=True).feeds
    for _ in range(2):  # the second run is what every later run does
        copied = copied_tensors(runner.run(feeds, step_times=True))
    assert not copied & set(model.initializers), f"constants copied on a run: {copied & set(model.initializers)}"
    graph_tensors = {"x", *model.outputs}
    # every node has a plugin (the residual Add > Relu fused into the Conv): with either onnxruntime build
    # only the graph's input and output cross
    assert not [s for s in runner.plan.steps if s.kind == "onnxruntime"] and copied <= graph_tensors


def test_bench_e2e_measures_opplugin_both_ways_and_says_why_a_peer_is_missing(tmp_path):
    path = save(resnet_block(), tmp_path / "block.onnx")
    rows = e2e.bench_case(tmp_path / "block.onnx", load_model(path), 4, warmup=1, repeat=3)
    assert [row["peer"] for row in rows] == list(e2e.CANDIDATES)
    by_peer = {row["peer"]: row for row in rows}
    for mode in e2e.OPPLUGIN:
        ours = by_peer[mode]
        assert ours["status"] == "ok" and ours["rel_l2"] <= e2e.FP32_TOLERANCE and ours["top1_agreement"] == 1.0
        # two runners give the two figures (see e2e.time_opplugin), so neither bounds the other
        assert ours["host_to_host_ms"] > 0 and ours["device_ms"] > 0 and ours["device_free_bytes"] > 0
    for peer in ("onnxruntime_cuda", "onnxruntime_cuda_graph"):
        assert by_peer[peer]["status"] == ("ok" if sessions.has_cuda() else "unavailable")
    # no block.pt beside the file: PyTorch needs onnx2torch, which may or may not be installed; one reason for all three
    torch_rows = [by_peer[p] for p in ("pytorch_eager", "pytorch_graph", "torch_compile_graph")]
    assert all(row["status"] in ("ok", "unavailable") for row in torch_rows)
    assert len({row["reason"] for row in torch_rows}) == 1
    record = e2e.case_record("block", 4, rows, None)
    assert record["opplugin_graphs_ms"] == by_peer["opplugin_graphs"]["host_to_host_ms"]


def test_the_pytorch_peers_eager_and_in_one_cuda_graph_give_the_modules_answer():
    torch = pytest.importorskip("torch")
    import numpy as np

    from opplugin.lab import e2e_torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                 torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        expected = module.double()(torch.from_numpy(x).double()).numpy()
    e2e_torch.fp32_settings(torch)
    loaded = (torch, module.float().cuda(), "a test module")
    for measured in (e2e_torch.time_eager(loaded, x, 1, 3), e2e_torch.time_graph(loaded, x, 1, 3, compiled=False)):
        assert measured["host_to_host_ms"] > 0 and measured["device_ms"] > 0
        assert e2e.agreement(measured["output"], expected)["rel_l2"] <= e2e.FP32_TOLERANCE
        assert "a test module" in measured["implementation"]
