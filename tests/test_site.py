"""Open every page of the built website in a real browser and check it works offline.

Needs `_build/html` (`make book`) and Debian's Chromium at /usr/bin/chromium ($CHROMIUM
overrides), driven by Playwright (never `playwright install`). For each page, at desktop and phone width:
no failed request, no request leaving 127.0.0.1, no console error beyond ALLOWED_CONSOLE,
every image loaded, every stored widget rendered, all math typeset, every internal link
and anchor resolving, no sideways scrolling. A screenshot of each page goes to
_build/screenshots/ for a human to look at.

    .venv/bin/python -m pytest tests -m browser
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))  # Debian's; override for elsewhere
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDTHS = {"desktop": 1280, "phone": 390}

# Console errors that are known, harmless, and not ours to fix.
ALLOWED_CONSOLE = [
    # Sphinx 7.4 emits sphinx-thebe's config script twice on notebook pages; the second
    # `const THEBE_JS_URL` fails to redeclare. Thebe is off (no launch buttons), so nothing breaks.
    re.compile(r"Identifier 'THEBE_JS_URL' has already been declared"),
]

# Not pages: theme templates copied into _static, notebook sources, images.
NOT_PAGES = {"_static", "_sources", "_images"}


def allowed(message: str) -> bool:
    return any(p.search(message) for p in ALLOWED_CONSOLE)


def site_pages() -> list[str]:
    if not SITE.is_dir():
        return []
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if p.relative_to(SITE).parts[0] not in NOT_PAGES)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # The browser drops connections it no longer needs (navigation, abort); not an error.
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").is_file():
        pytest.fail(f"{SITE} has no index.html: build the site first with `make book`")
    handler = functools.partial(_Quiet, directory=str(SITE))
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); "
                    "do not use `playwright install`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class _Ids(HTMLParser):
    """Collects every id and <a name> in a page: the anchors a #fragment can land on."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.ids.add(value)


@functools.lru_cache(maxsize=None)
def fetch_ids(url: str) -> tuple[int, frozenset[str]]:
    """HTTP status of a same-origin page and the anchors it defines."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, frozenset()
    if not urlsplit(url).path.endswith((".html", "/")):
        return status, frozenset()
    parser = _Ids()
    parser.feed(body.decode("utf-8", "replace"))
    return status, frozenset(parser.ids)


# Runs in the page: waits for what renders after `load` (MathJax, widgets, lazy images).
SETTLE_JS = """async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const views = () => document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]');
  const rendered = () => [...views()].filter(s => {
    const box = s.previousElementSibling;
    return box && box.classList.contains('widget-subarea') && box.querySelector('.jupyter-widgets, .lm-Widget');
  }).length;
  for (let i = 0; i < 200 && rendered() < views().length; i++) await sleep(100);
  for (const img of document.images) img.loading = 'eager';
  await Promise.all([...document.images].map(img => img.complete ? null :
    new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
}"""

INSPECT_JS = """() => {
  const views = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const unrendered = views.filter(s => {
    const box = s.previousElementSibling;
    return !(box && box.classList.contains('widget-subarea') && box.querySelector('.jupyter-widgets, .lm-Widget'));
  }).map(s => JSON.parse(s.textContent).model_id);
  return {
    brokenImages: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    widgetViews: views.length,
    unrenderedWidgets: unrendered,
    widgetState: document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]').length,
    mathSources: document.querySelectorAll('span.math, div.math').length,
    mathRendered: document.querySelectorAll('mjx-container').length,
    mathErrors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    overflow: document.documentElement.scrollWidth - window.innerWidth,
  };
}"""


def _slug(page: str) -> str:
    return page.removesuffix(".html").replace("/", "__")


@pytest.mark.parametrize("width_name", list(WIDTHS))
@pytest.mark.parametrize("page", site_pages() or ["<no site built>"])
def test_page(server, browser, page, width_name):
    width = WIDTHS[width_name]
    origin = urlsplit(server).netloc
    problems: list[str] = []
    external: list[str] = []

    context = browser.new_context(viewport={"width": width, "height": 900}, service_workers="block")

    def guard(route):
        # Nothing may leave the machine: record and refuse anything not served by our server.
        if urlsplit(route.request.url).netloc != origin:
            external.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    context.route("**/*", guard)
    pg = context.new_page()
    pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})")
          if urlsplit(r.url).netloc == origin else None)
    pg.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def on_console(msg):
        if msg.type == "error" and not allowed(msg.text):
            problems.append(f"console error: {msg.text} @ {msg.location.get('url', '')}")

    pg.on("console", on_console)
    pg.on("pageerror", lambda e: None if allowed(str(e)) else problems.append(f"page error: {e}"))
    try:
        pg.goto(server + page, wait_until="load")
        if 'http-equiv="refresh"' in (SITE / page).read_text().lower():
            # index.html only forwards to the root page; check where it lands.
            pg.wait_for_url(lambda url: url != server + page)
            pg.wait_for_load_state("load")
        pg.evaluate(SETTLE_JS)
        pg.wait_for_load_state("networkidle")
        info = pg.evaluate(INSPECT_JS)
        SHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SHOTS / f"{_slug(page)}-{width}.png"), full_page=True)
    finally:
        context.close()

    problems += [f"request left 127.0.0.1: {u}" for u in external]
    problems += [f"image did not load: {src}" for src in info["brokenImages"]]
    if info["widgetState"] and not info["widgetViews"]:
        problems.append("widget state is stored but no widget view is on the page")
    problems += [f"widget {m} did not render" for m in info["unrenderedWidgets"]]
    if info["mathSources"] and info["mathRendered"] < info["mathSources"]:
        problems.append(f"math not typeset: {info['mathRendered']} of {info['mathSources']} formulas")
    problems += [f"MathJax error: {e}" for e in info["mathErrors"]]
    if info["overflow"] > 1:
        problems.append(f"page scrolls sideways by {info['overflow']} px at {width} px width")
    for link in sorted(set(info["links"])):
        url, fragment = urldefrag(link)
        if urlsplit(url).netloc != origin:
            continue
        status, ids = fetch_ids(url)
        if status != 200:
            problems.append(f"broken link: {link} (HTTP {status})")
        elif fragment and unquote(fragment) not in ids:
            problems.append(f"missing anchor: {link}")
    assert not problems, f"{page} at {width} px:\n  " + "\n  ".join(problems)
