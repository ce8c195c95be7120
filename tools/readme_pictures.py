"""The README's pictures of `run --report`, made from a real run rather than by hand:
docs/report.png (the page's header, plan and timeline) and docs/roofline.png (its roofline).

    python3 tools/readme_pictures.py                   # lenet86, on the GPU where there is one
    python3 tools/readme_pictures.py --device cpu --out /tmp/pictures

The run is lenet86 at batch 200 in chunks of 50, one timed run; on the CPU the roofline has
its points and no roof (the reference backend has no ceilings), on a GPU the measured ceilings
too. The page is opened in headless Chromium through Playwright (the dev extra, and
`apt-get install chromium`), cut at its sections, and each picture is saved in a palette of
at most 128 colours, which keeps it small (the report's colours are few and flat).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright

from opplugin.cli import main as opplugin

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 1200  # CSS pixels: the plan's table on one line a step, as a reader's window shows it
MARGIN = 16  # CSS pixels of the page around each picture
COLOURS = 128


def write_report(path: Path, device: str) -> None:
    argv = ["run", "lenet86", "--batch", "200", "--chunk", "50", "--repeat", "1", "--device", device, "--report", str(path)]
    with contextlib.redirect_stdout(io.StringIO()):
        status = opplugin(argv)
    if status != 0:
        raise SystemExit(f"opplugin {' '.join(argv)} exited {status}")


def save_small(png: bytes, path: Path) -> None:
    with Image.open(io.BytesIO(png)) as picture:
        picture.convert("RGB").quantize(COLOURS).save(path, optimize=True)


def take_pictures(page_path: Path, out: Path, chromium: str) -> list[Path]:
    """report.png: from the top of the page to the end of the Timeline section; roofline.png:
    the Roofline section; each with a margin of the page's white around it."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": WIDTH, "height": 800})
        page.goto(page_path.as_uri())

        def section(title: str) -> dict:
            return page.locator("section").filter(has=page.locator("h2", has_text=title)).bounding_box()

        timeline, roofline = section("Timeline"), section("Roofline")
        top = {"x": 0, "y": 0, "width": WIDTH, "height": timeline["y"] + timeline["height"] + MARGIN}
        roof = {"x": roofline["x"] - MARGIN, "y": roofline["y"] - MARGIN,
                "width": roofline["width"] + 2 * MARGIN, "height": roofline["height"] + 2 * MARGIN}
        pictures = [(page.screenshot(full_page=True, clip=clip), out / name)
                    for clip, name in ((top, "report.png"), (roof, "roofline.png"))]
        browser.close()
    for png, path in pictures:
        save_small(png, path)
    return [path for _, path in pictures]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the pictures (default: docs/)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the run runs (default auto)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("readme_pictures: no Chromium here (apt-get install chromium)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        page_path = Path(folder) / "report.html"
        write_report(page_path, args.device)
        for path in take_pictures(page_path, args.out, chromium):
            print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
