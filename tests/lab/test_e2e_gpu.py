"""On the GPU: a run copies nothing but what depends on its input (constants stay on the
device; with onnxruntime's CUDA provider, nothing crosses to the host between steps), and
`bench --e2e` measures a small model beside its peers, in FP32 and in FP16."""
from __future__ import annotations

import importlib.util
import json

import pytest
from onnx_builders import save
from resnet_block import resnet_block

from opplugin.ort import sessions
from opplugin.inputs.feeds import make_inputs
from opplugin.cli import commands as cli
from opplugin.lab import e2e, e2e_onnxruntime
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

    from opplugin.lab import e2e_torch

    module, x, expected = _small_cnn(torch)
    e2e_torch.fp32_settings(torch)
    loaded = e2e_torch.TorchPeer(torch, module.float().cuda(), "a test module")
    for measured in (e2e_torch.time_eager(loaded, x, 1, 3), e2e_torch.time_graph(loaded, x, 1, 3, compiled=False)):
        assert measured["host_to_host_ms"] > 0 and measured["device_ms"] > 0
        assert e2e.agreement(measured["output"], expected)["rel_l2"] <= e2e.FP32_TOLERANCE
        assert "a test module" in measured["implementation"]


def test_bench_e2e_in_fp16_holds_every_row_to_the_fp16_bound_against_float64(tmp_path, capsys):
    path = save(resnet_block(), tmp_path / "block.onnx")
    out = tmp_path / "e2e.json"
    status = cli.main(["bench", "--e2e", str(path), "--batches", "4", "--precision", "fp16", "--warmup", "1", "--repeat", "3",
                       "--json", str(out)])
    payload = json.loads(out.read_text())
    bound = e2e.reduced_precision_bound("fp16")
    assert (payload["precision"], payload["reference"], payload["tolerance"]) == ("fp16", "float64", bound)
    by_peer = {row["peer"]: row for row in payload["rows"]}
    for mode in e2e.OPPLUGIN:
        ours = by_peer[mode]
        assert ours["status"] == "ok" and 0 < ours["rel_l2"] <= bound, ours
        assert "plugin steps in fp16" in ours["implementation"]  # the Gemm head at least (plan/precision.py)
    if not sessions.has_cuda():
        expected = "unavailable"
    elif importlib.util.find_spec("onnxconverter_common") is None:
        expected = "unavailable"
        assert by_peer["onnxruntime_cuda"]["reason"] == e2e_onnxruntime.FP16_CONVERTER_MISSING
    else:
        expected = "ok"
        assert "FP16 model by onnxconverter-common" in by_peer["onnxruntime_cuda"]["implementation"]
    assert by_peer["onnxruntime_cuda"]["status"] == by_peer["onnxruntime_cuda_graph"]["status"] == expected
    torch_rows = [by_peer[p] for p in ("pytorch_eager", "pytorch_graph", "torch_compile_graph")]
    assert all(row["status"] in ("ok", "unavailable") for row in torch_rows), torch_rows
    assert all("FP16 channels_last" in row["implementation"] for row in torch_rows if row["status"] == "ok")
    assert status == 0 and not e2e.failed(payload)
    assert "End to end in FP16 on" in " ".join(capsys.readouterr().out.split())


def test_the_pytorch_peers_in_fp16_stay_within_the_fp16_bound_of_float64():
    torch = pytest.importorskip("torch")
    import numpy as np

    from opplugin.lab import e2e_torch

    module, x, expected = _small_cnn(torch)
    fp32 = module.float().cuda()
    peer = e2e_torch.TorchPeer(torch, e2e_torch.converted_module(torch, fp32, "fp16"), "a test module", "fp16")
    assert next(fp32.parameters()).dtype == torch.float32  # the FP32 module is left as it was
    for measured in (e2e_torch.time_eager(peer, x, 1, 3), e2e_torch.time_graph(peer, x, 1, 3, compiled=False)):
        assert measured["output"].dtype == np.float32 and measured["output"].shape == expected.shape
        assert e2e.agreement(measured["output"], expected)["rel_l2"] <= e2e.reduced_precision_bound("fp16")
        assert "FP16 channels_last" in measured["implementation"]


def _small_cnn(torch):
    """(a small Conv > BN > ReLU > pool > Linear module in eval mode, a float32 input, its answer in float64)."""
    import numpy as np

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                 torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        expected = module.double()(torch.from_numpy(x).double()).numpy()
    return module, x, expected
