"""tools/readme_pictures.py: the README's pictures of `run --report` are there, small, and made
by the tool from a real run (the tool's test skips without Playwright or Chromium)."""
from __future__ import annotations

import re
import shutil
import sys

import pytest
from PIL import Image
from repository import ROOT

PICTURES = ("report.png", "roofline.png")
MOST_BYTES = 150 * 1024


def test_the_readme_shows_each_picture_and_each_is_small():
    shown = re.findall(r"!\[[^\]]+\]\(docs/([^)]+)\)", (ROOT / "README.md").read_text())
    assert sorted(shown) == sorted(PICTURES)
    for name in PICTURES:
        path = ROOT / "docs" / name
        assert path.stat().st_size < MOST_BYTES
        with Image.open(path) as picture:
            assert picture.format == "PNG" and picture.width >= 900


def test_the_tool_makes_both_pictures_from_a_run(tmp_path, capsys):
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import readme_pictures  # a script of tools/, imported from its folder
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert readme_pictures.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    for name in PICTURES:
        with Image.open(tmp_path / name) as picture:
            # a palette picture of the page's width, of something (more than the page's white)
            assert picture.mode == "P" and picture.width >= 900 and picture.height > 400
            assert len(picture.getcolors(256)) > 8
        assert (tmp_path / name).stat().st_size < MOST_BYTES
    assert "wrote" in capsys.readouterr().out
