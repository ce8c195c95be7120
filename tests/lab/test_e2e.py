"""`opplugin bench --e2e` on the CPU: everything but the timed calls themselves. Its tables,
the fastest peer and opplugin's ratio to it, the model's floor, the one-line reasons of
peers that cannot run, and its refusal without a GPU."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from onnx_builders import save, tiny_cnn

from opplugin.cli import commands as cli
from opplugin.lab import e2e, e2e_onnxruntime, e2e_table, e2e_torch, model_floor
from opplugin.lab.peers import PeerUnavailable
from opplugin.lab.trial import host_ms
from opplugin.graph.model import load_model
from repository import ROOT

ROOFLINE = {"copy_gb_per_s": 3000.0, "fp32_tflop_per_s": 50.0}


def row(model, batch, peer, h2h, resident=None, status="ok", reason=None, rel_l2=1e-6, top1=1.0):
    return {"model": model, "batch": batch, "peer": peer, "status": status, "reason": reason,
            "host_to_host_ms": h2h, "device_ms": resident, "rel_l2": rel_l2 if status == "ok" else None,
            "top1_agreement": top1 if status == "ok" else None}


def floor(ms, bound="compute"):
    return {"flops": 1, "weight_bytes": 2, "input_bytes": 3, "activation_bytes": 4, "floor_ms": ms, "floor_bound": bound}


def resnet18_batch1():
    return [
        row("resnet18", 1, "opplugin_graphs", 0.66, 0.64), row("resnet18", 1, "opplugin_eager", 2.2, 2.3),
        row("resnet18", 1, "pytorch_eager", 1.6, 1.5), row("resnet18", 1, "pytorch_graph", 0.9, 0.8),
        row("resnet18", 1, "torch_compile_graph", 0.8, 0.7),
        row("resnet18", 1, "onnxruntime_cuda", None, status="unavailable", reason="onnxruntime 1.23.2 has no CUDAExecutionProvider"),
        row("resnet18", 1, "onnxruntime_cuda_graph", None, status="unavailable", reason="onnxruntime 1.23.2 has no CUDAExecutionProvider"),
    ]


def test_the_fastest_peer_is_the_quickest_correct_one_that_is_not_opplugin():
    rows = resnet18_batch1()
    assert e2e.fastest_peer(rows) == ("torch_compile_graph", 0.8)
    rows[4] = row("resnet18", 1, "torch_compile_graph", 0.1, status="incorrect", reason="relative L2 error 0.5")
    assert e2e.fastest_peer(rows) == ("pytorch_graph", 0.9)  # a wrong answer is no peer, however fast
    assert e2e.fastest_peer(rows[:2]) == (None, None)


def test_a_case_record_gives_each_opplugin_mode_over_the_fastest_peer_and_the_floor():
    record = e2e.case_record("resnet18", 1, resnet18_batch1(), floor(0.2))
    assert record["fastest_peer"] == "torch_compile_graph" and record["fastest_peer_ms"] == 0.8
    assert record["opplugin_graphs_over_fastest_peer"] == pytest.approx(0.66 / 0.8)
    assert record["opplugin_eager_over_fastest_peer"] == pytest.approx(2.2 / 0.8)
    assert record["opplugin_graphs_over_floor"] == pytest.approx(3.3)
    assert record["floor_ms"] == 0.2 and record["floor_bound"] == "compute"
    alone = e2e.case_record("resnet18", 1, resnet18_batch1()[:2], None)
    assert alone["fastest_peer"] is None and alone["opplugin_graphs_over_fastest_peer"] is None and alone["floor_ms"] is None


def payload_of(cases):
    rows = [r for case in cases for r in case]
    records = [e2e.case_record(case[0]["model"], case[0]["batch"], case, floor(0.25)) for case in cases]
    return {"device": {"name": "GPU X"}, "warmup": 3, "repeat": 20, "roofline": ROOFLINE,
            "opplugin_default": "opplugin_graphs", "cases": records, "rows": rows}


def test_the_text_tables_name_the_fastest_peer_and_fit_110_columns():
    long_name = "a_model_with_a_name_far_too_long_for_any_column_of_a_terminal_table"
    second = [dict(r, model=long_name, batch=32, host_to_host_ms=(r["host_to_host_ms"] or 0) * 10 or None) for r in resnet18_batch1()]
    text = e2e_table.format_text(payload_of([resnet18_batch1(), second]))
    lines = text.splitlines()
    assert max(map(len, lines)) <= e2e_table.LINE_WIDTH
    prose = " ".join(text.split())
    assert "GPU X" in prose and "medians of 20 after 3 warm-up runs" in prose and "50.0 TFLOP/s" in prose and "3000 GB/s" in prose
    summary = next(line for line in lines if line.startswith("resnet18 "))
    assert summary.split() == ["resnet18", "1", "0.250", "compute", "0.660", "2.200", "compile", "graph", "0.800", "0.82x", "2.75x"]
    # the long name is cut in its middle, keeping both ends
    assert any(line.startswith("a_model_") and "..." in line and "_table" in line.split()[0] for line in lines)
    detail = next(line for line in lines if line.startswith("resnet18") and "PyTorch eager" in line)
    assert detail.split()[4:] == ["1.600", "1.500", "2.00x", "1.0e-06", "1.00", "ok"]
    # one note per reason, naming the candidates and cases it covers (long names cut), the reason whole
    notes = [line for line in lines if line.startswith("- ")]
    assert len(notes) == 1 and notes[0].startswith("- ORT CUDA, ORT CUDA graph (resnet18 at 1; a_model_wit...inal_table at 32)")
    assert " ".join(prose.split("\n")).endswith("): unavailable: onnxruntime 1.23.2 has no CUDAExecutionProvider")
    assert "opplugin's default is opplugin graphs" in prose


def test_an_output_the_same_for_every_image_is_said_to_check_little():
    """torchvision's ViT-B/16 with random weights has a head of zeros: every image gets the zero bias, and a rel L2
    of 0.0 against onnxruntime would look like a perfect check."""
    head_of_zeros = np.zeros((32, 1000), np.float32)
    assert e2e.output_varies(head_of_zeros) is False and e2e.output_varies(head_of_zeros[:1]) is None
    assert e2e.output_varies(np.random.default_rng(0).standard_normal((2, 10))) is True
    flat = [dict(r, output_varies=False) for r in resnet18_batch1()]
    assert e2e.case_record("resnet18", 1, flat, None)["output_varies"] is False
    notes = [line for line in e2e_table.format_text(payload_of([flat]), None).splitlines() if line.startswith("- resnet18")]
    assert notes == ["- resnet18 at 1: onnxruntime's output is the same for every image (a head of zeros, as torchvision "
                     "initialises ViT's, say), so the error columns check little of the model"]
    assert not any("same for every image" in line for line in e2e_table.format_text(payload_of([resnet18_batch1()])).splitlines())


def test_the_markdown_tables_have_a_line_per_case_and_per_candidate():
    text = e2e_table.format_markdown(payload_of([resnet18_batch1()]))
    lines = text.splitlines()
    assert "| resnet18 | 1 | 0.250 | compute | 0.660 | 2.200 | compile graph | 0.800 | 0.82x | 2.75x |" in lines
    assert sum(line.startswith("| resnet18 | 1 |") for line in lines) == 1 + len(e2e.CANDIDATES)
    assert "| resnet18 | 1 | ORT CUDA | - | - | - | - | - | unavailable |" in lines
    assert lines[-1] == "- ORT CUDA, ORT CUDA graph (resnet18 at 1): unavailable: onnxruntime 1.23.2 has no CUDAExecutionProvider"


def test_a_row_says_in_one_line_why_a_candidate_did_not_run_or_was_wrong(monkeypatch):
    monkeypatch.setattr(e2e, "release_device_memory", lambda: 7)
    reference = np.array([[1.0, 2.0], [3.0, 1.0]], np.float32)
    against = e2e.Accuracy(reference, e2e.FP32_REFERENCE, e2e.FP32_TOLERANCE)
    blank = e2e.empty_row("m", 2, "pytorch_eager")

    def unavailable():
        raise PeerUnavailable("PyTorch is not installed")

    def breaks():
        raise RuntimeError("out of memory\nTraceback (most recent call last): ...")

    assert e2e.measured_row(blank, unavailable, against) | {} == blank | {"status": "unavailable", "reason": "PyTorch is not installed"}
    broken = e2e.measured_row(blank, breaks, against)
    assert (broken["status"], broken["reason"], broken["device_free_bytes"]) == ("error", "RuntimeError: out of memory", 7)
    ran = e2e.measured_row(blank, lambda: {"host_to_host_ms": 1.0, "device_ms": 0.5, "output": reference, "implementation": "x"}, against)
    assert ran["status"] == "ok" and ran["rel_l2"] == 0.0 and ran["top1_agreement"] == 1.0 and "output" not in ran
    wrong = e2e.measured_row(blank, lambda: {"host_to_host_ms": 1.0, "device_ms": 0.5, "output": reference[::-1], "implementation": "x"},
                             against)
    assert wrong["status"] == "incorrect" and wrong["reason"].startswith("relative L2 error")
    assert wrong["reason"].endswith(" against onnxruntime CPU")  # FP32's reason as it always was


def test_the_run_fails_on_a_wrong_answer_or_a_broken_opplugin_not_on_a_broken_peer():
    peer_broke = [row("m", 1, "opplugin_graphs", 1.0), row("m", 1, "torch_compile_graph", None, status="error", reason="x")]
    assert e2e.failed({"rows": peer_broke}) == []
    ours_broke = [row("m", 1, "opplugin_eager", None, status="error", reason="x")]
    assert e2e.failed({"rows": ours_broke}) == ours_broke
    peer_wrong = [row("m", 1, "onnxruntime_cuda", 1.0, status="incorrect", reason="x")]
    assert e2e.failed({"rows": peer_wrong}) == peer_wrong


def test_opplugin_default_follows_the_runners_own_default():
    import inspect

    from opplugin.runtime import Runner

    graphs = inspect.signature(Runner).parameters["cuda_graphs"].default
    assert e2e.opplugin_default() == ("opplugin_eager" if graphs is False else "opplugin_graphs")
    assert set(e2e.CANDIDATES) == set(e2e_table.LABELS) and set(e2e.OPPLUGIN) | set(e2e.PEERS) == set(e2e.CANDIDATES)


def test_without_torch_every_pytorch_peer_gives_the_same_one_line_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(e2e_torch, "torch_or_reason", lambda: (None, "torch is not importable (ModuleNotFoundError: No module named 'torch')"))
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    peer = e2e_torch.TorchModel(tmp_path / "tiny.onnx", model)
    for _ in range(2):
        with pytest.raises(PeerUnavailable, match=r"^torch is not importable \(ModuleNotFoundError"):
            peer.get()


def test_without_a_pt_file_or_onnx2torch_the_pytorch_peer_says_which_file_it_wanted(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx2torch", None)  # not importable, whether installed or not
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    with pytest.raises(PeerUnavailable, match=r"no tiny\.pt beside the model .*onnx2torch is not installed"):
        e2e_torch.torch_module(object(), tmp_path / "tiny.onnx", model)


def test_without_the_cuda_provider_both_onnxruntime_peers_say_so(monkeypatch, tmp_path):
    monkeypatch.setattr("opplugin.ort.sessions.has_cuda", lambda: False)
    model = load_model(save(tiny_cnn(), tmp_path / "tiny.onnx"))
    for graph in (False, True):
        with pytest.raises(PeerUnavailable, match=r"^onnxruntime \S+ has no CUDAExecutionProvider \(the CPU build is installed\)$"):
            e2e_onnxruntime.cuda_session(model, graph=graph)


@pytest.mark.parametrize("group", [1, 2])
def test_a_models_work_counts_flops_weights_and_the_activations_it_must_write(tmp_path, group):
    # tiny_cnn at batch 2: Conv(3->4, 3x3, pad 1) 12x12 > Relu > MaxPool 2x2 > Conv(4->4, 3x3, group) 4x4 > Relu
    # > Flatten > Gemm(64->5) > Softmax
    work = model_floor.model_work(load_model(save(tiny_cnn(group=group), tmp_path / "tiny.onnx")), 2)
    conv1, pool, conv2, gemm = 2 * 1152 * 27, 288 * 4, 2 * 128 * 36 // group, 2 * 10 * 64
    assert work.flops == conv1 + 1152 + pool + conv2 + 128 + gemm + 10  # Relu, Relu and Softmax one per element
    assert work.weight_bytes == 4 * (108 + 4 + 144 // group + 320 + 5)
    assert work.input_bytes == 4 * 2 * 3 * 12 * 12
    # written: conv1, the pool, conv2, the Gemm and the Softmax; the Relus fuse, the Flatten is a view
    assert work.activation_bytes == 4 * (1152 + 288 + 128 + 10 + 10)


def test_a_reduction_counts_every_input_element_a_view_nothing():
    from onnx import helper

    from opplugin.registry import NodeInfo, TensorInfo

    def info(op, shape_in, shape_out):
        f32 = np.dtype(np.float32)
        return NodeInfo(helper.make_node(op, ["a"], ["b"]), [TensorInfo("a", shape_in, f32)], [TensorInfo("b", shape_out, f32)], {})

    assert model_floor.node_flops(info("ReduceMean", (2, 512, 7, 7), (2, 512, 1, 1))) == 2 * 512 * 49
    assert model_floor.node_writes(info("ReduceMean", (2, 512, 7, 7), (2, 512, 1, 1))) == 4 * 2 * 512
    assert model_floor.node_flops(info("Reshape", (2, 512), (2, 512))) == 0 == model_floor.node_writes(info("Reshape", (2, 512), (2, 512)))


def test_the_floor_is_the_larger_of_the_compute_and_memory_times():
    work = model_floor.ModelWork(flops=2_000_000_000, weight_bytes=1_000_000, input_bytes=0, activation_bytes=1_000_000)
    compute = work.record(bytes_per_s=2e12, flops_per_s=40e12)
    assert compute["floor_ms"] == pytest.approx(0.05) and compute["floor_bound"] == "compute"
    assert (e2e_table.ms(0.05), e2e_table.ms(1.23456), e2e_table.ms(None)) == ("0.05", "1.235", "-")
    memory = work.record(bytes_per_s=2e9, flops_per_s=40e12)
    assert memory["floor_ms"] == pytest.approx(1.0) and memory["floor_bound"] == "memory"


def test_agreement_gives_relative_l2_and_top1_for_a_classifier_only():
    reference = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], np.float32)
    ours = reference.copy()
    ours[1] = [1.0, 2.0, 3.5]  # the second image's top-1 moves
    figures = e2e.agreement(ours, reference)
    assert figures["top1_agreement"] == 0.5
    assert figures["rel_l2"] == pytest.approx(np.linalg.norm([2.0, 0.0, 2.5]) / np.linalg.norm(reference))
    assert e2e.agreement(reference[:, :1], reference[:, :1])["top1_agreement"] is None
    assert e2e.agreement(reference, reference)["rel_l2"] == 0.0


def test_host_ms_is_the_median_after_warm_up():
    calls = []
    assert host_ms(lambda: calls.append(1), warmup=2, repeat=3) >= 0.0
    assert len(calls) == 5


def test_a_warm_up_with_a_time_goes_on_until_that_time_has_passed():
    calls = []

    def slow():
        calls.append(time.perf_counter())
        time.sleep(0.002)

    host_ms(slow, warmup=2, repeat=1, warmup_ms=20.0)
    warm, timed = calls[:-1], calls[-1]
    assert len(warm) >= 2 and (timed - warm[0]) * 1e3 >= 19.9  # timing began once 20 ms of warm-up had passed
    # and the warm-up stopped there: each call sleeps 2 ms at least, so 20 ms hold 10 of them and the one that
    # began before the 20th ms (a busy machine's scheduling delays make fewer, never more; the time of the
    # last call's start is no measure, as the process may wait between the check and the call)
    assert len(warm) <= 11


def test_bench_e2e_without_a_gpu_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr("opplugin.gpu.cuda.is_available", lambda: False)
    assert cli.main(["bench", "--e2e", "lenet86"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opplugin: error: bench --e2e needs a CUDA device, and CuPy sees none"]


def test_bench_e2e_refuses_a_batch_below_one(capsys):
    assert cli.main(["bench", "--e2e", "lenet86", "--batches", "0"]) == 2
    assert "--batches" in capsys.readouterr().err


def test_the_committed_e2e_run_has_the_shared_header_a_row_per_candidate_and_its_case_records():
    payload = json.loads((ROOT / "tools" / "benchmark" / "e2e.json").read_text())
    assert list(payload)[:5] == ["schema", "opplugin_version", "device", "model", "batch"]
    # the committed run predates --precision: schema 3 is schema 4 in FP32 without its `precision` and `reference`
    assert payload["schema"] in (e2e.SCHEMA, "opplugin-bench-e2e/3") and payload["device"]["kind"] == "cuda"
    cases = [(c["model"], c["batch"]) for c in payload["cases"]]
    assert [(r["model"], r["batch"], r["peer"]) for r in payload["rows"]] == [(*c, p) for c in cases for p in e2e.CANDIDATES]
    assert all(r["status"] != "incorrect" for r in payload["rows"])
    for case in payload["cases"]:  # each record is what case_record makes of its rows
        rows = [r for r in payload["rows"] if (r["model"], r["batch"]) == (case["model"], case["batch"])]
        floor_keys = ("flops", "weight_bytes", "input_bytes", "activation_bytes", "floor_ms", "floor_bound")
        assert e2e.case_record(case["model"], case["batch"], rows, {k: case[k] for k in floor_keys}) == case


def test_peers_left_out_of_peers_get_skipped_rows_and_are_never_timed(monkeypatch, tmp_path):
    monkeypatch.setattr(e2e, "release_device_memory", lambda: 0)
    timed = []

    def timer(name):
        def time(*args, **kwargs):
            timed.append(name)
            raise PeerUnavailable(f"{name} cannot run here")
        return time

    monkeypatch.setattr(e2e, "time_opplugin", timer("opplugin"))
    monkeypatch.setattr(e2e_torch, "time_eager", timer("pytorch_eager"))
    monkeypatch.setattr(e2e_torch, "time_graph", timer("pytorch_graph"))
    monkeypatch.setattr(e2e_onnxruntime, "time_cuda", timer("onnxruntime_cuda"))
    monkeypatch.setattr(e2e_onnxruntime, "time_cuda_graph", timer("onnxruntime_cuda_graph"))
    monkeypatch.setattr(e2e_torch.TorchModel, "get", lambda self, precision="fp32": None)
    path = save(tiny_cnn(), tmp_path / "tiny.onnx")
    rows = e2e.bench_case(Path(path), load_model(path), 2, 0, 1, peers=("onnxruntime_cuda",))
    assert [r["peer"] for r in rows] == list(e2e.CANDIDATES)
    status = {r["peer"]: r["status"] for r in rows}
    assert status == {"opplugin_graphs": "unavailable", "opplugin_eager": "unavailable", "onnxruntime_cuda": "unavailable",
                      "pytorch_eager": "skipped", "pytorch_graph": "skipped", "torch_compile_graph": "skipped",
                      "onnxruntime_cuda_graph": "skipped"}
    assert timed == ["opplugin", "opplugin", "onnxruntime_cuda"]


def test_bench_peers_takes_only_known_peer_names(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["bench", "--e2e", "m.onnx", "--peers", "tensorrt"])
    assert exit.value.code == 2 and "invalid choice: 'tensorrt'" in capsys.readouterr().err
