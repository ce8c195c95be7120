"""`opplugin bench --report`: each benchmark's payload (made up, bench_payloads.py) on one
self-contained page: it parses, fetches and runs nothing, has a table line and a chart line per
row of the payload, a bar for each timed one, and for the Conv suites a roofline point each."""
from __future__ import annotations

import datetime

import pytest
from bench_payloads import (
    CONV_ROWS_PER_STEP,
    CONV_TIMED_PER_STEP,
    conv_payload,
    custom_payload,
    e2e_payload,
    gemm_payload,
    scaling_payload,
)
from html_pages import ReadPage

from opplugin.lab.bench_page import bench_page

WHEN = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.timezone.utc)


def read(benchmark: str, payload: dict) -> tuple[str, ReadPage]:
    text = bench_page(benchmark, payload, WHEN)
    return text, ReadPage(text)


def self_contained(text: str, page: ReadPage) -> None:
    assert page.links == [] and "http://" not in text and "https://" not in text
    assert page.count("script") == 0 and "<script" not in text.lower()
    assert page.open == []  # every element closed


def data_rows(page: ReadPage, first_cell: str) -> list[list[str]]:
    """The rows of the tables whose header starts with `first_cell`, headers left out."""
    rows, inside = [], False
    for row in page.rows:
        if row and row[0] == first_cell:
            inside = True
        elif inside and len(row) > 1:
            rows.append(row)
    return rows


@pytest.mark.parametrize("suite", ["models", "cnn"])
def test_the_conv_suites_page_has_a_roofline_point_and_a_bar_per_timed_row_and_a_line_per_row(suite):
    payload = conv_payload(suite)
    text, page = read(suite, payload)
    self_contained(text, page)
    timed = [r for r in payload["rows"] if r["ms"]]
    assert len(timed) == 2 * CONV_TIMED_PER_STEP and len(payload["rows"]) == 2 * CONV_ROWS_PER_STEP
    assert page.count("circle", "point") == len(timed)  # every timed candidate of both layers on the roofline
    assert page.count("polyline", "roof") == 1
    assert page.count("rect", "bar") == len(timed)
    # per layer one bar of each kind below, and its key in the layer's legend
    assert page.count("rect", "key") == 2 * 4
    assert page.count("rect", "peer") == page.count("rect", "inexact") == page.count("rect", "user") == 2 + 2
    assert page.count("line", "marker") == 2  # each layer's floor
    # every row in its layer's table, the same cells as the text table
    variant_rows = [row for row in page.rows if len(row) == 10 and row[0] != "variant"]
    assert len(variant_rows) == len(payload["rows"])
    assert ["[cudnn_fp32]", "yes"] == variant_rows[7][:2]
    assert variant_rows[4][-1].startswith("INCORRECT: relative error 0.5") and page.count("tr", "fail") == 4
    assert variant_rows[6][0] == "slow<&>.cu" and "slow<&>" not in text  # escaped, read back whole
    assert any(title.startswith("const_rb_t8x1_m4: 0.06 ms") for title in page.titles)
    assert "lenet86 conv1 (1-&gt;4 maps, 7x7, 86x86 in), batch 1,000" in text
    if suite == "models":
        assert "Fused steps together" in text and "Streams" in text and "Layer set summary" not in text
        assert len(data_rows(page, "streams")) == 2
    else:
        assert "Layer set summary" in text and len(data_rows(page, "layer")) == 2


def test_the_header_names_the_device_models_batches_and_roofline():
    text, _ = read("models", conv_payload())
    assert "NVIDIA H200" in text and "<dd>lenet86</dd>" in text and "<dd>1000</dd>" in text and "2026-11-29" in text
    assert "FP32" in text and "TFLOP/s" in text and "onnxruntime_cuda: not measured" in text


def test_the_gemm_page_draws_each_layer_against_cublas_and_its_weight_floor():
    payload = gemm_payload()
    text, page = read("gemm", payload)
    self_contained(text, page)
    assert page.count("rect", "bar") == sum(1 for r in payload["rows"] if r["ms"]) == 4
    assert page.count("rect", "peer") == 2 + 2 and page.count("line", "marker") == 2  # a bar and a legend key per layer
    assert len(data_rows(page, "layer")) == len(payload["rows"])
    assert "does not fit" in text and "not timed: relative error 0.3" in text


def test_the_e2e_page_draws_every_candidate_of_each_case_host_to_host():
    payload = e2e_payload()
    text, page = read("e2e", payload)
    self_contained(text, page)
    ran = [r for r in payload["rows"] if r["status"] == "ok"]
    assert page.count("rect", "bar") == len(ran) == 5 + 4
    assert page.count("rect", "opplugin") == 4 + 2 and page.count("line", "marker") == 2  # and a legend key; each case's floor
    assert len(data_rows(page, "model")) == len(payload["cases"]) + len(payload["rows"])  # the summary, then every candidate
    assert page.count("tr", "fail") == 1  # torch.compile wrong at 32
    assert "unavailable: onnxruntime 1.31 has no CUDAExecutionProvider" in text
    assert any(title.startswith("opplugin graphs: 0.5 ms host to host") for title in page.titles)


def test_the_scaling_page_draws_images_per_second_per_device_list():
    payload = scaling_payload()
    text, page = read("scaling", payload)
    self_contained(text, page)
    assert page.count("rect", "bar") == 3 and len(data_rows(page, "batch")) == 3
    assert page.count("tr", "fail") == 1 and "share a GPU" in text
    assert any("efficiency 90.9%" in title for title in page.titles)
    assert "--devices 0,0 at 200,000: the host fed 1 of the 2 devices" in text and "cuda:0 #2 left idle" in text


def test_the_custom_page_draws_each_implementation_of_each_custom_node():
    payload = custom_payload()
    text, page = read("custom", payload)
    self_contained(text, page)
    assert page.count("rect", "bar") == 2 and len(data_rows(page, "implementation")) == 3
    assert "incorrect: max abs error 0.3 against the reference" in text and "fastest correct: cuda_source" in text
    assert "NVIDIA H200" in text and "swish_model" in text
