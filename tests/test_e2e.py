"""`opplugin bench --e2e` on the CPU: its table, its comparison, and its refusal without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from opplugin import cli
from opplugin.lab import e2e


def row(model, batch, peer, h2h, resident, status="ok", reason=None):
    return {"model": model, "batch": batch, "peer": peer, "status": status, "reason": reason,
            "host_to_host_ms": h2h, "device_ms": resident}


def test_the_markdown_table_has_a_line_per_model_and_batch_with_ratios_over_each_peer():
    payload = {"device": {"name": "GPU X"}, "warmup": 3, "repeat": 20, "rows": [
        row("resnet18", 1, "opplugin", 6.0, 5.0), row("resnet18", 1, "opplugin_graphs", 3.0, 2.5),
        row("resnet18", 1, "onnxruntime_cuda", 2.0, 1.5), row("resnet18", 1, "pytorch", 1.5, 1.2),
        row("resnet18", 32, "opplugin", 48.0, None), row("resnet18", 32, "onnxruntime_cuda", None, None, "unavailable", "CPU build"),
        row("resnet18", 32, "pytorch", 4.8, 4.4),
    ]}
    lines = e2e.format_markdown(payload).splitlines()
    assert "GPU X" in lines[0] and "medians of 20 after 3 warm-up runs" in lines[0]
    table = [line for line in lines if line.startswith("| resnet18")]
    assert table[0] == "| resnet18 | 1 | 6.000 / 5.000 | 3.000 / 2.500 | 2.000 / 1.500 | 1.500 / 1.200 | 4.00x | 2.00x | 3.00x | 1.50x |"
    assert table[1] == "| resnet18 | 32 | 48.000 / - | - | unavailable | 4.800 / 4.400 | 10.00x | - | - | - |"
    assert lines[-1] == "- resnet18 batch 32 onnxruntime_cuda: unavailable: CPU build"


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
    assert e2e.host_ms(lambda: calls.append(1), warmup=2, repeat=3) >= 0.0
    assert len(calls) == 5


def test_bench_e2e_without_a_gpu_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr("opplugin.cuda.is_available", lambda: False)
    assert cli.main(["bench", "--e2e", "lenet86"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["opplugin: error: bench --e2e needs a CUDA device, and CuPy sees none"]


def test_bench_e2e_refuses_a_batch_below_one(capsys):
    assert cli.main(["bench", "--e2e", "lenet86", "--batches", "0"]) == 2
    assert "--batches" in capsys.readouterr().err


def test_the_committed_e2e_run_has_the_shared_header_and_a_row_per_peer():
    import json
    from pathlib import Path

    payload = json.loads((Path(__file__).resolve().parents[1] / "tools" / "benchmark" / "e2e.json").read_text())
    assert list(payload)[:5] == ["schema", "opplugin_version", "device", "model", "batch"]
    assert payload["schema"] == e2e.SCHEMA and payload["device"]["kind"] == "cuda"
    cases = {(r["model"], r["batch"]) for r in payload["rows"]}
    assert len(payload["rows"]) == len(cases) * len(e2e.PEERS)
    assert all(r["status"] != "incorrect" for r in payload["rows"])
