"""The tables `bench --e2e` prints from its JSON payload (lab/e2e.py), as plain text that
fits LINE_WIDTH columns (long names cut in the middle) or as Markdown for the benchmark page.

- The summary: a line per model and batch with the model's floor on this device, opplugin's
  two modes host to host, the fastest peer, and each mode's time over the peer's.
- The details: a line per candidate with both figures, its time over the fastest peer's,
  and its agreement with the run's reference (onnxruntime CPU in FP32, float64 in a reduced
  precision); then, once per candidate and reason, why a candidate did not run or failed.

The heading says the run's precision; a payload written before runs had one (schema 3) is FP32.
"""
from __future__ import annotations

import textwrap
from typing import Any

from ..core.texttable import elide_middle, text_table

LINE_WIDTH = 110
NOTE_NAME_WIDTH = 24  # characters of a model's name in a note
LABELS = {
    "opplugin_graphs": "opplugin graphs",
    "opplugin_eager": "opplugin eager",
    "pytorch_eager": "PyTorch eager",
    "pytorch_graph": "PyTorch graph",
    "torch_compile_graph": "compile graph",
    "onnxruntime_cuda": "ORT CUDA",
    "onnxruntime_cuda_graph": "ORT CUDA graph",
}
LEGEND = ("graphs, eager: opplugin with and without CUDA graphs, ms host to host; graph: replayed from one CUDA "
          "graph; compile: torch.compile (inductor, default mode); ORT: onnxruntime's CUDA provider; ratios are "
          "host to host, below 1.00x opplugin is faster.")


# the columns of numbers (aligned right); the others are text, cut in the middle to fit
SUMMARY_NUMBERS = (1, 2, 4, 5, 7, 8, 9)
DETAILS_NUMBERS = (1, 3, 4, 5, 6, 7)


def label(candidate: str) -> str:
    return LABELS.get(candidate, candidate)


def ms(value: float | None) -> str:
    """Three decimals; three significant digits below 0.1 ms (a small model's floor)."""
    if value is None:
        return "-"
    return f"{value:.3f}" if value >= 0.1 or value == 0 else f"{value:.3g}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def summary(payload: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["model", "batch", "floor ms", "bound", "graphs", "eager", "fastest peer", "peer ms",
              "graphs/peer", "eager/peer"]
    rows = [[case["model"], str(case["batch"]), ms(case["floor_ms"]), case["floor_bound"] or "-",
             ms(case["opplugin_graphs_ms"]), ms(case["opplugin_eager_ms"]),
             label(case["fastest_peer"]) if case["fastest_peer"] else "none ran", ms(case["fastest_peer_ms"]),
             times(case["opplugin_graphs_over_fastest_peer"]), times(case["opplugin_eager_over_fastest_peer"])]
            for case in payload["cases"]]
    return header, rows


