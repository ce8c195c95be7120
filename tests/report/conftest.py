"""The headless Chromium the browser tests share, through Playwright.

A test that asks for `browser` skips, with the reason, where Playwright or Chromium is
missing (`pip install playwright`, `apt-get install chromium`; Playwright's own browser
download is not needed: the system's Chromium is used)."""
import shutil

import pytest


# one browser a module: Playwright's sync API runs one at a time in a process, and a later test (the
# README pictures' tool) starts its own
@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium)
        yield launched
        launched.close()
