"""The HTML report opened in a real browser (headless Chromium through Playwright): it
renders, its charts have their bars and points, and the browser logs no error.

Skipped where Chromium or Playwright is missing (the `browser` fixture, conftest.py)."""
from made_up_profiles import gpu_profile_with_a_graph

from opplugin.cli import main
from opplugin.report import html_sections, timing
from opplugin.report.charts import Roof


def opened(browser, path):
    """The page at `path` once loaded, and what the browser logged meanwhile."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    logged = []
    page.on("console", lambda message: logged.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: logged.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: logged.append(f"failed request: {request.url}"))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, logged


def test_run_report_renders_with_its_bars_and_points(browser, tmp_path, capsys):
    path = tmp_path / "r.html"
    assert main(["run", "lenet86", "--batch", "6", "--chunk", "3", "--device", "cpu", "--repeat", "1", "--report", str(path)]) == 0
    page, logged = opened(browser, path)
    assert page.title() == "opplugin run: lenet86"
    assert page.locator("h2").all_inner_texts() == ["Plan", "Time by op chain", "Timeline", "Roofline"]
    # 4 steps in 2 chunks on the timeline; 3 op chains (conv1 and conv2 are both Conv > Relu > MaxPool)
    assert page.locator("svg rect.bar").count() == 8 + 3 and page.locator("svg circle.point").count() == 4
    box = page.locator("svg circle.point").first.bounding_box()
    assert box is not None and box["width"] > 0  # drawn, not merely present
    assert logged == []
    page.close()


def test_a_gpu_report_draws_its_roof_and_graph_replays(browser, tmp_path):
    profile = gpu_profile_with_a_graph()
    path = tmp_path / "g.html"
    path.write_text(html_sections.run_page(timing.build_report(profile, 2), profile, Roof(4e12, 50e12)))
    page, logged = opened(browser, path)
    assert page.locator("svg polyline.roof").count() == 1 and page.locator("svg circle.point").count() == 4
    assert page.locator("svg rect.bar.graph").count() == 2
    assert page.locator("svg polyline.roof").bounding_box()["width"] > 500
    assert logged == []
    page.close()


def test_check_report_renders_its_table(browser, tmp_path, capsys):
    path = tmp_path / "c.html"
    assert main(["check", "lenet86", "--batch", "4", "--device", "cpu", "--report", str(path)]) == 0
    page, logged = opened(browser, path)
    assert page.locator("td.pass").count() == 5 and page.locator("tr.fail").count() == 0
    assert logged == []
    page.close()
