"""Open every page of the built website in a real browser and check it works offline and reads right.

Needs `_build/html` (`make book`) and Debian's Chromium (the `browser` fixture, tests/conftest.py).
For each page, at desktop and phone width: no failed request, no request leaving 127.0.0.1, no
console error beyond ALLOWED_CONSOLE, every image loaded, every stored widget rendered, all math
typeset with no literal TeX escapes, no raw Markdown (table syntax, backslash escapes) in the text, nothing
wider than the text column unless inside a box that scrolls (with a visible cue), no stderr or
internal notes in the outputs, every internal link and anchor resolving, no sideways scrolling.
On pages with exercises, every answer box gives Python's verdict for a right and a wrong answer.
With SITE_SCREENSHOTS=1 (`make screenshots`) a full-page screenshot of each page at each width goes to
_build/screenshots/ for a human to look at (1-2 s a page: not part of `make test`).

To add a check: measure it in INSPECT_JS (one visit per page and width) and turn it into
problems in test_page, or write a test that uses `shared_page` (it only reads the page) or
`open_page` (it clicks or types).

    .venv/bin/python -m pytest tests -m browser
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from conftest import CHROMIUM, CHROMIUM_ARGS  # noqa: F401 (the browser fixture's; tests import them from here)
from inference_course.exercises import Check, Exercise

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
# A screen: a 1280 x 900 window, and a phone's 390 x 844.
SCREENS = {"desktop": (1280, 900), "phone": (390, 844)}

# Console errors that are known, harmless, and not ours to fix. None today: the duplicate Thebe
# script that used to log "Identifier 'THEBE_JS_URL' has already been declared" is dropped by
# book/_ext/course_site.py.
ALLOWED_CONSOLE: list[re.Pattern] = []

# Text no reader should see in a page: profiler and library log lines, notes to ourselves.
NOISE = re.compile(r"USDT:|profiler_(start|stop)|\bTODO\b|\bFIXME\b|\bXXX\b|idle machine|\bsession \d+\b"
                   r"|^\[[WE]\d{4}|Traceback \(most recent call last\)", re.M)

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


@contextlib.contextmanager
def serve_folder(folder: Path, host: str = "127.0.0.1"):
    """``folder`` over HTTP on ``host`` (a free port) while the block runs; yields its root URL."""
    httpd = _Server((host, 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://{host}:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


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

INSPECT_JS = r"""() => {
  const views = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const unrendered = views.filter(s => {
    const box = s.previousElementSibling;
    return !(box && box.classList.contains('widget-subarea') && box.querySelector('.jupyter-widgets, .lm-Widget'));
  }).map(s => JSON.parse(s.textContent).model_id);
  const article = document.querySelector('article.bd-article') || document.body;
  const col = article.getBoundingClientRect();
  const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    [...el.classList].slice(0, 3).map(c => '.' + c).join('');
  const where = el => {
    const section = el.closest('section[id]');
    return `${name(el)} in ${section ? '#' + section.id : 'the page'}`;
  };
  const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';

  // The text a reader sees, outside code, math and scripts.
  const prose = [];
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n; (n = walker.nextNode());) {
    const el = n.parentElement;
    if (el.closest('pre, code, script, style, textarea, mjx-container') || !visible(el)) continue;
    prose.push([n.textContent, where(el)]);
  }
  const text = prose.map(p => p[0]).join(' ');
  const rawTable = prose.filter(([t]) => /\|\s*:?[-\u2013\u2014]+:?\s*\|/.test(t)).map(([t, w]) => `${w}: ${t.trim().slice(0, 80)}`);
  const rawEscapes = prose.filter(([t]) => /\\[_$%&#{}]/.test(t)).map(([t, w]) => `${w}: ${t.trim().slice(0, 80)}`);

  // Typeset math whose text parts print a backslash (e.g. \text{kv\_heads} shows "kv\_heads").
  const mathEscapes = [];
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.document && mj.startup.toMML) {
    for (const item of mj.startup.document.math) {
      const mml = mj.startup.toMML(item.root);
      if ([...mml.matchAll(/<mtext[^>]*>([^<]*)<\/mtext>/g)].some(m => m[1].includes('\\'))) mathEscapes.push(item.math);
    }
  }

  // Nothing wider than the text column unless a box around it scrolls; that box must fit and
  // show a cue that it scrolls. overflow:hidden boxes must not cut content off.
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const tooWide = [], clipped = [], noCue = [];
  for (const el of article.querySelectorAll('*')) {
    if (!visible(el) || el.closest('mjx-assistive-mml')) continue;
    const r = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    if (r.width > 0 && (r.right > col.right + 1 || r.left < col.left - 1)) {
      let a = el.parentElement;
      while (a && a !== article && !scrolls(a)) a = a.parentElement;
      if ((!a || a === article) && !el.parentElement.closest('[data-too-wide]')) {  // report the outermost only
        el.dataset.tooWide = '1';
        tooWide.push(`${where(el)}: ${Math.round(r.left - col.left)}..${Math.round(r.right - col.left)} px of a ${Math.round(col.width)} px column`);
      }
    }
    const overflow = el.scrollWidth - el.clientWidth;
    if (overflow > 1 && ['hidden', 'clip'].includes(style.overflowX) && style.position !== 'absolute'
        && style.textOverflow !== 'ellipsis')
      clipped.push(`${where(el)}: ${overflow} px cut off`);
    const code = el.closest('.cell_input') || (el.closest('div.highlight') && !el.closest('.cell_output'));
    if (overflow > 1 && scrolls(el) && !code && !/gradient/.test(style.backgroundImage))
      noCue.push(`${where(el)} scrolls by ${overflow} px`);
  }

  return {
    brokenImages: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
    widgetViews: views.length,
    unrenderedWidgets: unrendered,
    widgetState: document.querySelectorAll('script[type="application/vnd.jupyter.widget-state+json"]').length,
    mathSources: document.querySelectorAll('span.math, div.math').length,
    mathRendered: document.querySelectorAll('mjx-container').length,
    mathErrors: [...document.querySelectorAll('mjx-merror')].map(e => e.getAttribute('data-mjx-error') || e.textContent),
    mathEscapes, rawTable, rawEscapes, tooWide, clipped, noCue,
    stderr: [...article.querySelectorAll('.output.stderr, .output.traceback')].map(e => `${where(e)}: ${e.textContent.trim().slice(0, 120)}`),
    noise: [...(text + '\n' + [...article.querySelectorAll('.cell_output pre')].map(p => p.textContent).join('\n'))
            .matchAll(new RegExp(NOISE, 'gm'))].map(m => m[0]),
    scripts: [...document.scripts].map(s => s.src || s.textContent.slice(0, 200)),
    exercises: article.querySelectorAll('.exercise').length,
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    overflow: document.documentElement.scrollWidth - window.innerWidth,
  };
}"""


def _slug(page: str) -> str:
    return page.removesuffix(".html").replace("/", "__")


@contextlib.contextmanager
def open_page(browser, server: str, page: str, width: int, height: int = 900):
    """A fresh browser tab on `page` at `width` x `height`, loaded and settled (math typeset, widgets drawn,
    images in). Yields (tab, problems): problems collects failed or external requests and console
    errors while the tab is open; the caller asserts on it."""
    origin = urlsplit(server).netloc
    problems: list[str] = []
    context = browser.new_context(viewport={"width": width, "height": height}, service_workers="block")

    def guard(route):
        # Nothing may leave the machine: record and refuse anything not served by our server (Chromium
        # also sends it to a closed port: conftest.CHROMIUM_ARGS). Kept although the proxy alone guards: with
        # only the proxy, one CI run failed on a 404 for Chromium's own /favicon.ico request at index.html's
        # bare redirect, which no run with this routing has shown.
        if urlsplit(route.request.url).netloc != origin:
            problems.append(f"request left 127.0.0.1: {route.request.url}")
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
        yield pg, problems
    finally:
        context.close()


def shared_page(open_tabs: dict, browser, server: str, page: str, width: int, height: int = 900):
    """open_page's tab and its problems so far, kept open (in the `open_tabs` fixture) for the next test
    that only reads the same page at the same size: a chapter takes seconds to load, typeset and draw,
    and a page's tests run one after another on one worker (tests/conftest.py groups them by page).
    The last two stay open (a page's two widths). A test that clicks or types takes one (taken_page)."""
    key = (server, page, width, height)
    if key not in open_tabs:
        while len(open_tabs) >= 2:
            open_tabs.pop(next(iter(open_tabs)))[0].__exit__(None, None, None)
        manager = open_page(browser, server, page, width, height)
        tab, problems = manager.__enter__()
        open_tabs[key] = (manager, tab, problems)
    _, tab, problems = open_tabs[key]
    return tab, list(problems)


@contextlib.contextmanager
def taken_page(open_tabs: dict, browser, server: str, page: str, width: int, height: int = 900):
    """The shared tab of `page` at this size, taken for a test that clicks or types (and closed after it,
    so no later test reads what it changed), or a fresh one where none is open. Such tests run after
    the page's readers (`pytest.mark.takes_tab`, ordered in conftest), so the tab they take is loaded
    once for all of them. The problems are the tab's own list: recorded while it loaded and since."""
    key = (server, page, width, height)
    if key not in open_tabs:
        with open_page(browser, server, page, width, height) as opened:
            yield opened
        return
    manager, tab, problems = open_tabs.pop(key)
    try:
        yield tab, problems
    finally:
        manager.__exit__(None, None, None)


@pytest.mark.parametrize("width_name", list(SCREENS))
@pytest.mark.parametrize("page", site_pages() or ["<no site built>"])
def test_page(server, browser, open_tabs, page, width_name):
    width, height = SCREENS[width_name]
    origin = urlsplit(server).netloc
    pg, problems = shared_page(open_tabs, browser, server, page, width, height)
    info = pg.evaluate(INSPECT_JS.replace("NOISE", json.dumps(NOISE.pattern)))
    if os.environ.get("SITE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SHOTS / f"{_slug(page)}-{width}.png"), full_page=True)

    problems += [f"image did not load: {src}" for src in info["brokenImages"]]
    if info["widgetState"] and not info["widgetViews"]:
        problems.append("widget state is stored but no widget view is on the page")
    problems += [f"widget {m} did not render" for m in info["unrenderedWidgets"]]
    if info["mathSources"] and info["mathRendered"] < info["mathSources"]:
        problems.append(f"math not typeset: {info['mathRendered']} of {info['mathSources']} formulas")
    problems += [f"MathJax error: {e}" for e in info["mathErrors"]]
    problems += [f"math prints a backslash: {m}" for m in info["mathEscapes"]]
    problems += [f"raw Markdown table: {t}" for t in info["rawTable"]]
    problems += [f"literal escape in the text: {t}" for t in info["rawEscapes"]]
    problems += [f"wider than the column: {t}" for t in info["tooWide"][:10]]
    problems += [f"clipped: {t}" for t in info["clipped"][:10]]
    problems += [f"scrolls with no cue: {t}" for t in info["noCue"][:10]]
    problems += [f"stderr in an output: {t}" for t in info["stderr"]]
    problems += [f"noise in the text: {t!r}" for t in info["noise"]]
    problems += [f"script for Thebe (which is off) or from a CDN: {s[:100]}" for s in info["scripts"]
                 if re.search(r"THEBE|thebe|unpkg\.com|cdn\.", s)]
    has_checker = any(s.endswith("/exercises.js") or "/exercises.js?" in s for s in info["scripts"])
    if has_checker != bool(info["exercises"]):
        problems.append(f"exercise checker script loaded: {has_checker}, exercises on the page: {info['exercises']}")
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


# --- exercises: answerable on the page, with Jupyter's verdicts ----------------------------------

def exercise_pages() -> list[str]:
    return [p for p in site_pages() if 'class="exercise"' in (SITE / p).read_text()]


def sample_answers(check: dict) -> tuple[str, str]:
    """A right and a wrong answer for a check spec, as a reader would type them."""
    kind, expected = check["kind"], check["expected"]
    if kind == "number":
        return repr(expected), repr(expected + 10 * max(abs(expected), 1))
    if kind == "integer":
        return expected, str(int(expected) + 1)
    if kind == "choice":
        others = [o for o in check["options"] or [] if Check(check)(o).correct is False]
        return expected, others[0] if others else "not " + expected
    if kind == "sequence":
        return ", ".join(expected), ", ".join(expected + expected[-1:])
    if kind == "word_set":
        return ", ".join(expected), ", ".join(expected[:-1]) if len(expected) > 1 else "none of these"
    raise AssertionError(f"no sample answers for a {kind} check")


def jupyter_says(spec: dict, answer: str) -> str:
    """The feedback line the Jupyter widget shows for this answer (Exercise.feedback_html, as text)."""
    verdict = Exercise(title="-", prompt="-", check=Check(spec["check"]), hint=spec["hint"], solution="-")(answer)
    return f"{'✓' if verdict.correct else '✗'} {verdict.message}"


@pytest.mark.takes_tab
@pytest.mark.parametrize("page", exercise_pages() or ["<no exercises built>"])
def test_exercises_are_answerable(server, browser, open_tabs, page):
    with taken_page(open_tabs, browser, server, page, *SCREENS["desktop"]) as (pg, problems):
        # Code exercises have an editor, not an answer box: test_code_exercises_work_without_a_kernel.
        exercises = pg.locator("article .exercise:not(.code-exercise)")
        assert exercises.count(), f"{page}: no exercise rendered"
        for i in range(exercises.count()):
            ex = exercises.nth(i)
            title = ex.locator(".exercise-title").inner_text()
            if not ex.locator(".exercise-solution summary").is_visible():
                problems.append(f"{title}: no solution toggle")
            if ex.locator(".exercise-solution").get_attribute("open") is not None:
                problems.append(f"{title}: solution shown open")
            box = ex.locator(".exercise-answer")
            if not box.count():
                note = ex.locator(".exercise-needs-jupyter")
                if not (note.count() and note.is_visible()):
                    problems.append(f"{title}: no answer box and no note that checking needs Jupyter")
                continue
            spec = json.loads(box.get_attribute("data-check"))
            right, wrong = sample_answers(spec["check"])
            for answer, how in [(right, "click"), (wrong, "enter")]:
                box.locator("input").fill(answer)
                if how == "click":
                    box.locator("button").click()
                else:
                    box.locator("input").press("Enter")
                shown, want = box.locator("output").inner_text(), jupyter_says(spec, answer)
                if shown != want:
                    problems.append(f"{title}: {answer!r} shows {shown!r}, Jupyter says {want!r}")
            if not jupyter_says(spec, right).startswith("✓ Correct."):
                problems.append(f"{title}: the sample right answer {right!r} is not right")
            if f"Hint: {spec['hint']}" not in jupyter_says(spec, wrong):
                problems.append(f"{title}: a wrong answer gets no hint")
        for widget in pg.locator(".exercise-checker").all():
            if widget.is_visible():
                problems.append("the kernel's checker widget is visible: it cannot work without a kernel")
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


# --- code exercises: stub, hint and solution readable without a kernel ---------------------------

def code_exercise_pages() -> list[str]:
    return [p for p in site_pages() if 'class="exercise code-exercise"' in (SITE / p).read_text()]


def press_check(pg, grader, source: str, timeout_s: float = 120) -> tuple[bool, str]:
    """Type ``source`` into a browser grader's editor, press Check, wait for the verdict: (correct, message)."""
    grader.locator("textarea").fill(source)
    grader.locator("button").click()
    pg.wait_for_function("el => el.dataset.state === 'done'", arg=grader.element_handle(), timeout=timeout_s * 1000)
    output = grader.locator("output")
    return output.get_attribute("data-correct") == "true", output.text_content()


def graded_in_the_browser(pg, grader, title: str) -> list[str]:
    """The built page's grader accepts its exercise's solution and calls its stub not implemented, telling
    the reader to press Check again (every verdict against Python's: tests/test_code_exercises_browser.py).
    The page's Python starts on the first Check; the stub is put back after."""
    from inference_course.code_exercises import BROWSER_RERUN, NOT_IMPLEMENTED

    exercise = json.loads(grader.get_attribute("data-export"))["exercise"]
    stub_says = f"{NOT_IMPLEMENTED}: fill in {exercise['name']}() and {BROWSER_RERUN}."
    problems = []
    for source, start in ((exercise["solution"], "Correct: all"), (exercise["stub"], stub_says)):
        _, message = press_check(pg, grader, source)
        if not message.startswith(start):
            problems.append(f"{title}: Check gave {message!r}, not {start!r}...")
    return problems


@pytest.mark.takes_tab
@pytest.mark.parametrize("page", code_exercise_pages() or ["<no code exercises built>"])
def test_code_exercises_work_without_a_kernel(server, browser, open_tabs, page):
    """Each code exercise shows its stub in an editor with a Check button that grades in the browser
    (its solution accepted, its stub called not implemented), or folded beside its hint, with a note
    that says where it is graded (Jupyter, `make lab`); the notebook's own stub cell and its "write it
    in the cell below" are not on the page; its hint and its solution (the function's code) open on a
    click, at phone width. (One page of every browser-graded exercise, each verdict against Python's:
    tests/test_code_exercises_browser.py.)"""
    with taken_page(open_tabs, browser, server, page, *SCREENS["phone"]) as (pg, problems):
        exercises = pg.locator("article .code-exercise")
        assert exercises.count() >= 2, f"{page}: {exercises.count()} code exercises rendered"
        assert pg.locator("article .code-exercise-browser").count() >= 1, f"{page}: nothing graded in the browser"
        for i in range(exercises.count()):
            ex = exercises.nth(i)
            title = ex.locator(".exercise-title").inner_text()
            note = ex.locator(".exercise-needs-jupyter")
            grader = ex.locator(".code-exercise-browser")
            if grader.count():
                if not (grader.is_visible() and grader.locator("textarea").is_visible()
                        and grader.locator("button").inner_text() == "Check"):
                    problems.append(f"{title}: its browser grader is not shown")
                stub_text = grader.locator("textarea").input_value()
                problems += graded_in_the_browser(pg, grader, title)
            elif not (note.count() and note.is_visible() and "make lab" in note.inner_text()):
                problems.append(f"{title}: no visible note that it is graded in Jupyter (make lab)")
                stub_text = ""
            else:   # folded beside the hint
                toggle = ex.locator(".exercise-stub summary")
                if not (toggle.count() and toggle.is_visible()):
                    problems.append(f"{title}: no visible 'Stub' toggle")
                stub_text = ex.locator(".exercise-stub pre").text_content() if toggle.count() else ""
            if ex.locator(".exercise-jupyter-only").is_visible():
                problems.append(f"{title}: Jupyter's 'write it in the cell below' is shown")
            name = re.search(r"def (\w+)\(", stub_text)
            if not (name and "raise NotImplementedError" in stub_text):
                problems.append(f"{title}: no visible stub ({stub_text[:80]!r})")
                continue
            # The notebook's stub cell (the def and its .check() call) stays in the notebook.
            cell = ex.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' cell ')][1]"
                              "/following-sibling::div[contains(concat(' ', @class, ' '), ' cell ')][1]")
            if cell.count() and f"def {name.group(1)}(" in cell.inner_text():
                problems.append(f"{title}: the notebook's stub cell is on the page")
            for part, must_show in (("hint", None), ("solution", f"def {name.group(1)}(")):
                toggle = ex.locator(f".exercise-{part}")
                body = toggle.locator(":scope > :not(summary)").first
                if toggle.get_attribute("open") is not None or body.is_visible():
                    problems.append(f"{title}: the {part} is shown before it is asked for")
                toggle.locator("summary").click()
                if not (toggle.get_attribute("open") is not None and body.is_visible()):
                    problems.append(f"{title}: clicking 'Hint'/'Solution' does not open the {part}")
                elif must_show and must_show not in toggle.inner_text():
                    problems.append(f"{title}: the solution does not show {must_show}")
        for widget in pg.locator(".exercise-checker").all():
            if widget.is_visible():
                problems.append("the kernel's grader widget is visible: it cannot work without a kernel")
    assert not problems, f"{page}:\n  " + "\n  ".join(problems)


def test_a_request_that_leaves_the_machine_fails_and_is_recorded(server, browser):
    """The guard every page is opened with: Chromium reaches nothing past 127.0.0.1 (a server that does
    answer, on this machine's own network address, is not reached) and a page that tries is told of it."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the address a route would use
            address = s.getsockname()[0]
    except OSError:  # no route at all
        address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this machine has no network address other than loopback")
    with serve_folder(SITE, host=address) as root:
        outside = root + "index.html"
        with urllib.request.urlopen(outside) as r:
            assert r.status == 200  # it answers, from outside the browser
        with open_page(browser, server, "book/setup.html", *SCREENS["desktop"]) as (pg, problems):
            outcome = pg.evaluate(f"() => fetch('{outside}', {{mode: 'no-cors'}}).then(() => 'answered', e => 'failed')")
            assert outcome == "failed"
            assert f"request left 127.0.0.1: {outside}" in problems
            problems.clear()  # what this test planted is not the page's