def details(payload: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["model", "batch", "candidate", "host ms", "resident ms", "/ fastest peer", "rel L2", "top-1", "status"]
    fastest = {(case["model"], case["batch"]): case["fastest_peer_ms"] for case in payload["cases"]}
    rows = []
    for row in payload["rows"]:
        ran = row["status"] == "ok"
        peer_ms = fastest.get((row["model"], row["batch"]))
        over = row["host_to_host_ms"] / peer_ms if ran and row["host_to_host_ms"] and peer_ms else None
        rows.append([row["model"], str(row["batch"]), label(row["peer"]),
                     ms(row["host_to_host_ms"]) if ran else "-", ms(row["device_ms"]) if ran else "-", times(over),
                     "-" if row.get("rel_l2") is None else f"{row['rel_l2']:.1e}",
                     "-" if row.get("top1_agreement") is None else f"{row['top1_agreement']:.2f}", row["status"]])
    return header, rows


def notes(payload: dict[str, Any], width: int | None) -> list[str]:
    """Why candidates did not run or failed: one note per reason, naming the candidates and the
    cases it covers (the same reason usually holds for every batch, and torch's absence for each
    PyTorch peer); wrapped to `width`, never cut."""
    per_candidate: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for row in payload["rows"]:
        if row["status"] != "ok":
            cases = per_candidate.setdefault((row["peer"], row["status"], row["reason"] or ""), {})
            model = elide_middle(row["model"], NOTE_NAME_WIDTH if width else None)
            cases.setdefault(model, []).append(str(row["batch"]))
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for (candidate, status, reason), cases in per_candidate.items():
        where = "; ".join(f"{model} at {', '.join(batches)}" for model, batches in cases.items())
        grouped.setdefault((status, reason, where), []).append(label(candidate))
    found = [f"- {', '.join(candidates)} ({where}): {status}: {reason}" for (status, reason, where), candidates in grouped.items()]
    found += [f"- {case['model']} at {case['batch']}: onnxruntime's output is the same for every image (a head of zeros, as "
              "torchvision initialises ViT's, say), so the error columns check little of the model"
              for case in payload.get("cases", []) if case.get("output_varies") is False]
    lines = []
    for note in found:
        lines += textwrap.wrap(note, width, subsequent_indent="  ", break_on_hyphens=False) if width else [note]
    return lines


# what each candidate runs in a reduced precision, in words
HOW = {
    "tf32": "with TF32 on where it has it (opplugin's TF32 kernels, PyTorch's allow_tf32, onnxruntime's use_tf32)",
    "fp16": "in FP16 where it has it (opplugin's FP16 kernels, PyTorch's module converted and channels_last, "
            "onnxruntime's model converted by onnxconverter-common)",
    "bf16": "in BF16 where it has it (opplugin's BF16 kernels, PyTorch's module converted and channels_last; "
            "onnxruntime has no BF16)",
}


def precision_words(payload: dict[str, Any]) -> str:
    """What every candidate ran in and what its output was checked against, in words."""
    precision = payload.get("precision", "fp32")
    if precision == "fp32":
        return "FP32 everywhere (TF32 off), every output checked against onnxruntime CPU first."
    return (f"every candidate {HOW[precision]}, every output checked against the model in float64 first "
            f"(correct within a relative L2 error of {payload['tolerance']:.3g}).")


def _lasting(payload: dict[str, Any]) -> str:
    """How long each candidate's warm-up lasted at least, where the payload says (runs before it did not)."""
    return f" and {payload['warmup_ms']:g} ms at least" if payload.get("warmup_ms") else ""


def _floor(payload: dict[str, Any]) -> str:
    roof = payload.get("roofline") or {}
    if payload.get("precision", "fp32") != "fp32":
        return "Floor: none in a reduced precision (the measured rate is FP32's, and its values are 4 bytes)."
    if not roof:
        return "Floor: not measured."
    return (f"Floor: the model's FLOPs at {roof['fp32_tflop_per_s']:.1f} TFLOP/s (FP32 SGEMM, TF32 off) or its weights, "
            f"input and activations moved once at {roof['copy_gb_per_s']:.0f} GB/s (device-to-device copy), "
            "whichever takes longer; both rates measured in this run.")


def _prose(payload: dict[str, Any], width: int | None) -> list[str]:
    default = payload.get("opplugin_default")
    lines = [
        f"End to end in {payload.get('precision', 'fp32').upper()} on {payload['device']['name']}: ms host to host "
        f"(pinned host input to host output) and device-resident, medians of {payload['repeat']} after "
        f"{payload['warmup']} warm-up runs{_lasting(payload)}; random weights and inputs, {precision_words(payload)}",
        _floor(payload),
        LEGEND + (f" opplugin's default is {label(default)}." if default else ""),
        "opplugin's host-to-host figure is a runner as it runs by default (chunks on several streams); its "
        "device-resident one is a runner taking the batch in one chunk on one stream, less the copies of the "
        "graph's inputs and outputs.",
    ]
    return [textwrap.fill(line, width, break_on_hyphens=False) if width else line for line in lines]


def format_text(payload: dict[str, Any], width: int | None = LINE_WIDTH) -> str:
    """Both tables as plain text no wider than `width` (None: no limit)."""
    lines = _prose(payload, width) + [""]
    for (header, rows), numbers in ((summary(payload), SUMMARY_NUMBERS), (details(payload), DETAILS_NUMBERS)):
        lines += text_table(header, rows, right=numbers, width=width) + [""]
    found = notes(payload, width)
    return "\n".join(lines + found + ([""] if found else [])).rstrip("\n") + "\n"


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def format_markdown(payload: dict[str, Any]) -> str:
    """Both tables in Markdown, for tools/benchmark/BENCHMARK.md."""
    lines = _prose(payload, None) + [""] + _markdown(*summary(payload)) + [""] + _markdown(*details(payload))
    found = notes(payload, None)
    return "\n".join(lines + ([""] + found if found else [])) + "\n"
