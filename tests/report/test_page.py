"""The HTML page: self-contained (nothing to fetch), every text escaped, the shared header's facts."""
import datetime

from html_pages import ReadPage

from opplugin.report.page import Section, header_facts, render, table

WHEN = datetime.datetime(2025, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)
CPU = {"kind": "cpu", "name": "cpu", "compute_capability": None, "memory_bytes": None}


def test_a_page_holds_its_sections_in_order_and_fetches_nothing():
    sections = [Section("First", "<p>one</p>", "what it shows"), Section("Second", table(["a", "b"], [[1, 2.5]], numeric=(1,)))]
    text = render("opplugin run: m", header_facts({"device": CPU, "model": "m", "batch": 4}, WHEN), sections)
    page = ReadPage(text)
    assert text.startswith("<!DOCTYPE html>") and page.count("style") == 1
    assert page.links == [] and "http" not in text  # no script, stylesheet, font or image to fetch
    assert page.count("script") == 0 and page.count("h2") == 2 and text.index("First") < text.index("Second")
    assert page.rows == [["a", "b"], ["1", "2.5"]] and page.count("td", "num") == 1
    assert "2025-01-02 03:04 UTC" in text and "no CUDA device" in text


def test_names_from_a_model_are_escaped():
    text = render("<b>", [("model", "<script>alert(1)</script>")], [Section("s", table(["x"], [["a & <b>"]]))])
    page = ReadPage(text)
    assert page.count("script") == 0 and page.count("b") == 0
    assert ["a & <b>"] in page.rows and "&lt;script&gt;" in text


def test_the_header_names_a_gpu_with_its_compute_capability():
    gpu = {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0", "memory_bytes": 1}
    facts = dict(header_facts({"device": gpu, "model": "resnet50", "batch": 256, "opplugin_version": "9.9"}, WHEN))
    assert facts == {"model": "resnet50", "device": "NVIDIA H200, compute capability 9.0", "batch": "256",
                     "opplugin": "9.9", "date": "2025-01-02 03:04 UTC"}
